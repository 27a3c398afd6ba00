// The RPC half of taskgridctl: one method per command, each sends its
// request(s) to the scheduler, prints the answer (table or JSON) on stdout
// and returns the process exit code. Requests arrive already validated and
// built from the command line (taskgridctl.cc).
//
// Not thread-safe; one Client per process.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/status.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/address.h"
#include "common/connect_probe.h"
#include "common/grpc_status.h"
#include "taskgrid/v1/board_service.grpc.pb.h"
#include "taskgrid/v1/cluster_service.grpc.pb.h"
#include "taskgrid/v1/job_service.grpc.pb.h"
#include "taskgrid/v1/schedule_service.grpc.pb.h"
#include "taskgrid/v1/task_service.grpc.pb.h"
#include "tools/ctl/lost_scheduler.h"

namespace taskgrid::ctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRpcFailed = 1;
inline constexpr int kExitUsage = 2;
// wait, submit --wait: a task ended FAILED or CANCELLED; job submit --wait:
// the job ended FAILED or CANCELLED.
inline constexpr int kExitTaskFailed = 3;
// wait, submit --wait, job submit --wait: --wait_timeout passed first.
inline constexpr int kExitWaitTimedOut = 4;

enum class Action { kCancel, kRetry, kReset, kPause, kResume };
enum class JobAction { kCancel, kRetry };
enum class ScheduleAction { kPause, kResume, kDelete };
// A bulk change by filter.
enum class BulkChange { kCancel, kRetry, kDelete };

struct ClientOptions {
  // HOST:PORT of the scheduler, or a comma-separated list of a leader and
  // its standbys (SchedulerAddresses): each call goes to the one that
  // leads. Must parse (taskgridctl.cc checks it).
  std::string addr;
  bool json = false;                           // print proto3 JSON instead of tables
  absl::Duration timeout = absl::Seconds(30);  // deadline of each RPC
  // TLS, client certificate, bearer token (common/tls.h); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // The TLS files behind `credentials`, for saying why a connection
  // failed (common/connect_probe.h).
  ProbeFiles tls_files;
};

struct WatchOptions {
  v1::WatchTasksRequest request;
  int64_t count = 0;    // > 0: end after this many events
  bool follow = false;  // reconnect (from the last revision printed) when the stream ends
  // The filters as typed, to print a command that resumes the watch.
  std::string filter_flags;
};

class Client {
 public:
  explicit Client(ClientOptions opts);

  int Submit(const v1::SubmitTasksRequest& req);
  // Submits, then waits for every submitted task in turn (all within
  // `wait_timeout` of the submit; InfiniteDuration: no limit). Exit code as
  // Wait's.
  int SubmitAndWait(const v1::SubmitTasksRequest& req, absl::Duration wait_timeout);
  // WaitTask, repeated until each task is finished or `wait_timeout` passed.
  // kExitOk when every task SUCCEEDED; else kExitTaskFailed when one FAILED
  // or was CANCELLED; else kExitWaitTimedOut.
  int Wait(const std::vector<std::string>& ids, absl::Duration wait_timeout);
  // WatchTasks: one line (or JSON object) per event until the stream ends,
  // `count` events were printed, or SIGINT/SIGTERM (kExitOk).
  int Watch(const WatchOptions& opts);
  int Get(const std::string& id);
  // StreamTaskOutput (logs.cc): the task's output, printed as it comes
  // (LogPrinter, or JSON lines). Without follow, within --timeout: exit
  // kExitOk. With follow, until the task is finished: kExitOk when it
  // SUCCEEDED, kExitTaskFailed when it ended otherwise, kExitWaitTimedOut
  // when `wait_timeout` (InfiniteDuration: none) passed first.
  int Logs(const v1::StreamTaskOutputRequest& req, absl::Duration wait_timeout);
  // `all`: follows next_page_token until the last page.
  int List(v1::ListTasksRequest req, bool all);
  int Act(Action action, const std::string& id);
  int Stats(const std::string& queue);
  // Queue controls: each prints the queue's line of Stats.
  int PauseQueue(const std::string& queue, bool paused);
  int SetQueueLimits(const v1::SetQueueLimitsRequest& req);
  int SetQueueWeight(const v1::SetQueueWeightRequest& req);
  // CancelTasks (`cancel`) or RetryTasks, a call per page until the last;
  // prints how many were changed (and skipped).
  int Bulk(BulkChange change, v1::BulkTasksRequest req);
  // Deletes finished tasks by id, one call each; prints each id deleted
  // (with its replicas). Stops at the first refusal.
  int Delete(const std::vector<std::string>& ids);
  int DeleteJob(const std::string& id);
  int SetQueueRetention(const v1::SetQueueRetentionRequest& req);
  // Cancels the waiting task of a merge key; prints "ID STATE".
  int DeleteByMergeKey(const std::string& queue, const std::string& merge_key);
  // ClusterService: the table of agents, draining one, the cluster's counts.
  int Agents();
  int Drain(const std::string& agent_id);
  int Undrain(const std::string& agent_id);
  int ClusterStats();
  // JobService. SubmitJob prints the job; with `wait`, it then waits until
  // the job is no longer RUNNING (or `wait_timeout` passed; InfiniteDuration:
  // no limit) and prints it again: kExitOk when it SUCCEEDED, kExitTaskFailed
  // when it FAILED or was CANCELLED, kExitWaitTimedOut when still RUNNING.
  int SubmitJob(const v1::SubmitJobRequest& req, bool wait, absl::Duration wait_timeout);
  // The job, then its tasks (every page of ListTasks) as a tree.
  int GetJob(const std::string& id);
  // `all`: follows next_page_token until the last page.
  int ListJobs(v1::ListJobsRequest req, bool all);
  int ActOnJob(JobAction action, const std::string& id);

