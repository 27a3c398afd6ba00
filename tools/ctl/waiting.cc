// taskgridctl's long-running commands: waiting for tasks and jobs, and
// watching. They outlast one call (reconnecting, resuming, stopping on
// Ctrl-C), unlike the one-call commands in client.cc.

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "common/message_limits.h"
#include "common/proto_time.h"
#include "scheduler/core/state_machine.h"
#include "tools/ctl/client.h"
#include "tools/ctl/job_tree.h"
#include "tools/ctl/lost_scheduler.h"
#include "tools/ctl/output.h"

namespace taskgrid::ctl {

namespace {

// One WaitTask call waits at most this long; the client calls again until
// the task is finished or --wait_timeout passed.
constexpr absl::Duration kWaitChunk = absl::Minutes(1);

// The write end of InterruptCanceller's pipe; -1 when none is installed.
std::atomic<int> interrupt_fd{-1};

extern "C" void OnInterrupt(int) {
  const int saved = errno;
  const int fd = interrupt_fd.load();
  if (fd >= 0) {
    const char c = 'i';
    const ssize_t n = write(fd, &c, 1);
    (void)n;
  }
  errno = saved;
}

// Ends a watch on SIGINT or SIGTERM. The handler only writes to a pipe
// (async-signal-safe); a thread reading the pipe cancels the current call.
// SA_RESETHAND: a second Ctrl-C kills the process as usual.
class InterruptCanceller {
 public:
  InterruptCanceller() {
    if (pipe(fds_) != 0) {
      fds_[0] = fds_[1] = -1;
      return;
    }
    interrupt_fd.store(fds_[1]);
    struct sigaction sa = {};
    sa.sa_handler = OnInterrupt;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_RESETHAND;
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
    thread_ = std::thread([this] { Loop(); });
  }

  ~InterruptCanceller() {
    if (fds_[0] < 0) return;
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    interrupt_fd.store(-1);
    const char c = 'q';
    while (write(fds_[1], &c, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
    close(fds_[0]);
    close(fds_[1]);
  }

  InterruptCanceller(const InterruptCanceller&) = delete;
  InterruptCanceller& operator=(const InterruptCanceller&) = delete;

  // The call to cancel on an interrupt (nullptr: none). Cancelled at once
  // when the interrupt came already.
  void Set(grpc::ClientContext* ctx) {
    std::lock_guard<std::mutex> lock(mu_);
    ctx_ = ctx;
    if (ctx_ != nullptr && interrupted_) ctx_->TryCancel();
  }

  bool interrupted() {
    std::lock_guard<std::mutex> lock(mu_);
    return interrupted_;
  }

  // Sleeps for `d`; true (early) when interrupted.
  bool SleepFor(absl::Duration d) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(d), [this] { return interrupted_; });
  }

 private:
  void Loop() {
    while (true) {
      char c = 0;
      const ssize_t n = read(fds_[0], &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || c == 'q') return;
      std::lock_guard<std::mutex> lock(mu_);
      interrupted_ = true;
      if (ctx_ != nullptr) ctx_->TryCancel();
      cv_.notify_all();
    }
  }

