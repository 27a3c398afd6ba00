// ScheduleService over the callback API: thin handlers over the Engine.
// Thread-safe; the Engine is borrowed.
#pragma once

#include "scheduler/engine/engine.h"
#include "taskgrid/v1/schedule_service.grpc.pb.h"

namespace taskgrid::service {

class ScheduleServiceImpl final : public v1::ScheduleService::CallbackService {
 public:
  explicit ScheduleServiceImpl(engine::Engine* engine) : engine_(engine) {}

  grpc::ServerUnaryReactor* CreateSchedule(grpc::CallbackServerContext* ctx,
                                           const v1::CreateScheduleRequest* req,
                                           v1::Schedule* resp) override;
  grpc::ServerUnaryReactor* GetSchedule(grpc::CallbackServerContext* ctx,
                                        const v1::GetScheduleRequest* req,
                                        v1::Schedule* resp) override;
  grpc::ServerUnaryReactor* ListSchedules(grpc::CallbackServerContext* ctx,
                                          const v1::ListSchedulesRequest* req,
                                          v1::ListSchedulesResponse* resp) override;
  grpc::ServerUnaryReactor* PauseSchedule(grpc::CallbackServerContext* ctx,
                                          const v1::PauseScheduleRequest* req,
                                          v1::Schedule* resp) override;
  grpc::ServerUnaryReactor* ResumeSchedule(grpc::CallbackServerContext* ctx,
                                           const v1::ResumeScheduleRequest* req,
                                           v1::Schedule* resp) override;
  grpc::ServerUnaryReactor* DeleteSchedule(grpc::CallbackServerContext* ctx,
                                           const v1::DeleteScheduleRequest* req,
                                           v1::Schedule* resp) override;

 private:
  engine::Engine* const engine_;
};

}  // namespace taskgrid::service
