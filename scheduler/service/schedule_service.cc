#include "scheduler/service/schedule_service.h"

#include "scheduler/service/unary.h"

namespace taskgrid::service {

grpc::ServerUnaryReactor* ScheduleServiceImpl::CreateSchedule(grpc::CallbackServerContext* ctx,
                                                              const v1::CreateScheduleRequest* req,
                                                              v1::Schedule* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->CreateSchedule(*req, std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* ScheduleServiceImpl::GetSchedule(grpc::CallbackServerContext* ctx,
                                                           const v1::GetScheduleRequest* req,
                                                           v1::Schedule* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->GetSchedule(req->id(), std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* ScheduleServiceImpl::ListSchedules(grpc::CallbackServerContext* ctx,
                                                             const v1::ListSchedulesRequest* req,
                                                             v1::ListSchedulesResponse* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->ListSchedules(*req, std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* ScheduleServiceImpl::PauseSchedule(grpc::CallbackServerContext* ctx,
                                                             const v1::PauseScheduleRequest* req,
                                                             v1::Schedule* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->PauseSchedule(req->id(), std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* ScheduleServiceImpl::ResumeSchedule(grpc::CallbackServerContext* ctx,
                                                              const v1::ResumeScheduleRequest* req,
                                                              v1::Schedule* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->ResumeSchedule(req->id(), std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* ScheduleServiceImpl::DeleteSchedule(grpc::CallbackServerContext* ctx,
                                                              const v1::DeleteScheduleRequest* req,
                                                              v1::Schedule* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->DeleteSchedule(req->id(), std::move(reply));
  return reactor;
}

}  // namespace taskgrid::service
