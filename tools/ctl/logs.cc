// taskgridctl logs: a task's output, as its attempts write it
// (TaskService.StreamTaskOutput), printed by LogPrinter or as JSON lines.

#include <grpcpp/grpcpp.h>

#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tools/ctl/client.h"
#include "tools/ctl/log_printer.h"
#include "tools/ctl/lost_scheduler.h"
#include "tools/ctl/output.h"

namespace taskgrid::ctl {

int Client::Logs(const v1::StreamTaskOutputRequest& req, absl::Duration wait_timeout) {
  // Without --follow the scheduler answers with what there is now: one
  // call's --timeout. A follow lasts until the task is finished, or
  // --wait_timeout, across a scheduler lost and back (for up to --timeout).
  const absl::Duration limit = req.follow() ? wait_timeout : opts_.timeout;
  const absl::Time deadline =
      limit == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + limit;
  // Offsets per attempt and stream: what a reconnect sends again (the
  // agent's newest output) is printed once.
  LogPrinter printer(std::cout, std::cerr, req.id(), req.follow());
  LostScheduler lost(opts_.timeout);
  bool answered = false;  // a scheduler never reached is reported at once
  for (;;) {
    grpc::ClientContext ctx;
    if (deadline != absl::InfiniteFuture()) ctx.set_deadline(absl::ToChronoTime(deadline));
    std::unique_ptr<grpc::ClientReader<v1::StreamTaskOutputResponse>> reader =
        stub_->StreamTaskOutput(&ctx, req);
    v1::StreamTaskOutputResponse r;
    bool ended = false;
    v1::TaskState final_state = v1::TASK_STATE_UNSPECIFIED;
    while (reader->Read(&r)) {
      answered = true;
      lost.Answered();
      Reached();
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
    if (ended || s.ok()) {
      if (!req.follow() || !ended) return kExitOk;
      return final_state == v1::TASK_STATE_SUCCEEDED ? kExitOk : kExitTaskFailed;
    }
    if (req.follow() && s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      std::cerr << "--- " << req.id()
                << " not finished within --wait_timeout=" << absl::FormatDuration(wait_timeout)
                << " ---\n";
      return kExitWaitTimedOut;
    }
    if (NextScheduler(ctx, s)) continue;
    if (req.follow() && answered && lost.TryAgain(s, deadline, [&] {
          printer.Note(
              absl::StrCat("the scheduler went away (", s.error_message(), "); following again"));
        })) {
      continue;
    }
    Report(s);
    return kExitRpcFailed;
  }
}

}  // namespace taskgrid::ctl
