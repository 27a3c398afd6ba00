// Fuzz target: whatever SubmitJobRequest arrives (a job when job_id is set,
// plain tasks otherwise), the scheduler either refuses it and stores
// nothing, or takes it with every invariant intact; then the tasks can be
// described, ticked through time, cancelled and reset without breaking one.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "taskgrid/v1/job_service.pb.h"
#include "tests/fuzz/fuzz_check.h"

namespace taskgrid::fuzz {

const google::protobuf::Message* InputPrototype() {
  static const v1::SubmitJobRequest kPrototype;
  return &kPrototype;
}

namespace {

void Run(const v1::SubmitJobRequest& req) {
  FakeClock clock;
  core::Scheduler s(&clock, core::SchedulerOptions{});
  std::vector<v1::TaskSpec> specs(req.tasks().begin(), req.tasks().end());
  absl::Status st =
      req.job_id().empty() ? s.Submit(specs).status() : s.SubmitJob(req.job_id(), specs).status();
  if (!st.ok()) {
    if (st.message().empty()) Die("a refusal without a message");
    if (s.task_count() != 0 || !s.TakeEffects().batch.empty()) {
      Die("a refused submit stored something");
    }
    return;
  }
  CheckOrDie(s, "after submit");
  if (s.task_count() < static_cast<size_t>(specs.size())) Die("an accepted task is missing");

  // The same request again: identical specs come back as they are; tasks
  // without an id are new ones. Either way nothing may break.
  if (req.job_id().empty()) {
    (void)s.Submit(specs);
  } else {
    (void)s.SubmitJob(req.job_id(), specs);
  }
  CheckOrDie(s, "after a resubmit");

  core::ListFilter filter;
  filter.page_size = 1000;
  std::vector<std::string> ids;
  for (const core::TaskRecord* t : s.List(filter).tasks) {
    v1::Task out;
    s.Describe(*t, &out);
    std::string bytes;
    if (!out.SerializeToString(&bytes)) Die("a described task does not serialize");
    ids.push_back(t->spec.id());
  }
  (void)s.Stats("");
  (void)s.TakeEffects();

  // Time passes (backoffs, not_before, schedule timeouts) with no agent.
  for (int i = 0; i < 3; ++i) {
    clock.Advance(absl::Hours(1));
    s.Tick();
    CheckOrDie(s, "after a tick");
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    switch (i % 4) {
      case 0:
        (void)s.Cancel(ids[i]);
        break;
      case 1:
        (void)s.Pause(ids[i]);
        break;
      case 2:
        (void)s.Reset(ids[i]);
        break;
      default:
        (void)s.Retry(ids[i]);
        break;
    }
    CheckOrDie(s, "after a task operation");
  }
  (void)s.TakeEffects();
}

}  // namespace
}  // namespace taskgrid::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  taskgrid::v1::SubmitJobRequest req;
  if (size > (1 << 20) || !req.ParseFromArray(data, static_cast<int>(size))) return -1;
  taskgrid::fuzz::Run(req);
  return 0;
}