  int fds_[2] = {-1, -1};
  struct sigaction old_int_ = {};
  struct sigaction old_term_ = {};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  grpc::ClientContext* ctx_ = nullptr;  // guarded by mu_
  bool interrupted_ = false;            // guarded by mu_
};

// A revision in the scheduler's metadata (`key`), if it sent one.
std::optional<int64_t> RevisionIn(const std::multimap<grpc::string_ref, grpc::string_ref>& md,
                                  const char* key) {
  auto it = md.find(key);
  int64_t revision = 0;
  if (it == md.end() ||
      !absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &revision)) {
    return std::nullopt;
  }
  return revision;
}

// Where a watch ended for falling behind may resume.
std::optional<int64_t> ResumeAfter(const grpc::ClientContext& ctx) {
  return RevisionIn(ctx.GetServerTrailingMetadata(), kResumeAfterKey);
}

// The command that resumes a watch after `after` (unset: from now on).
std::string WatchCommand(std::optional<int64_t> after, const std::string& filter_flags) {
  std::string out = "taskgridctl watch";
  if (after.has_value()) absl::StrAppend(&out, " --after=", *after);
  if (!filter_flags.empty()) absl::StrAppend(&out, " ", filter_flags);
  return out;
}

std::string RevisionText(std::optional<int64_t> after) {
  return after.has_value() ? absl::StrCat("after revision ", *after) : "from now on";
}

// A job wait asks GetJob again at least this often, even when the watch is
// live and says nothing (a safety net; the watch is what wakes it).
constexpr absl::Duration kJobSafetyPoll = absl::Seconds(5);
// ...and at most this often when a burst of tasks ends.
constexpr absl::Duration kJobMinPoll = absl::Milliseconds(50);
// Without a watch: polls from this interval, doubling up to the next.
constexpr absl::Duration kJobPollMin = absl::Milliseconds(100);
constexpr absl::Duration kJobPollMax = absl::Seconds(2);

// Tells a job wait that one of the job's tasks ended: a WatchTasks stream
// filtered by the job and the terminal states, read on a thread of its own.
// Lifecycle: 1. the constructor opens the stream on the thread; 2. the
// scheduler's initial metadata says the watch is registered (every later
// change reaches it): WaitEstablished() returns; 3. each event wakes
// WaitEvent(); 4. the stream ends (an error, a restart) or the destructor
// cancels it, then joins the thread. The stub is borrowed and must outlive
// the watcher.
class JobEndWatcher {
 public:
  JobEndWatcher(v1::TaskService::Stub* stub, const std::string& job_id) {
    v1::WatchTasksRequest req;
    req.set_job_id(job_id);
    for (v1::TaskState s :
         {v1::TASK_STATE_SUCCEEDED, v1::TASK_STATE_FAILED, v1::TASK_STATE_CANCELLED}) {
      req.add_states(s);
    }
    thread_ = std::thread([this, stub, req = std::move(req)] { Run(stub, req); });
  }

  ~JobEndWatcher() {
    ctx_.TryCancel();  // also when the call has not started yet
    thread_.join();
  }

  JobEndWatcher(const JobEndWatcher&) = delete;
  JobEndWatcher& operator=(const JobEndWatcher&) = delete;

  // Until the watch is registered or ended, at most until `deadline`.
  void WaitEstablished(absl::Time deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, absl::ToChronoTime(deadline), [this] { return established_ || ended_; });
  }

  // Until an event came since the last call, the stream ended, or
  // `deadline`. True when an event came.
  bool WaitEvent(absl::Time deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, absl::ToChronoTime(deadline),
                   [this] { return events_ != consumed_ || ended_; });
    const bool got = events_ != consumed_;
    consumed_ = events_;
    return got;
  }

  bool ended() {
    std::lock_guard<std::mutex> lock(mu_);
    return ended_;
  }

 private:
  void Run(v1::TaskService::Stub* stub, const v1::WatchTasksRequest& req) {
    std::unique_ptr<grpc::ClientReader<v1::TaskEvent>> reader = stub->WatchTasks(&ctx_, req);
    reader->WaitForInitialMetadata();
    {
      std::lock_guard<std::mutex> lock(mu_);
      established_ = true;
    }
    cv_.notify_all();
    v1::TaskEvent ev;
    while (reader->Read(&ev)) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++events_;
      }
      cv_.notify_all();
    }
    (void)reader->Finish();  // the wait goes on by polling; GetJob reports errors
    {
      std::lock_guard<std::mutex> lock(mu_);
      ended_ = true;
    }
    cv_.notify_all();
  }

  grpc::ClientContext ctx_;  // no deadline: the watch lasts as long as the wait
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool established_ = false;  // guarded by mu_
  bool ended_ = false;        // guarded by mu_
  int64_t events_ = 0;        // guarded by mu_
  int64_t consumed_ = 0;      // guarded by mu_: events_ at the last WaitEvent
};

}  // namespace

int Client::SubmitAndWait(const v1::SubmitTasksRequest& req, absl::Duration wait_timeout) {
  v1::SubmitTasksResponse resp;
  if (!Call([&](grpc::ClientContext* ctx) { return stub_->SubmitTasks(ctx, req, &resp); },
            RepeatableSubmit(req))) {
    return kExitRpcFailed;
  }
  // The ids (generated ones too) first, so the user knows what is waited on.
  if (!opts_.json) std::cout << FormatSubmitted(resp) << std::flush;
  std::vector<v1::Task> tasks(resp.tasks().begin(), resp.tasks().end());
  const int rc = WaitAll(&tasks, wait_timeout, !opts_.json);
  if (rc == kExitRpcFailed) return rc;
  if (opts_.json) {
    v1::SubmitTasksResponse final;
    for (v1::Task& t : tasks) *final.add_tasks() = std::move(t);
    std::cout << ToJson(final);
  }
  return rc;
}