  // BoardService (board.cc): pull mode from the command line, for scripts
  // and for looking at what a worker would get. Claim prints the claims;
  // the claim calls print "ID STATE" (ExtendClaim: the new end);
  // BoardWait exits kExitOk when work is ready, kExitWaitTimedOut when the
  // wait ran out with none.
  int BoardClaim(const v1::ClaimRequest& req);
  int BoardExtend(const v1::ExtendClaimRequest& req);
  int BoardComplete(const v1::CompleteClaimRequest& req);
  int BoardAbandon(const v1::AbandonClaimRequest& req);
  int BoardTrash(const v1::TrashClaimRequest& req);
  int BoardRestore(const std::string& id);
  int BoardWait(const v1::WaitForWorkRequest& req);

  // ScheduleService (schedule.cc): create, pause and resume print
  // "ID STATE  next fire TIME", delete "ID deleted ...", get the detail
  // view, list the table (`all`: every page).
  int CreateSchedule(const v1::CreateScheduleRequest& req);
  int GetSchedule(const std::string& id);
  int ListSchedules(v1::ListSchedulesRequest req, bool all);
  int ActOnSchedule(ScheduleAction action, const std::string& id);

 private:
  // "ID STATE", or the Agent as JSON.
  int PrintAgent(const v1::Agent& agent);
  // The queue's line of Stats, or the QueueStats as JSON.
  int PrintQueue(const v1::QueueStats& stats);
  // Runs `rpc` with a fresh context carrying the deadline, on the
  // scheduler that leads (NextScheduler). On failure prints "error: CODE:
  // message" on stderr and returns false.
  // `repeatable`: running the call twice does what running it once does
  // (reads, submits whose every task has an id). A call that reached a
  // scheduler and failed UNAVAILABLE (or CANCELLED: the server went away
  // with it) may have been run there with its answer lost: it is made
  // again (on the next address) only when repeatable; otherwise that is
  // reported, saying it may have been run.
  // Calls a standby answered, or that could not connect, were not run and
  // are always made again.
  template <typename Rpc>
  bool Call(Rpc&& rpc, bool repeatable = true);
  // OK when the current scheduler can be called now. With several
  // addresses, one that does not finish connecting within 2 s (a frozen
  // process, a host gone) is UNAVAILABLE at once rather than at the
  // call's deadline.
  grpc::Status Reach();
  // After a call to the current scheduler failed with `s` (`ctx` its
  // context): when it was UNAVAILABLE and a standby named the leader, or
  // other addresses are there to try, makes the next one current
  // (SchedulerAddresses::Failed). True when the call should be made again
  // at once: at most size() + 1 times in a row without an answer; after
  // that the next address is still made current, for the caller's own
  // patience (LostScheduler) to use.
  bool NextScheduler(const grpc::ClientContext& ctx, const grpc::Status& s);
  // A call was answered: the current scheduler is the one to keep.
  void Reached() {
    addresses_.Answered();
    follows_ = 0;
  }
  // Points channel_ and the stubs at addresses_.current().
  void UseCurrent();
  // Says on stderr, once per call, that no scheduler leads at the moment.
  void NoteFailover(const grpc::Status& s) const;
  // A list call, page after page: `rpc(ctx, req, &page)` for the first page
  // and (when `all`) every next one, moving the items of each page
  // (`items(&page)`, a repeated field) into `merged`, which ends with the
  // last page's next_page_token. False on an error (reported).
  template <typename Req, typename Resp, typename Rpc, typename Items>
  bool FetchPages(Req req, bool all, Rpc&& rpc, Items&& items, Resp* merged);
  // After a listing: says how to get the next page, if there is one.
  static void PrintMore(const std::string& next_page_token);
  // Prints `s` (not OK) as "error: CODE: message" with a hint for the
  // codes that have one.
  void Report(const grpc::Status& s) const;
  // Reports an UNAVAILABLE call that reached the scheduler: it may have
  // been run, its answer lost.
  void ReportMaybeRun(const grpc::Status& s) const;
  // Waits for one task until `deadline` (InfiniteFuture: none). False on an
  // error (reported); else `out` holds the last answer.
  bool WaitOne(const std::string& id, absl::Time deadline, v1::WaitTaskResponse* out);
  // The final (or, on timeout, the current) state of every task in `tasks`,
  // in place; returns the exit code.
  int WaitAll(std::vector<v1::Task>* tasks, absl::Duration wait_timeout, bool print_lines);
  // GetJob; a scheduler that answered before and is unreachable now is
  // asked again for up to --timeout (and not past `deadline`). False on an
  // error (reported).
  bool GetJobPatiently(const std::string& id, absl::Time deadline, v1::Job* job);
  // Waits until job `id` is no longer RUNNING or `deadline` passed; `job`
  // holds the last answer. Woken by a WatchTasks stream filtered by the job,
  // with GetJob as the judge. False on an error (reported).
  bool WaitJob(const std::string& id, absl::Time deadline, v1::Job* job);

