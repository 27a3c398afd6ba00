// taskgridctl logs: a task's output, as its attempts write it
// (TaskService.StreamTaskOutput), printed by LogPrinter or as JSON lines.

#include <grpcpp/grpcpp.h>

#include <iostream>
#include <memory>

#include "tools/ctl/client.h"
#include "tools/ctl/log_printer.h"
#include "tools/ctl/output.h"

namespace taskgrid::ctl {

int Client::Logs(const v1::StreamTaskOutputRequest& req, absl::Duration wait_timeout) {
  grpc::ClientContext ctx;
  // Without --follow the scheduler answers with what there is now: one
  // call's --timeout. A follow lasts until the task is finished, or
  // --wait_timeout.
  const absl::Duration limit = req.follow() ? wait_timeout : opts_.timeout;
  if (limit != absl::InfiniteDuration()) ctx.set_deadline(absl::ToChronoTime(absl::Now() + limit));
  std::unique_ptr<grpc::ClientReader<v1::StreamTaskOutputResponse>> reader =
      stub_->StreamTaskOutput(&ctx, req);
  LogPrinter printer(std::cout, std::cerr, req.id(), req.follow());
  v1::StreamTaskOutputResponse r;
  bool ended = false;
  v1::TaskState final_state = v1::TASK_STATE_UNSPECIFIED;
  while (reader->Read(&r)) {
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
  if (!s.ok()) {
    if (req.follow() && s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      std::cerr << "--- " << req.id()
                << " not finished within --wait_timeout=" << absl::FormatDuration(wait_timeout)
                << " ---\n";
      return kExitWaitTimedOut;
    }
    Report(s);
    return kExitRpcFailed;
  }
  if (!req.follow() || !ended) return kExitOk;
  return final_state == v1::TASK_STATE_SUCCEEDED ? kExitOk : kExitTaskFailed;
}

}  // namespace taskgrid::ctl
