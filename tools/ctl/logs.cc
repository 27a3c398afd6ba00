// taskgridctl logs: a task's output, as its attempts write it
// (TaskService.StreamTaskOutput), printed by LogPrinter or as JSON lines.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tools/ctl/client.h"
#include "tools/ctl/log_printer.h"
#include "tools/ctl/output.h"

namespace taskgrid::ctl {

namespace {

// A follow whose scheduler went away (UNAVAILABLE: killed, restarting, the
// network) follows again, for as long as this passes without one call that
// reached it.
constexpr absl::Duration kReconnectFor = absl::Seconds(60);

int TimedOut(const std::string& id, absl::Duration wait_timeout) {
  std::cerr << "--- " << id
            << " not finished within --wait_timeout=" << absl::FormatDuration(wait_timeout)
            << " ---\n";
  return kExitWaitTimedOut;
}

}  // namespace

int Client::Logs(const v1::StreamTaskOutputRequest& req, absl::Duration wait_timeout) {
  // Without --follow the scheduler answers with what there is now: one
  // call's --timeout. A follow lasts until the task is finished, or
  // --wait_timeout, across reconnects.
  const absl::Duration limit = req.follow() ? wait_timeout : opts_.timeout;
  const absl::Time deadline =
      limit == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + limit;
  // Offsets per attempt and stream: what a reconnect sends again (the
  // agent's newest output) is printed once.
  LogPrinter printer(std::cout, std::cerr, req.id(), req.follow());
  absl::Time reached = absl::Now();  // when a call last got a message
  absl::Duration pause = absl::Milliseconds(200);
  for (bool again = false;; again = true) {
    if (again) {
      // A reconnect waits for the scheduler to be back, for as long as the
      // follow may still go on.
      const absl::Time until = std::min(deadline, reached + kReconnectFor);
      if (!channel_->WaitForConnected(absl::ToChronoTime(until))) {
        if (until == deadline) return TimedOut(req.id(), wait_timeout);
        std::cerr << "error: UNAVAILABLE: the scheduler at " << opts_.addr
                  << " was not back within " << absl::FormatDuration(kReconnectFor) << "\n";
        return kExitRpcFailed;
      }
    }
    grpc::ClientContext ctx;
    if (deadline != absl::InfiniteFuture()) ctx.set_deadline(absl::ToChronoTime(deadline));
    std::unique_ptr<grpc::ClientReader<v1::StreamTaskOutputResponse>> reader =
        stub_->StreamTaskOutput(&ctx, req);
    v1::StreamTaskOutputResponse r;
    bool got = false;
    bool ended = false;
    v1::TaskState final_state = v1::TASK_STATE_UNSPECIFIED;
    while (reader->Read(&r)) {
      got = true;
      if (r.kind() == v1::StreamTaskOutputResponse::KIND_END) {
        ended = true;
        final_state = r.state();
      }
      if (opts_.json) {
        std::cout << ToJsonLine(r) << std::flush;
      } else {
        printer.Print(r);
      }
      if (!std::cout) {  // nobody reads our stdout any more
        ctx.TryCancel();
        break;
      }
    }
    const grpc::Status s = reader->Finish();
    if (!std::cout) return kExitOk;
    if (got) reached = absl::Now();
    if (ended || s.ok()) {
      if (!req.follow() || !ended) return kExitOk;
      return final_state == v1::TASK_STATE_SUCCEEDED ? kExitOk : kExitTaskFailed;
    }
    if (req.follow() && s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return TimedOut(req.id(), wait_timeout);
    }
    if (!req.follow() || s.error_code() != grpc::StatusCode::UNAVAILABLE ||
        absl::Now() - reached > kReconnectFor) {
      Report(s);
      return kExitRpcFailed;
    }
    printer.Note(
        absl::StrCat("the scheduler went away (", s.error_message(), "); following again"));
    // A scheduler that answers UNAVAILABLE at once (stopping) is not asked
    // in a tight loop.
    absl::SleepFor(got ? absl::Milliseconds(200) : pause);
    pause = got ? absl::Milliseconds(200) : std::min(pause * 2, absl::Seconds(2));
  }
}

}  // namespace taskgrid::ctl