int Client::Wait(const std::vector<std::string>& ids, absl::Duration wait_timeout) {
  std::vector<v1::Task> tasks(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) tasks[i].mutable_spec()->set_id(ids[i]);
  const absl::Time deadline = wait_timeout == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                                                       : absl::Now() + wait_timeout;
  if (opts_.json) {
    // One WaitTaskResponse per task, one JSON document per line.
    bool failed = false;
    bool unfinished = false;
    for (const std::string& id : ids) {
      v1::WaitTaskResponse resp;
      if (!WaitOne(id, deadline, &resp)) return kExitRpcFailed;
      std::cout << ToJsonLine(resp) << std::flush;
      if (!resp.done()) {
        unfinished = true;
      } else if (resp.task().state() != v1::TASK_STATE_SUCCEEDED) {
        failed = true;
      }
    }
    return failed ? kExitTaskFailed : unfinished ? kExitWaitTimedOut : kExitOk;
  }
  return WaitAll(&tasks, wait_timeout, true);
}

int Client::WaitAll(std::vector<v1::Task>* tasks, absl::Duration wait_timeout, bool print_lines) {
  const absl::Time deadline = wait_timeout == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                                                       : absl::Now() + wait_timeout;
  bool failed = false;
  std::vector<std::string> unfinished;
  for (v1::Task& task : *tasks) {
    const std::string id = task.spec().id();
    v1::WaitTaskResponse resp;
    if (!WaitOne(id, deadline, &resp)) return kExitRpcFailed;
    task = resp.task();
    if (!resp.done()) {
      unfinished.push_back(absl::StrCat(id, " (", core::StateName(task.state()), ")"));
    } else if (task.state() != v1::TASK_STATE_SUCCEEDED) {
      failed = true;
    }
    if (print_lines) std::cout << FormatWaitLine(task, resp.done()) << "\n" << std::flush;
  }
  if (!unfinished.empty()) {
    std::cerr << "note: --wait_timeout=" << absl::FormatDuration(wait_timeout)
              << " passed; not finished: " << absl::StrJoin(unfinished, ", ") << "\n";
  }
  return failed ? kExitTaskFailed : !unfinished.empty() ? kExitWaitTimedOut : kExitOk;
}

bool Client::WaitOne(const std::string& id, absl::Time deadline, v1::WaitTaskResponse* out) {
  v1::WaitTaskRequest req;
  req.set_id(id);
  bool answered = false;  // the scheduler answered this wait before
  LostScheduler lost(opts_.timeout);
  while (true) {
    const absl::Time now = absl::Now();
    // Never zero: a zero timeout waits until the call's own deadline. The
    // first call only asks, so that a scheduler lost during the long wait
    // that follows is known to have been there (and is asked again).
    const absl::Duration chunk = answered
                                     ? std::clamp(deadline - now, absl::Milliseconds(1), kWaitChunk)
                                     : absl::Milliseconds(1);
    *req.mutable_timeout() = ToProto(chunk);
    grpc::ClientContext ctx;
    // The wait itself, plus --timeout for the call to come and go.
    ctx.set_deadline(absl::ToChronoTime(now + chunk + opts_.timeout));
    v1::WaitTaskResponse resp;
    grpc::Status s = Reach();
    if (s.ok()) s = stub_->WaitTask(&ctx, req, &resp);
    if (s.ok()) {
      *out = std::move(resp);
      answered = true;
      lost.Answered();
      Reached();
      if (out->done() || absl::Now() >= deadline) return true;
      continue;
    }
    if (NextScheduler(ctx, s)) continue;
    if (answered && lost.TryAgain(s, id, deadline)) continue;
    Report(s);
    return false;
  }
}