  // One scheduler's channel and stubs, made when first used and kept (a
  // stub handed out stays valid).
  struct Endpoint {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::TaskService::Stub> tasks;
    std::unique_ptr<v1::ClusterService::Stub> cluster;
    std::unique_ptr<v1::JobService::Stub> jobs;
    std::unique_ptr<v1::BoardService::Stub> board;
    std::unique_ptr<v1::ScheduleService::Stub> schedules;
  };

  ClientOptions opts_;
  SchedulerAddresses addresses_;
  size_t follows_ = 0;  // NextScheduler() calls since the last answer
  std::map<std::string, Endpoint> endpoints_;
  // The current scheduler's (UseCurrent()).
  std::shared_ptr<grpc::Channel> channel_;
  v1::TaskService::Stub* stub_ = nullptr;
  v1::ClusterService::Stub* cluster_stub_ = nullptr;
  v1::JobService::Stub* job_stub_ = nullptr;
  v1::BoardService::Stub* board_stub_ = nullptr;
  v1::ScheduleService::Stub* schedule_stub_ = nullptr;
};

// Whether sending `req` twice makes the same tasks as once (Client::Call).
bool RepeatableSubmit(const v1::SubmitTasksRequest& req);
bool RepeatableSubmit(const v1::SubmitJobRequest& req);
// An id made here, before the first try: `kind` ('t' a task, 'j' a job),
// the time in milliseconds and 48 random bits, e.g. t01764196800000-3f09a1c2b7de.
std::string ClientMadeId(char kind);
// Gives every task without an id (and not delivered by merge key), and a
// job without one, an id made here, so that a submit whose answer was lost
// can be sent again: the second finds what the first made.
void GiveIds(v1::SubmitTasksRequest* req);
void GiveIds(v1::SubmitJobRequest* req);

// The templates every command file uses.

template <typename Rpc>
bool Client::Call(Rpc&& rpc, bool repeatable) {
  LostScheduler failover(opts_.timeout);
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + opts_.timeout));
    grpc::Status s = Reach();
    const bool sent = s.ok();
    if (sent) s = rpc(&ctx);
    if (s.ok()) {
      Reached();
      return true;
    }
    // Lost mid-call (UNAVAILABLE, or CANCELLED by a server going away):
    // perhaps carried out.
    const bool lost_in_hand = sent && IsLostScheduler(s) && !AnsweredByStandby(ctx);
    if (lost_in_hand && !repeatable) {
      ReportMaybeRun(s);
      return false;
    }
    if (NextScheduler(ctx, s)) continue;
    // A failover under way: a standby answered, or the list's schedulers
    // did not connect (the call was not run anywhere), or one went away
    // with a call that is safe to repeat: ask again, within --timeout,
    // until one leads.
    if ((!sent || AnsweredByStandby(ctx) || (lost_in_hand && addresses_.size() > 1)) &&
        failover.TryAgain(s, absl::InfiniteFuture(), [&] { NoteFailover(s); })) {
      continue;
    }
    Report(s);
    return false;
  }
}

template <typename Req, typename Resp, typename Rpc, typename Items>
bool Client::FetchPages(Req req, bool all, Rpc&& rpc, Items&& items, Resp* merged) {
  while (true) {
    Resp page;
    if (!Call([&](grpc::ClientContext* ctx) { return rpc(ctx, req, &page); })) return false;
    for (auto& item : *items(&page)) *items(merged)->Add() = std::move(item);
    merged->set_next_page_token(page.next_page_token());
    if (!all || page.next_page_token().empty()) return true;
    req.set_page_token(page.next_page_token());
  }
}

}  // namespace taskgrid::ctl
