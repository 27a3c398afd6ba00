#include "scheduler/http/rpc.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "taskgrid/v1/board_service.pb.h"
#include "taskgrid/v1/cluster_service.pb.h"
#include "taskgrid/v1/job_service.pb.h"
#include "taskgrid/v1/schedule_service.pb.h"
#include "taskgrid/v1/task_service.pb.h"

namespace taskgrid::http {

namespace {

using engine::Engine;
using google::protobuf::Message;

// The entry for service/name, whose request is Req and response Resp;
// `fn(request, reply)` calls the Engine. The types are checked against
// the method's descriptor once, at startup.
template <typename Req, typename Resp, typename Fn>
RpcMethod Entry(const std::string& service, const std::string& name, Fn fn) {
  const std::string full = absl::StrCat("taskgrid.v1.", service);
  const google::protobuf::ServiceDescriptor* sd =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(full);
  const google::protobuf::MethodDescriptor* md =
      sd == nullptr ? nullptr : sd->FindMethodByName(name);
  if (md == nullptr || md->input_type() != Req::descriptor() ||
      md->output_type() != Resp::descriptor() || md->client_streaming() || md->server_streaming()) {
    spdlog::critical("HTTP API: {}.{} does not match its .proto", full, name);
    std::abort();
  }
  RpcMethod m;
  m.descriptor = md;
  m.grpc_path = absl::StrCat("/", full, "/", name);
  m.new_request = [] { return std::make_unique<Req>(); };
  m.call = [fn](const Message& req, RpcReply done) {
    fn(static_cast<const Req&>(req), [done = std::move(done)](absl::StatusOr<Resp> r) {
      if (!r.ok()) return done(r.status());
      done(std::unique_ptr<Message>(std::make_unique<Resp>(std::move(*r))));
    });
  };
  return m;
}

// A board call acting as the owner `owner_of(request)` names.
template <typename Req, typename Resp, typename Fn, typename Owner>
RpcMethod BoardEntry(const std::string& name, Fn fn, Owner owner_of) {
  RpcMethod m = Entry<Req, Resp>("BoardService", name, fn);
  m.owner = [owner_of](const Message& req) { return owner_of(static_cast<const Req&>(req)); };
  return m;
}

}  // namespace

const std::vector<std::string>& RpcServiceNames() {
  static const auto* const kNames = new std::vector<std::string>{
      "taskgrid.v1.TaskService", "taskgrid.v1.JobService", "taskgrid.v1.ScheduleService",
      "taskgrid.v1.ClusterService", "taskgrid.v1.BoardService"};
  return *kNames;
}

std::vector<RpcMethod> RpcMethods(Engine* e) {
  std::vector<RpcMethod> out;
  // TaskService.
  out.push_back(Entry<v1::SubmitTasksRequest, v1::SubmitTasksResponse>(
      "TaskService", "SubmitTasks", [e](const auto& r, auto done) { e->SubmitTasks(r, done); }));
  out.push_back(Entry<v1::GetTaskRequest, v1::Task>(
      "TaskService", "GetTask", [e](const auto& r, auto done) { e->GetTask(r, done); }));
  out.push_back(Entry<v1::ListTasksRequest, v1::ListTasksResponse>(
      "TaskService", "ListTasks", [e](const auto& r, auto done) { e->ListTasks(r, done); }));
  out.push_back(Entry<v1::CancelTaskRequest, v1::Task>(
      "TaskService", "CancelTask", [e](const auto& r, auto done) { e->CancelTask(r.id(), done); }));
  out.push_back(Entry<v1::RetryTaskRequest, v1::Task>(
      "TaskService", "RetryTask", [e](const auto& r, auto done) { e->RetryTask(r.id(), done); }));
  out.push_back(Entry<v1::ResetTaskRequest, v1::Task>(
      "TaskService", "ResetTask", [e](const auto& r, auto done) { e->ResetTask(r.id(), done); }));
  out.push_back(Entry<v1::PauseTaskRequest, v1::Task>(
      "TaskService", "PauseTask", [e](const auto& r, auto done) { e->PauseTask(r.id(), done); }));
  out.push_back(Entry<v1::ResumeTaskRequest, v1::Task>(
      "TaskService", "ResumeTask", [e](const auto& r, auto done) { e->ResumeTask(r.id(), done); }));
  out.push_back(Entry<v1::GetQueueStatsRequest, v1::GetQueueStatsResponse>(
      "TaskService", "GetQueueStats",
      [e](const auto& r, auto done) { e->GetQueueStats(r, done); }));
  out.push_back(Entry<v1::DeleteByMergeKeyRequest, v1::Task>(
      "TaskService", "DeleteByMergeKey",
      [e](const auto& r, auto done) { e->DeleteByMergeKey(r, done); }));
  out.push_back(Entry<v1::PauseQueueRequest, v1::QueueStats>(
      "TaskService", "PauseQueue",
      [e](const auto& r, auto done) { e->PauseQueue(r.queue(), /*paused=*/true, done); }));
  out.push_back(Entry<v1::ResumeQueueRequest, v1::QueueStats>(
      "TaskService", "ResumeQueue",
      [e](const auto& r, auto done) { e->PauseQueue(r.queue(), /*paused=*/false, done); }));
  out.push_back(Entry<v1::SetQueueLimitsRequest, v1::QueueStats>(
      "TaskService", "SetQueueLimits",
      [e](const auto& r, auto done) { e->SetQueueLimits(r, done); }));
  out.push_back(Entry<v1::SetQueueWeightRequest, v1::QueueStats>(
      "TaskService", "SetQueueWeight",
      [e](const auto& r, auto done) { e->SetQueueWeight(r, done); }));
  out.push_back(Entry<v1::BulkTasksRequest, v1::BulkTasksResponse>(
      "TaskService", "CancelTasks", [e](const auto& r, auto done) { e->CancelTasks(r, done); }));
  out.push_back(Entry<v1::BulkTasksRequest, v1::BulkTasksResponse>(
      "TaskService", "RetryTasks", [e](const auto& r, auto done) { e->RetryTasks(r, done); }));
  out.push_back(Entry<v1::DeleteTaskRequest, v1::DeleteTaskResponse>(
      "TaskService", "DeleteTask", [e](const auto& r, auto done) { e->DeleteTask(r.id(), done); }));
  out.push_back(Entry<v1::BulkTasksRequest, v1::BulkTasksResponse>(
      "TaskService", "DeleteTasks", [e](const auto& r, auto done) { e->DeleteTasks(r, done); }));
  out.push_back(Entry<v1::SetQueueRetentionRequest, v1::QueueStats>(
      "TaskService", "SetQueueRetention",
      [e](const auto& r, auto done) { e->SetQueueRetention(r, done); }));

  // JobService.
  out.push_back(Entry<v1::SubmitJobRequest, v1::Job>(
      "JobService", "SubmitJob", [e](const auto& r, auto done) { e->SubmitJob(r, done); }));
  out.push_back(Entry<v1::GetJobRequest, v1::Job>(
      "JobService", "GetJob", [e](const auto& r, auto done) { e->GetJob(r.id(), done); }));
  out.push_back(Entry<v1::ListJobsRequest, v1::ListJobsResponse>(
      "JobService", "ListJobs", [e](const auto& r, auto done) { e->ListJobs(r, done); }));
  out.push_back(Entry<v1::CancelJobRequest, v1::Job>(
      "JobService", "CancelJob", [e](const auto& r, auto done) { e->CancelJob(r.id(), done); }));
  out.push_back(Entry<v1::RetryJobRequest, v1::Job>(
      "JobService", "RetryJob", [e](const auto& r, auto done) { e->RetryJob(r.id(), done); }));
  out.push_back(Entry<v1::DeleteJobRequest, v1::DeleteJobResponse>(
      "JobService", "DeleteJob", [e](const auto& r, auto done) { e->DeleteJob(r.id(), done); }));

  // ScheduleService.
  out.push_back(Entry<v1::CreateScheduleRequest, v1::Schedule>(
      "ScheduleService", "CreateSchedule",
      [e](const auto& r, auto done) { e->CreateSchedule(r, done); }));
  out.push_back(Entry<v1::GetScheduleRequest, v1::Schedule>(
      "ScheduleService", "GetSchedule",
      [e](const auto& r, auto done) { e->GetSchedule(r.id(), done); }));
  out.push_back(Entry<v1::ListSchedulesRequest, v1::ListSchedulesResponse>(
      "ScheduleService", "ListSchedules",
      [e](const auto& r, auto done) { e->ListSchedules(r, done); }));
  out.push_back(Entry<v1::PauseScheduleRequest, v1::Schedule>(
      "ScheduleService", "PauseSchedule",
      [e](const auto& r, auto done) { e->PauseSchedule(r.id(), done); }));
  out.push_back(Entry<v1::ResumeScheduleRequest, v1::Schedule>(
      "ScheduleService", "ResumeSchedule",
      [e](const auto& r, auto done) { e->ResumeSchedule(r.id(), done); }));
  out.push_back(Entry<v1::DeleteScheduleRequest, v1::Schedule>(
      "ScheduleService", "DeleteSchedule",
      [e](const auto& r, auto done) { e->DeleteSchedule(r.id(), done); }));

  // ClusterService.
  out.push_back(Entry<v1::ListAgentsRequest, v1::ListAgentsResponse>(
      "ClusterService", "ListAgents", [e](const auto&, auto done) { e->ListAgents(done); }));
  out.push_back(Entry<v1::DrainAgentRequest, v1::Agent>(
      "ClusterService", "DrainAgent",
      [e](const auto& r, auto done) { e->DrainAgent(r.id(), done); }));
  out.push_back(Entry<v1::UndrainAgentRequest, v1::Agent>(
      "ClusterService", "UndrainAgent",
      [e](const auto& r, auto done) { e->UndrainAgent(r.id(), done); }));
  out.push_back(Entry<v1::GetClusterStatsRequest, v1::ClusterStats>(
      "ClusterService", "GetClusterStats",
      [e](const auto&, auto done) { e->GetClusterStats(done); }));

  // BoardService: the claim calls act as the owner they name.
  out.push_back(BoardEntry<v1::ClaimRequest, v1::ClaimResponse>(
      "Claim", [e](const auto& r, auto done) { e->Claim(r, done); },
      [](const v1::ClaimRequest& r) { return r.owner(); }));
  out.push_back(BoardEntry<v1::ExtendClaimRequest, v1::ExtendClaimResponse>(
      "ExtendClaim", [e](const auto& r, auto done) { e->ExtendClaim(r, done); },
      [](const v1::ExtendClaimRequest& r) { return r.claim().owner(); }));
  out.push_back(BoardEntry<v1::CompleteClaimRequest, v1::CompleteClaimResponse>(
      "CompleteClaim", [e](const auto& r, auto done) { e->CompleteClaim(r, done); },
      [](const v1::CompleteClaimRequest& r) { return r.claim().owner(); }));
  out.push_back(BoardEntry<v1::AbandonClaimRequest, v1::AbandonClaimResponse>(
      "AbandonClaim", [e](const auto& r, auto done) { e->AbandonClaim(r, done); },
      [](const v1::AbandonClaimRequest& r) { return r.claim().owner(); }));
  out.push_back(BoardEntry<v1::TrashClaimRequest, v1::TrashClaimResponse>(
      "TrashClaim", [e](const auto& r, auto done) { e->TrashClaim(r, done); },
      [](const v1::TrashClaimRequest& r) { return r.claim().owner(); }));
  out.push_back(Entry<v1::RestoreTaskRequest, v1::RestoreTaskResponse>(
      "BoardService", "RestoreTask", [e](const auto& r, auto done) {
        e->RestoreTask(r.id(), [done](absl::StatusOr<v1::Task> t) {
          if (!t.ok()) return done(t.status());
          v1::RestoreTaskResponse resp;
          *resp.mutable_task() = std::move(*t);
          done(std::move(resp));
        });
      }));
  return out;
}

}  // namespace taskgrid::http