int Client::Watch(const WatchOptions& o) {
  InterruptCanceller interrupt;
  // The last revision printed, or where the user asked to start (unset:
  // from now on).
  std::optional<int64_t> after;
  if (o.request.has_after_revision()) after = o.request.after_revision();
  bool printed_any = false;
  int64_t printed = 0;
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    v1::WatchTasksRequest req = o.request;
    if (after.has_value()) {
      req.set_after_revision(*after);
    } else {
      req.clear_after_revision();
    }
    grpc::ClientContext ctx;  // no deadline: a watch lasts until it is ended
    interrupt.Set(&ctx);
    std::unique_ptr<grpc::ClientReader<v1::TaskEvent>> reader = stub_->WatchTasks(&ctx, req);
    // A watch from now on says where "now" was: a reconnect resumes there,
    // so what happens while the stream is down is neither lost nor (after a
    // scheduler restart) replayed from older history.
    reader->WaitForInitialMetadata();
    if (!after.has_value()) {
      after = RevisionIn(ctx.GetServerInitialMetadata(), kWatchStartsAfterKey);
    }
    v1::TaskEvent ev;
    bool stop = false;  // --count reached, or nobody reads stdout any more
    bool got_events = false;
    while (reader->Read(&ev)) {
      if (after.has_value() && ev.revision() <= *after) continue;  // printed before a reconnect
      if (opts_.json) {
        std::cout << ToJsonLine(ev);
      } else {
        std::cout << FormatEvent(ev) << "\n";
      }
      std::cout.flush();
      if (!std::cout) {
        stop = true;
        break;
      }
      after = ev.revision();
      printed_any = got_events = true;
      if (o.count > 0 && ++printed >= o.count) {
        stop = true;
        break;
      }
    }
    if (stop) ctx.TryCancel();
    const grpc::Status s = reader->Finish();
    interrupt.Set(nullptr);
    if (stop || interrupt.interrupted()) return kExitOk;

    const grpc::StatusCode code = s.error_code();
    // Nothing printed yet: the scheduler's word is all there is.
    if (const std::optional<int64_t> hint = ResumeAfter(ctx); hint.has_value() && !printed_any) {
      after = std::max(after.value_or(0), *hint);
    }
    const bool retryable = s.ok() || code == grpc::StatusCode::UNAVAILABLE ||
                           code == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                           code == grpc::StatusCode::CANCELLED || code == grpc::StatusCode::ABORTED;
    if (o.follow && retryable) {
      std::cerr << "note: the watch ended ("
                << (s.ok() ? std::string("closed by the scheduler")
                           : absl::StrCat(absl::StatusCodeToString(FromGrpcStatus(s).code()), ": ",
                                          s.error_message()))
                << "); reconnecting " << RevisionText(after) << "\n";
      if (got_events) backoff = absl::Milliseconds(100);
      if (!got_events && interrupt.SleepFor(backoff)) return kExitOk;
      backoff = std::min(backoff * 2, absl::Seconds(2));
      // A standby's answer names the leader; else the next address.
      NextScheduler(ctx, s);
      // Back when a channel connects again, within --timeout.
      const absl::Time give_up = absl::Now() + opts_.timeout;
      while (!channel_->WaitForConnected(
          absl::ToChronoTime(std::min(give_up, absl::Now() + absl::Milliseconds(200))))) {
        if (interrupt.interrupted()) return kExitOk;
        NextScheduler(grpc::ClientContext(), grpc::Status(grpc::StatusCode::UNAVAILABLE, ""));
        if (absl::Now() >= give_up) {
          std::cerr << "error: UNAVAILABLE: no scheduler at " << addresses_.text() << " for "
                    << absl::FormatDuration(opts_.timeout) << " (--timeout); resume with:\n  "
                    << WatchCommand(after, o.filter_flags) << " --follow\n";
          return kExitRpcFailed;
        }
      }
      continue;
    }

    if (s.ok()) {
      std::cerr << "error: the scheduler ended the watch; resume with:\n  "
                << WatchCommand(after, o.filter_flags) << "\n";
      return kExitRpcFailed;
    }
    Report(s);
    switch (code) {
      case grpc::StatusCode::RESOURCE_EXHAUSTED:
        std::cerr << "This watch fell too far behind the scheduler and was ended";
        if (printed_any) std::cerr << "; the last change printed was revision " << *after;
        std::cerr << ". Resume where it stopped with:\n  " << WatchCommand(after, o.filter_flags)
                  << "\n(watch --follow reconnects by itself.)\n";
        break;
      case grpc::StatusCode::OUT_OF_RANGE:
        if (const std::optional<int64_t> hint = ResumeAfter(ctx); hint.has_value()) {
          // Behind the asked-for revision: it was ahead of the newest
          // (another scheduler's, or a typo), and nothing was lost.
          const bool ahead = after.has_value() && *hint < *after;
          std::cerr << "The scheduler says to resume after revision " << *hint
                    << (ahead ? " (its newest change)" : " (what was pruned before it is lost)")
                    << ":\n  " << WatchCommand(hint, o.filter_flags) << "\n";
        }
        std::cerr << "Watch without --after for the changes from now on, or with --after=0 for "
                     "all the history the scheduler keeps (its --event_retention).\n";
        break;
      case grpc::StatusCode::UNAVAILABLE:
      case grpc::StatusCode::CANCELLED:
        if (printed_any) {
          std::cerr << "Resume with:\n  " << WatchCommand(after, o.filter_flags)
                    << "\n(watch --follow reconnects by itself.)\n";
        }
        break;
      default:
        break;
    }
    return kExitRpcFailed;
  }
}

