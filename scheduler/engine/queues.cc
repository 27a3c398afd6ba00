// The Engine's side of the queue controls (pause, limits), bulk cancel and
// retry by filter: each runs on the Scheduler under the
// Engine's mutex and is answered after its rows are committed. Pull
// workers waiting on a controlled queue are looked at on every tick, so
// they hear as soon as it may start a task again (resumed, room under its
// concurrency limit, a rate token).

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "scheduler/engine/engine.h"

namespace taskgrid::engine {

namespace {

constexpr int32_t kDefaultBulkLimit = 1'000;
constexpr int32_t kMaxBulkLimit = 10'000;

absl::Status BulkFilter(const v1::BulkTasksRequest& req, core::ListFilter* filter) {
  if (req.limit() < 0 || req.limit() > kMaxBulkLimit) {
    return absl::InvalidArgumentError(absl::StrCat("limit: ", req.limit(), " is out of range 1-",
                                                   kMaxBulkLimit, " (0: ", kDefaultBulkLimit, ")"));
  }
  filter->page_size = req.limit() == 0 ? kDefaultBulkLimit : req.limit();
  if (!req.page_token().empty() &&
      (!absl::SimpleAtoi(req.page_token(), &filter->after_seq) || filter->after_seq <= 0)) {
    return absl::InvalidArgumentError("page_token is malformed: pass a next_page_token as is");
  }
  filter->queue = req.queue();
  filter->job_id = req.job_id();
  for (int i = 0; i < req.states_size(); ++i) {
    const int s = req.states(i);
    if (s <= v1::TASK_STATE_UNSPECIFIED || !v1::TaskState_IsValid(s)) {
      return absl::InvalidArgumentError(absl::StrCat("states[", i, "] is an unknown state ", s));
    }
    filter->states.push_back(static_cast<v1::TaskState>(s));
  }
  return absl::OkStatus();
}

v1::BulkTasksResponse ToResponse(core::BulkResult r) {
  v1::BulkTasksResponse resp;
  for (std::string& id : r.ids) resp.add_ids(std::move(id));
  if (r.next_after_seq > 0) resp.set_next_page_token(absl::StrCat(r.next_after_seq));
  resp.set_skipped(r.skipped);
  resp.set_skipped_reason(std::move(r.skipped_reason));
  return resp;
}

}  // namespace

void Engine::PauseQueue(const std::string& queue, bool paused, Reply<v1::QueueStats> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  Answer(sched_.PauseQueue(queue, paused), std::move(done));
  WakeQueueLocked(queue);  // resumed: back to the defaults, no longer looked at each tick
}

void Engine::SetQueueLimits(const v1::SetQueueLimitsRequest& req, Reply<v1::QueueStats> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  Answer(sched_.SetQueueLimits(req), std::move(done));
  WakeQueueLocked(req.queue());
}

void Engine::SetQueueWeight(const v1::SetQueueWeightRequest& req, Reply<v1::QueueStats> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  Answer(sched_.SetQueueWeight(req), std::move(done));
  WakeQueueLocked(req.queue());
}

void Engine::BulkOp(absl::StatusOr<core::BulkResult> (core::Scheduler::*op)(core::ListFilter),
                    const v1::BulkTasksRequest& req, Reply<v1::BulkTasksResponse> done) {
  core::ListFilter filter;
  const absl::Status bad = BulkFilter(req, &filter);
  // A retry changes finished tasks: those on disk are read back first.
  auto needs = [&] {
    return bad.ok() && op == &core::Scheduler::RetryTasks ? sched_.ColdSeqsOfBulkRetry(filter)
                                                          : std::vector<int64_t>();
  };
  WithWarm(needs, [&] {
    if (stopped_) return done(Stopped());
    absl::StatusOr<v1::BulkTasksResponse> result;
    if (!bad.ok()) {
      result = bad;
    } else if (absl::StatusOr<core::BulkResult> r = (sched_.*op)(filter); !r.ok()) {
      result = r.status();
    } else {
      result = ToResponse(std::move(*r));
    }
    Answer(std::move(result), std::move(done));
  });
}

void Engine::CancelTasks(const v1::BulkTasksRequest& req, Reply<v1::BulkTasksResponse> done) {
  BulkOp(&core::Scheduler::CancelTasks, req, std::move(done));
}

void Engine::RetryTasks(const v1::BulkTasksRequest& req, Reply<v1::BulkTasksResponse> done) {
  BulkOp(&core::Scheduler::RetryTasks, req, std::move(done));
}

void Engine::WakeControlledLocked() {
  if (work_waiters_.size() == 0) return;
  for (const std::string& queue : sched_.ControlledQueues()) WakeQueueLocked(queue);
}

void Engine::WakeQueueLocked(const std::string& queue) {
  if (!work_waiters_.HasKey(queue)) return;
  auto can_claim = [&](const WorkWaiters::Waiter& w) {
    return sched_.ClaimableCount(w.key, w.extra) > 0;
  };
  for (WorkWaiters::Waiter& w : work_waiters_.TakeKeyIf(queue, can_claim)) {
    v1::WaitForWorkResponse resp;
    resp.set_ready(sched_.ClaimableCount(w.key, w.extra));
    Answer(absl::StatusOr<v1::WaitForWorkResponse>(std::move(resp)), std::move(w.done));
  }
}

}  // namespace taskgrid::engine
