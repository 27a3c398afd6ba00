// taskgridctl schedule ...: the ScheduleService calls (periodic tasks).

#include <iostream>

#include "tools/ctl/client.h"
#include "tools/ctl/output.h"

namespace taskgrid::ctl {

int Client::CreateSchedule(const v1::CreateScheduleRequest& req) {
  v1::Schedule s;
  if (!Call(
          [&](grpc::ClientContext* ctx) { return schedule_stub_->CreateSchedule(ctx, req, &s); })) {
    return kExitRpcFailed;
  }
  std::cout << (opts_.json ? ToJson(s) : FormatScheduleSummary(s) + "\n");
  return kExitOk;
}

int Client::GetSchedule(const std::string& id) {
  v1::GetScheduleRequest req;
  req.set_id(id);
  v1::Schedule s;
  if (!Call([&](grpc::ClientContext* ctx) { return schedule_stub_->GetSchedule(ctx, req, &s); })) {
    return kExitRpcFailed;
  }
  std::cout << (opts_.json ? ToJson(s) : FormatScheduleDetail(s));
  return kExitOk;
}

int Client::ListSchedules(v1::ListSchedulesRequest req, bool all) {
  v1::ListSchedulesResponse merged;
  auto rpc = [this](grpc::ClientContext* ctx, const v1::ListSchedulesRequest& r,
                    v1::ListSchedulesResponse* page) {
    return schedule_stub_->ListSchedules(ctx, r, page);
  };
  auto items = [](v1::ListSchedulesResponse* r) { return r->mutable_schedules(); };
  if (!FetchPages(std::move(req), all, rpc, items, &merged)) return kExitRpcFailed;
  if (opts_.json) {
    std::cout << ToJson(merged);
  } else {
    std::cout << FormatScheduleList({merged.schedules().begin(), merged.schedules().end()});
  }
  PrintMore(merged.next_page_token());
  return kExitOk;
}

int Client::ActOnSchedule(ScheduleAction action, const std::string& id) {
  v1::Schedule s;
  const bool ok = Call([&](grpc::ClientContext* ctx) {
    switch (action) {
      case ScheduleAction::kPause: {
        v1::PauseScheduleRequest req;
        req.set_id(id);
        return schedule_stub_->PauseSchedule(ctx, req, &s);
      }
      case ScheduleAction::kResume: {
        v1::ResumeScheduleRequest req;
        req.set_id(id);
        return schedule_stub_->ResumeSchedule(ctx, req, &s);
      }
      case ScheduleAction::kDelete:
        break;
    }
    v1::DeleteScheduleRequest req;
    req.set_id(id);
    return schedule_stub_->DeleteSchedule(ctx, req, &s);
  });
  if (!ok) return kExitRpcFailed;
  if (opts_.json) {
    std::cout << ToJson(s);
  } else if (action == ScheduleAction::kDelete) {
    std::cout << s.id() << " deleted (" << s.fire_count()
              << (s.fire_count() == 1 ? " fire" : " fires") << "; its tasks stay)\n";
  } else {
    std::cout << FormatScheduleSummary(s) << "\n";
  }
  return kExitOk;
}

}  // namespace taskgrid::ctl