int Client::SubmitJob(const v1::SubmitJobRequest& req, bool wait, absl::Duration wait_timeout) {
  v1::Job job;
  if (!Call([&](grpc::ClientContext* ctx) { return job_stub_->SubmitJob(ctx, req, &job); },
            RepeatableSubmit(req))) {
    return kExitRpcFailed;
  }
  if (!wait) {
    std::cout << (opts_.json ? ToJson(job) : FormatJobSummary(job) + "\n");
    return kExitOk;
  }
  // The id (a generated one too) first, so the user knows what is waited on.
  if (!opts_.json) std::cout << FormatJobSummary(job) << "\n" << std::flush;
  const absl::Time deadline = wait_timeout == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                                                       : absl::Now() + wait_timeout;
  const std::string id = job.id();
  if (!WaitJob(id, deadline, &job)) return kExitRpcFailed;
  std::cout << (opts_.json ? ToJson(job) : FormatJobSummary(job) + "\n");
  switch (job.state()) {
    case v1::JOB_STATE_SUCCEEDED:
      return kExitOk;
    case v1::JOB_STATE_FAILED:
    case v1::JOB_STATE_CANCELLED:
      return kExitTaskFailed;
    default:
      std::cout.flush();
      std::cerr << "note: --wait_timeout=" << absl::FormatDuration(wait_timeout) << " passed; job "
                << id << " is still " << core::JobStateName(job.state()) << "\n";
      return kExitWaitTimedOut;
  }
}

bool Client::GetJobPatiently(const std::string& id, absl::Time deadline, v1::Job* job) {
  v1::GetJobRequest req;
  req.set_id(id);
  LostScheduler lost(opts_.timeout);
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + opts_.timeout));
    grpc::Status s = Reach();
    if (s.ok()) s = job_stub_->GetJob(&ctx, req, job);
    if (s.ok()) {
      Reached();
      return true;
    }
    if (NextScheduler(ctx, s)) continue;
    // The scheduler answered the submit before, so it was there.
    if (lost.TryAgain(s, "job " + id, deadline)) continue;
    Report(s);
    return false;
  }
}

bool Client::WaitJob(const std::string& id, absl::Time deadline, v1::Job* job) {
  // The watch is registered before the first GetJob, so no task can end
  // unseen between the two: an end before it shows in GetJob, one after it
  // wakes the loop.
  auto watcher = std::make_unique<JobEndWatcher>(stub_, id);
  watcher->WaitEstablished(std::min(deadline, absl::Now() + opts_.timeout));
  absl::Duration poll = kJobPollMin;  // backoff while there is no watch
  while (true) {
    const absl::Time asked = absl::Now();
    if (!GetJobPatiently(id, deadline, job)) return false;
    if (job->state() != v1::JOB_STATE_RUNNING || absl::Now() >= deadline) return true;
    if (watcher->ended()) {
      // Lost (e.g. a scheduler restart): back off, then watch again.
      absl::SleepFor(std::min(poll, deadline - absl::Now()));
      poll = std::min(poll * 2, kJobPollMax);
      watcher = std::make_unique<JobEndWatcher>(stub_, id);
      watcher->WaitEstablished(std::min(deadline, absl::Now() + opts_.timeout));
      continue;
    }
    if (watcher->WaitEvent(std::min(deadline, absl::Now() + kJobSafetyPoll))) {
      poll = kJobPollMin;  // the watch works
      // A burst of tasks ending asks once per kJobMinPoll, not once each.
      const absl::Time next = std::min(asked + kJobMinPoll, deadline);
      if (next > absl::Now()) absl::SleepFor(next - absl::Now());
    }
  }
}

}  // namespace taskgrid::ctl
