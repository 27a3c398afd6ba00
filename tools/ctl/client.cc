#include "tools/ctl/client.h"

#include <grpcpp/grpcpp.h>

#include <iostream>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "scheduler/core/state_machine.h"
#include "tools/ctl/output.h"

namespace taskgrid::ctl {

Client::Client(ClientOptions opts) : opts_(std::move(opts)) {
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(opts_.addr, grpc::InsecureChannelCredentials());
  stub_ = v1::TaskService::NewStub(channel);
  cluster_stub_ = v1::ClusterService::NewStub(channel);
}

template <typename Rpc>
bool Client::Call(Rpc&& rpc) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + opts_.timeout));
  const absl::Status s = FromGrpcStatus(rpc(&ctx));
  if (s.ok()) return true;
  std::string msg = absl::StrCat("error: ", absl::StatusCodeToString(s.code()), ": ", s.message());
  if (s.code() == absl::StatusCode::kUnavailable) {
    absl::StrAppend(&msg, " (is taskgrid-scheduler running at ", opts_.addr, "?)");
  } else if (s.code() == absl::StatusCode::kDeadlineExceeded) {
    absl::StrAppend(&msg, " (no answer from ", opts_.addr,
                    " within --timeout=", absl::FormatDuration(opts_.timeout), ")");
  }
  std::cerr << msg << "\n";
  return false;
}

int Client::Submit(const v1::SubmitTasksRequest& req) {
  v1::SubmitTasksResponse resp;
  if (!Call([&](grpc::ClientContext* ctx) { return stub_->SubmitTasks(ctx, req, &resp); })) {
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

int Client::List(v1::ListTasksRequest req, bool all) {
  v1::ListTasksResponse merged;
  while (true) {
    v1::ListTasksResponse page;
    if (!Call([&](grpc::ClientContext* ctx) { return stub_->ListTasks(ctx, req, &page); })) {
      return kExitRpcFailed;
    }
    for (v1::Task& t : *page.mutable_tasks()) *merged.add_tasks() = std::move(t);
    merged.set_next_page_token(page.next_page_token());
    if (!all || page.next_page_token().empty()) break;
    req.set_page_token(page.next_page_token());
  }
  if (opts_.json) {
    std::cout << ToJson(merged);
  } else {
    std::cout << FormatTaskList({merged.tasks().begin(), merged.tasks().end()});
  }
  if (!merged.next_page_token().empty()) {
    std::cout.flush();
    std::cerr << "more: --page_token=" << merged.next_page_token() << "\n";
  }
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
    std::cout << task.spec().id() << " " << core::StateName(task.state()) << "\n";
  }
  // There is no PAUSING state: a task on an agent reads RUNNING until the
  // agent confirmed the stop. Said on stderr so stdout stays "ID STATE".
  if (action == Action::kPause &&
      (task.state() == v1::TASK_STATE_DISPATCHED || task.state() == v1::TASK_STATE_RUNNING)) {
    std::cout.flush();
    std::cerr << "note: " << task.spec().id() << " is being stopped on agent " << task.agent_id()
              << "; it ends PAUSED\n";
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
  if (opts_.json) {
    std::cout << ToJson(agent);
  } else {
    std::cout << agent.id() << " " << AgentStateName(agent.state()) << "\n";
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

}  // namespace taskgrid::ctl
