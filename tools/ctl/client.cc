#include "tools/ctl/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/connect.h"
#include "common/connect_probe.h"
#include "common/grpc_status.h"
#include "common/message_limits.h"
#include "common/proto_time.h"
#include "scheduler/core/state_machine.h"
#include "tools/ctl/job_tree.h"
#include "tools/ctl/output.h"

namespace taskgrid::ctl {

Client::Client(ClientOptions opts)
    : opts_(std::move(opts)), addresses_(SchedulerAddresses::ParseChecked(opts_.addr, "--addr")) {
  UseCurrent();
}

void Client::UseCurrent() {
  Endpoint& e = endpoints_[addresses_.current()];
  if (e.channel == nullptr) {
    // gRPC's reconnect backoff grows to 2 minutes; a client that waits or
    // follows a watch across a scheduler restart wants to be back in a
    // second. (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: it is also the
    // connect timeout.)
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // A scheduler that stops answering (frozen, or cut off with the
    // connection open) ends the long waits and watches within 20 s, so
    // they go on with the next scheduler: a ping after 15 s without
    // anything read (the scheduler accepts one every 10 s), 5 s for its
    // answer.
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 15'000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    args.SetMaxReceiveMessageSize(kMaxReplyBytes);
    std::shared_ptr<grpc::ChannelCredentials> creds =
        opts_.credentials != nullptr ? opts_.credentials : grpc::InsecureChannelCredentials();
    e.channel = grpc::CreateCustomChannel(addresses_.current(), creds, args);
    e.tasks = v1::TaskService::NewStub(e.channel);
    e.cluster = v1::ClusterService::NewStub(e.channel);
    e.jobs = v1::JobService::NewStub(e.channel);
    e.board = v1::BoardService::NewStub(e.channel);
    e.schedules = v1::ScheduleService::NewStub(e.channel);
  }
  channel_ = e.channel;
  stub_ = e.tasks.get();
  cluster_stub_ = e.cluster.get();
  job_stub_ = e.jobs.get();
  board_stub_ = e.board.get();
  schedule_stub_ = e.schedules.get();
}

grpc::Status Client::Reach() {
  if (addresses_.size() < 2) return grpc::Status::OK;
  const absl::Duration bound = std::min(opts_.timeout, absl::Seconds(2));
  if (ConnectsWithin(channel_.get(), bound)) return grpc::Status::OK;
  return grpc::Status(
      grpc::StatusCode::UNAVAILABLE,
      absl::StrCat("cannot connect to ", addresses_.current(), " (refused, or no answer within ",
                   absl::FormatDuration(bound), ")"));
}

void Client::NoteFailover(const grpc::Status& s) const {
  std::cerr << "note: no scheduler of " << addresses_.text() << " leads at the moment ("
            << s.error_message()
            << "); trying again for up to --timeout=" << absl::FormatDuration(opts_.timeout)
            << "\n";
}

bool Client::NextScheduler(const grpc::ClientContext& ctx, const grpc::Status& s) {
  if (!IsLostScheduler(s)) return false;
  const std::string leader = LeaderNamedBy(ctx);
  if (addresses_.size() < 2 && leader.empty()) return false;
  addresses_.Failed(leader);
  UseCurrent();
  return ++follows_ <= addresses_.size() + 1;
}

void Client::Report(const grpc::Status& gs) const {
  const absl::Status s = FromGrpcStatus(gs);
  std::string msg = absl::StrCat("error: ", absl::StatusCodeToString(s.code()), ": ", s.message());
  if (s.code() == absl::StatusCode::kUnavailable) {
    // gRPC's text ("Socket closed", "failed to connect to all addresses")
    // does not say what failed: try the connection by hand. Only when
    // nothing listens does it ask whether the scheduler runs.
    const std::string why = ExplainConnectFailure(addresses_.current(), opts_.tls_files);
    if (!why.empty()) {
      msg = absl::StrCat("error: UNAVAILABLE: ", why, " (gRPC: ", s.message(), ")");
    }
  } else if (s.code() == absl::StatusCode::kDeadlineExceeded) {
    absl::StrAppend(&msg, " (no answer from ", addresses_.current(),
                    " within --timeout=", absl::FormatDuration(opts_.timeout), ")");
  }
  std::cerr << msg << "\n";
}

void Client::ReportMaybeRun(const grpc::Status& s) const {
  std::cerr << "error: " << absl::StatusCodeToString(FromGrpcStatus(s).code()) << ": "
            << s.error_message() << " (the call reached " << addresses_.current()
            << " and may have been carried out before its answer was lost; it is not sent again "
               "by itself, as twice would not do what once does: look (taskgridctl list) before "
               "you repeat it)\n";
}

// Submitting twice makes the same tasks as once only when every task has an
// id (an existing id answers with that task) and none is delivered by merge
// key (each submit would merge again).
namespace {

bool EveryTaskRepeatable(const google::protobuf::RepeatedPtrField<v1::TaskSpec>& tasks) {
  return std::all_of(tasks.begin(), tasks.end(), [](const v1::TaskSpec& t) {
    return !t.id().empty() && t.merge_key().empty();
  });
}

}  // namespace

bool RepeatableSubmit(const v1::SubmitTasksRequest& req) {
  return EveryTaskRepeatable(req.tasks());
}

// The same job again (same id, same tasks) answers with the job.
bool RepeatableSubmit(const v1::SubmitJobRequest& req) {
  return !req.job_id().empty() && EveryTaskRepeatable(req.tasks());
}

std::string ClientMadeId(char kind) {
  // 48 random bits: two clients in the same millisecond do not meet. The
  // 12 hex digits keep it apart from the scheduler's own "t<ms>-<6 digits>".
  static std::random_device random;
  const uint64_t bits = ((uint64_t{random()} << 32) | random()) & 0xffff'ffff'ffffULL;
  return absl::StrFormat("%c%014d-%012x", kind, absl::ToUnixMillis(absl::Now()), bits);
}

namespace {

void GiveTaskIds(google::protobuf::RepeatedPtrField<v1::TaskSpec>* tasks) {
  for (v1::TaskSpec& t : *tasks) {
    if (t.id().empty() && t.merge_key().empty()) t.set_id(ClientMadeId('t'));
  }
}

}  // namespace

void GiveIds(v1::SubmitTasksRequest* req) { GiveTaskIds(req->mutable_tasks()); }

void GiveIds(v1::SubmitJobRequest* req) {
  if (req->job_id().empty()) req->set_job_id(ClientMadeId('j'));
  GiveTaskIds(req->mutable_tasks());
}

void Client::PrintMore(const std::string& next_page_token) {
  if (next_page_token.empty()) return;
  std::cout.flush();
  std::cerr << "more: --page_token=" << next_page_token << "\n";
}

int Client::Submit(const v1::SubmitTasksRequest& req) {
  v1::SubmitTasksResponse resp;
  if (!Call([&](grpc::ClientContext* ctx) { return stub_->SubmitTasks(ctx, req, &resp); },
            RepeatableSubmit(req))) {
    return kExitRpcFailed;
  }
  std::cout << (opts_.json ? ToJson(resp) : FormatSubmitted(resp));
  return kExitOk;
}

int Client::Get(const std::string& id) {
  v1::GetTaskRequest req;
  req.set_id(id);
  v1::Task task;
  if (!Call([&](grpc::ClientContext* ctx) { return stub_->GetTask(ctx, req, &task); })) {
    return kExitRpcFailed;
  }
  std::cout << (opts_.json ? ToJson(task) : FormatTaskDetail(task));
  return kExitOk;
}

namespace {
// Where a ListTasks page's items are.
auto TasksOf = [](v1::ListTasksResponse* r) { return r->mutable_tasks(); };
}  // namespace

int Client::List(v1::ListTasksRequest req, bool all) {
  v1::ListTasksResponse merged;
  int64_t total = 0;  // the last page's count of every match
  if (!FetchPages(
          std::move(req), all,
          [this, &total](grpc::ClientContext* ctx, const v1::ListTasksRequest& r,
                         v1::ListTasksResponse* page) {
            grpc::Status s = stub_->ListTasks(ctx, r, page);
            total = page->total_size();
            return s;
          },
          TasksOf, &merged)) {
    return kExitRpcFailed;
  }
  merged.set_total_size(total);
  if (opts_.json) {
    std::cout << ToJson(merged);
  } else {
    std::cout << FormatTaskList({merged.tasks().begin(), merged.tasks().end()});
    if (!merged.next_page_token().empty()) {
      std::cout.flush();
      std::cerr << total << " tasks match in all\n";
    }
  }
  PrintMore(merged.next_page_token());
  return kExitOk;
}

int Client::Act(Action action, const std::string& id) {
  v1::Task task;
  const bool ok = Call([&](grpc::ClientContext* ctx) {
    switch (action) {
      case Action::kCancel: {
        v1::CancelTaskRequest req;
        req.set_id(id);
        return stub_->CancelTask(ctx, req, &task);
      }
      case Action::kRetry: {
        v1::RetryTaskRequest req;
        req.set_id(id);
        return stub_->RetryTask(ctx, req, &task);
      }
      case Action::kReset: {
        v1::ResetTaskRequest req;
        req.set_id(id);
        return stub_->ResetTask(ctx, req, &task);
      }
      case Action::kPause: {
        v1::PauseTaskRequest req;
        req.set_id(id);
        return stub_->PauseTask(ctx, req, &task);
      }
      case Action::kResume: {
        v1::ResumeTaskRequest req;
        req.set_id(id);
        return stub_->ResumeTask(ctx, req, &task);
      }
    }
    return grpc::Status(grpc::StatusCode::INTERNAL, "unknown action");
  });
  if (!ok) return kExitRpcFailed;
  if (opts_.json) {
    std::cout << ToJson(task);
  } else {
    std::cout << task.spec().id() << " " << TaskStateText(task) << "\n";
  }
  // PAUSING is not a state of the table: the task stays RUNNING until the
  // agent confirmed the stop. Said on stderr so stdout stays "ID STATE".
  if (action == Action::kPause &&
      (task.state() == v1::TASK_STATE_DISPATCHED || task.state() == v1::TASK_STATE_RUNNING)) {
    std::cout.flush();
    std::cerr << "note: " << task.spec().id() << " is being stopped on agent " << task.agent_id()
              << "; it ends PAUSED\n";
  }
  return kExitOk;
}

int Client::DeleteByMergeKey(const std::string& queue, const std::string& merge_key) {
  v1::DeleteByMergeKeyRequest req;
  req.set_queue(queue);
  req.set_merge_key(merge_key);
  v1::Task task;
  if (!Call([&](grpc::ClientContext* ctx) { return stub_->DeleteByMergeKey(ctx, req, &task); })) {
    return kExitRpcFailed;
  }
  if (opts_.json) {
    std::cout << ToJson(task);
  } else {
    std::cout << task.spec().id() << " " << core::StateName(task.state()) << "\n";
  }
  return kExitOk;
}

int Client::Stats(const std::string& queue) {
  v1::GetQueueStatsRequest req;
  req.set_queue(queue);
  v1::GetQueueStatsResponse resp;
  if (!Call([&](grpc::ClientContext* ctx) { return stub_->GetQueueStats(ctx, req, &resp); })) {
    return kExitRpcFailed;
  }
  std::cout << (opts_.json ? ToJson(resp) : FormatStats(resp));
  return kExitOk;
}

int Client::PauseQueue(const std::string& queue, bool paused) {
  v1::QueueStats stats;
  if (!Call([&](grpc::ClientContext* ctx) {
        if (paused) {
          v1::PauseQueueRequest req;
          req.set_queue(queue);
          return stub_->PauseQueue(ctx, req, &stats);
        }
        v1::ResumeQueueRequest req;
        req.set_queue(queue);
        return stub_->ResumeQueue(ctx, req, &stats);
      })) {
    return kExitRpcFailed;
  }
  return PrintQueue(stats);
}

int Client::SetQueueLimits(const v1::SetQueueLimitsRequest& req) {
  v1::QueueStats stats;
  if (!Call([&](grpc::ClientContext* ctx) { return stub_->SetQueueLimits(ctx, req, &stats); })) {
    return kExitRpcFailed;
  }
  return PrintQueue(stats);
}

int Client::SetQueueWeight(const v1::SetQueueWeightRequest& req) {
  v1::QueueStats stats;
  if (!Call([&](grpc::ClientContext* ctx) { return stub_->SetQueueWeight(ctx, req, &stats); })) {
    return kExitRpcFailed;
  }
  return PrintQueue(stats);
}

int Client::PrintQueue(const v1::QueueStats& stats) {
  if (opts_.json) {
    std::cout << ToJson(stats);
  } else {
    v1::GetQueueStatsResponse one;
    *one.add_queues() = stats;
    std::cout << FormatStats(one);
  }
  return kExitOk;
}

int Client::Bulk(BulkChange change, v1::BulkTasksRequest req) {
  const char* verb = change == BulkChange::kCancel  ? "cancelled"
                     : change == BulkChange::kRetry ? "retried"
                                                    : "deleted";
  v1::BulkTasksResponse all;
  for (;;) {
    v1::BulkTasksResponse page;
    if (!Call([&](grpc::ClientContext* ctx) {
          switch (change) {
            case BulkChange::kCancel:
              return stub_->CancelTasks(ctx, req, &page);
            case BulkChange::kRetry:
              return stub_->RetryTasks(ctx, req, &page);
            case BulkChange::kDelete:
              break;
          }
          return stub_->DeleteTasks(ctx, req, &page);
        })) {
      // What went before is done: say so before giving up.
      if (all.ids_size() > 0) {
        std::cerr << verb << " " << all.ids_size() << " tasks before the error\n";
      }
      return kExitRpcFailed;
    }
    for (std::string& id : *page.mutable_ids()) all.add_ids(std::move(id));
    if (all.skipped() == 0) all.set_skipped_reason(page.skipped_reason());
    all.set_skipped(all.skipped() + page.skipped());
    if (page.next_page_token().empty()) break;
    req.set_page_token(page.next_page_token());
  }
  std::cout << (opts_.json ? ToJson(all) : FormatBulk(verb, all));
  return kExitOk;
}

int Client::Delete(const std::vector<std::string>& ids) {
  for (const std::string& id : ids) {
    v1::DeleteTaskRequest req;
    req.set_id(id);
    v1::DeleteTaskResponse resp;
    if (!Call([&](grpc::ClientContext* ctx) { return stub_->DeleteTask(ctx, req, &resp); })) {
      return kExitRpcFailed;
    }
    if (opts_.json) {
      std::cout << ToJson(resp);
      continue;
    }
    for (const std::string& deleted : resp.ids()) std::cout << "deleted " << deleted << "\n";
  }
  return kExitOk;
}

int Client::DeleteJob(const std::string& id) {
  v1::DeleteJobRequest req;
  req.set_id(id);
  v1::DeleteJobResponse resp;
  if (!Call([&](grpc::ClientContext* ctx) { return job_stub_->DeleteJob(ctx, req, &resp); })) {
    return kExitRpcFailed;
  }
  std::cout << (opts_.json
                    ? ToJson(resp)
                    : absl::StrCat("deleted job ", resp.id(), " and its ", resp.tasks_deleted(),
                                   resp.tasks_deleted() == 1 ? " task\n" : " tasks\n"));
  return kExitOk;
}

int Client::SetQueueRetention(const v1::SetQueueRetentionRequest& req) {
  v1::QueueStats stats;
  if (!Call([&](grpc::ClientContext* ctx) { return stub_->SetQueueRetention(ctx, req, &stats); })) {
    return kExitRpcFailed;
  }
  return PrintQueue(stats);
}

int Client::Agents() {
  v1::ListAgentsResponse resp;
  if (!Call([&](grpc::ClientContext* ctx) {
        return cluster_stub_->ListAgents(ctx, v1::ListAgentsRequest(), &resp);
      })) {
    return kExitRpcFailed;
  }
  std::cout << (opts_.json ? ToJson(resp) : FormatAgents(resp, absl::Now()));
  return kExitOk;
}

int Client::Drain(const std::string& agent_id) {
  v1::DrainAgentRequest req;
  req.set_id(agent_id);
  v1::Agent agent;
  if (!Call(
          [&](grpc::ClientContext* ctx) { return cluster_stub_->DrainAgent(ctx, req, &agent); })) {
    return kExitRpcFailed;
  }
  return PrintAgent(agent);
}

int Client::Undrain(const std::string& agent_id) {
  v1::UndrainAgentRequest req;
  req.set_id(agent_id);
  v1::Agent agent;
  if (!Call([&](grpc::ClientContext* ctx) {
        return cluster_stub_->UndrainAgent(ctx, req, &agent);
      })) {
    return kExitRpcFailed;
  }
  return PrintAgent(agent);
}

int Client::PrintAgent(const v1::Agent& agent) {
  if (opts_.json) {
    std::cout << ToJson(agent);
  } else {
    std::cout << agent.id() << " " << core::AgentStateName(agent.state()) << "\n";
  }
  return kExitOk;
}

int Client::ClusterStats() {
  v1::ClusterStats stats;
  if (!Call([&](grpc::ClientContext* ctx) {
        return cluster_stub_->GetClusterStats(ctx, v1::GetClusterStatsRequest(), &stats);
      })) {
    return kExitRpcFailed;
  }
  std::cout << (opts_.json ? ToJson(stats) : FormatClusterStats(stats));
  return kExitOk;
}

int Client::GetJob(const std::string& id) {
  v1::GetJobRequest req;
  req.set_id(id);
  v1::Job job;
  if (!Call([&](grpc::ClientContext* ctx) { return job_stub_->GetJob(ctx, req, &job); })) {
    return kExitRpcFailed;
  }
  v1::ListTasksRequest list;
  list.set_job_id(id);
  list.set_page_size(1000);
  v1::ListTasksResponse all;
  if (!FetchPages(
          std::move(list), true,
          [this](grpc::ClientContext* ctx, const v1::ListTasksRequest& r,
                 v1::ListTasksResponse* page) { return stub_->ListTasks(ctx, r, page); },
          TasksOf, &all)) {
    return kExitRpcFailed;
  }
  std::vector<v1::Task> tasks(std::make_move_iterator(all.mutable_tasks()->begin()),
                              std::make_move_iterator(all.mutable_tasks()->end()));
  if (opts_.json) {
    // JSON lines: the Job, then each Task in submit order.
    std::cout << ToJsonLine(job);
    for (const v1::Task& t : tasks) std::cout << ToJsonLine(t);
  } else {
    std::cout << FormatJobDetail(job) << "\n" << FormatJobTree(tasks);
  }
  return kExitOk;
}

int Client::ListJobs(v1::ListJobsRequest req, bool all) {
  v1::ListJobsResponse merged;
  auto rpc = [this](grpc::ClientContext* ctx, const v1::ListJobsRequest& r,
                    v1::ListJobsResponse* page) { return job_stub_->ListJobs(ctx, r, page); };
  auto jobs = [](v1::ListJobsResponse* r) { return r->mutable_jobs(); };
  if (!FetchPages(std::move(req), all, rpc, jobs, &merged)) return kExitRpcFailed;
  if (opts_.json) {
    std::cout << ToJson(merged);
  } else {
    std::cout << FormatJobList({merged.jobs().begin(), merged.jobs().end()});
  }
  PrintMore(merged.next_page_token());
  return kExitOk;
}

int Client::ActOnJob(JobAction action, const std::string& id) {
  v1::Job job;
  const bool ok = Call([&](grpc::ClientContext* ctx) {
    switch (action) {
      case JobAction::kCancel: {
        v1::CancelJobRequest req;
        req.set_id(id);
        return job_stub_->CancelJob(ctx, req, &job);
      }
      case JobAction::kRetry: {
        v1::RetryJobRequest req;
        req.set_id(id);
        return job_stub_->RetryJob(ctx, req, &job);
      }
    }
    return grpc::Status(grpc::StatusCode::INTERNAL, "unknown action");
  });
  if (!ok) return kExitRpcFailed;
  std::cout << (opts_.json ? ToJson(job) : FormatJobSummary(job) + "\n");
  return kExitOk;
}

}  // namespace taskgrid::ctl
