#include "scheduler/engine/engine.h"

#include <cstdio>
#include <cstdlib>
#include <future>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/ids.h"
#include "common/status_macros.h"
#include "scheduler/core/state_machine.h"
#include "scheduler/core/validate.h"
#include "scheduler/engine/bounded_queue.h"
#include "spdlog/spdlog.h"

namespace taskgrid::engine {

namespace {

// page_size (0: 100, at most 1000) and page_token (a submit seq) of a list
// request.
absl::Status ParsePage(int32_t page_size, const std::string& page_token, int* size,
                       int64_t* after_seq) {
  if (page_size < 0) return absl::InvalidArgumentError("page_size is negative");
  *size = page_size == 0 ? 100 : std::min(page_size, 1000);
  if (!page_token.empty() && (!absl::SimpleAtoi(page_token, after_seq) || *after_seq <= 0)) {
    return absl::InvalidArgumentError("page_token is malformed: pass a next_page_token as is");
  }
  return absl::OkStatus();
}
}  // namespace

template <typename Record, typename Proto, typename DescribeFn>
void Engine::TakeWithinBytes(const std::vector<const Record*>& records,
                             google::protobuf::RepeatedPtrField<Proto>* out,
                             int64_t* next_after_seq, const DescribeFn& describe) const {
  size_t bytes = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    Proto* p = out->Add();
    describe(records[i], p);
    const size_t size = p->ByteSizeLong() + 6;  // with its tag and length
    if (i > 0 && bytes + size > opts_.max_page_bytes) {
      out->RemoveLast();
      *next_after_seq = records[i - 1]->seq;
      return;
    }
    bytes += size;
  }
}

Engine::Engine(store::Store* store, const Clock* clock, EngineOptions opts)
    : clock_(clock),
      opts_(std::move(opts)),
      store_(store),
      sched_(clock, opts_.scheduler),
      writer_(store,
              [&] {
                store::GroupCommitWriter::Options w = opts_.writer;
                w.clock = clock;
                return w;
              }()),
      waiters_(opts_.max_waits, "WaitTask calls", "--max_waits"),
      work_waiters_(opts_.max_waits, "WaitForWork calls", "--max_waits"),
      output_([&] {
        // A follower may always hold a few attempts' stored tails.
        OutputRelay::Options o = opts_.output;
        o.max_pending_bytes = std::max(o.max_pending_bytes,
                                       4 * static_cast<size_t>(opts_.scheduler.max_output_bytes));
        return o;
      }()),
      waker_([this] { WakeLoop(); }) {}

Engine::~Engine() { Stop(); }

absl::Status Engine::Stopped() { return absl::UnavailableError("the scheduler is shutting down"); }

absl::Status Engine::Start() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = Restore(); !s.ok()) return s;
    started_ = true;
    // A watch "from now" starts after the newest revision read back, not
    // before the history that survived the restart.
    published_revision_.store(sched_.last_revision());
  }
  ticker_ = std::thread([this] { TickerLoop(); });
  return absl::OkStatus();
}

void Engine::Stop() {
  {
    std::lock_guard<std::mutex> lock(ticker_mu_);
    ticker_stop_ = true;
    ticker_cv_.notify_all();
  }
  if (ticker_.joinable()) ticker_.join();
  std::vector<TaskWaiters::Waiter> waiting;
  std::vector<WorkWaiters::Waiter> waiting_for_work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    waiting = waiters_.TakeAll();
    waiting_for_work = work_waiters_.TakeAll();
  }
  for (TaskWaiters::Waiter& w : waiting) w.done(Stopped());
  for (WorkWaiters::Waiter& w : waiting_for_work) w.done(Stopped());
  output_.FailAll(Stopped());
  writer_.Stop();
  // After the writer: its last commits may still wake watches.
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_stop_ = true;
    wake_cv_.notify_all();
  }
  if (waker_.joinable()) waker_.join();
}

void Engine::PostWake(std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(wake_mu_);
  if (wake_stop_) return;
  wakes_.push_back(std::move(wake));
  wake_cv_.notify_one();
}

void Engine::WakeLoop() {
  std::unique_lock<std::mutex> lock(wake_mu_);
  for (;;) {
    wake_cv_.wait(lock, [this] { return wake_stop_ || !wakes_.empty(); });
    if (wake_stop_) return;
    std::function<void()> wake = std::move(wakes_.front());
    wakes_.pop_front();
    lock.unlock();
    wake();
    lock.lock();
  }
}

// ---------------------------------------------------------------------------

void Engine::CheckInvariantsLocked() const {
  if (!opts_.check_invariants) return;
  if (absl::Status s = sched_.CheckInvariants(); !s.ok()) {
    // A bug, never bad input: stop where it happened.
    std::fprintf(stderr, "scheduler invariant broken: %s\n", s.ToString().c_str());
    std::abort();
  }
}

void Engine::CommitLocked(std::function<void(const absl::Status&)> after) {
  core::Effects fx = sched_.TakeEffects();
  for (const std::string& notice : fx.notices) spdlog::warn("{}", notice);
  if (!followed_.empty()) OutputEventsLocked(fx.batch.events);
  if (fx.batch.empty() && fx.messages.empty() && fx.close_conns.empty() && !after &&
      output_updates_.empty()) {
    return;
  }
  CheckInvariantsLocked();  // after every operation that changed something
  // Waiters of tasks that reached a terminal state are answered with the
  // same commit.
  std::vector<std::pair<Reply<v1::WaitTaskResponse>, v1::WaitTaskResponse>> resolved;
  for (const core::EventRow& e : fx.batch.events) {
    if (waiters_.size() == 0 || !core::IsTerminal(static_cast<v1::TaskState>(e.to_state))) {
      continue;
    }
    for (TaskWaiters::Waiter& w : waiters_.TakeKey(e.task_id)) {
      v1::WaitTaskResponse resp;
      sched_.Describe(*sched_.Find(e.task_id), resp.mutable_task());
      resp.set_done(true);
      resolved.emplace_back(std::move(w.done), std::move(resp));
    }
  }
  auto work = WorkArrivedLocked(fx.batch.events);
  const int64_t last = fx.batch.events.empty() ? 0 : fx.batch.events.back().revision;
  std::vector<core::EventRow> events;
  if (watch_count_.load() > 0) events = fx.batch.events;  // a watch starting later replays
  std::vector<OutputTaskState> outputs = std::move(output_updates_);
  output_updates_.clear();
  writer_.Submit(std::move(fx.batch),
                 [this, messages = std::move(fx.messages), closes = std::move(fx.close_conns),
                  after = std::move(after), resolved = std::move(resolved), work = std::move(work),
                  events = std::move(events), last,
                  outputs = std::move(outputs)](const absl::Status& s) mutable {
                   if (!s.ok()) {
                     std::call_once(fatal_once_, [&] {
                       if (on_fatal_) on_fatal_(s);
                     });
                   } else {
                     if (last > 0) published_revision_.store(last);
                     Publish(events, last);
                     // Before the messages: an attempt's Assign or Cancel
                     // never overtakes what its followers learn.
                     UpdateOutput(outputs);
                     Deliver(messages, closes);
                   }
                   for (auto& [done, resp] : resolved) {
                     if (s.ok()) {
                       done(std::move(resp));
                     } else {
                       done(s);
                     }
                   }
                   for (auto& [done, resp] : work) {
                     if (s.ok()) {
                       done(std::move(resp));
                     } else {
                       done(s);
                     }
                   }
                   if (after) after(s);
                 });
}

void Engine::Publish(const std::vector<core::EventRow>& events, int64_t last) {
  // `events` is empty when no watch existed as the commit was queued; a
  // watch started since then still learns that `last` has landed.
  if (last <= 0 || watch_count_.load() == 0) return;
  std::vector<v1::TaskEvent> converted;
  converted.reserve(events.size());
  for (const core::EventRow& e : events) converted.push_back(Watch::ToEvent({e.revision, e}));
  // Offered outside watches_mu_: starting or stopping a watch never waits
  // for a commit's delivery. Offer never blocks; wakes go to the wake
  // thread.
  std::vector<std::shared_ptr<Watch>> watches;
  {
    std::lock_guard<std::mutex> lock(watches_mu_);
    watches.assign(watches_.begin(), watches_.end());
  }
  for (const std::shared_ptr<Watch>& w : watches) w->Offer(converted, last);
}

void Engine::Deliver(std::vector<core::Outgoing>& messages, const std::vector<uint64_t>& closes) {
  if (messages.empty() && closes.empty()) return;
  std::lock_guard<std::mutex> lock(channels_mu_);
  for (core::Outgoing& out : messages) {
    auto it = channels_.find(out.conn);
    if (it != channels_.end()) it->second->Send(std::move(out.msg));
  }
  for (uint64_t conn : closes) {
    auto it = channels_.find(conn);
    if (it != channels_.end()) {
      it->second->Close(
          absl::UnavailableError("no message from this agent within heartbeat_timeout; reconnect"));
    }
  }
}

// ---------------------------------------------------------------------------
// TaskService.

void Engine::SubmitTasks(v1::SubmitTasksRequest req, Reply<v1::SubmitTasksResponse> done) {
  // Commits on this thread when nothing else is being written (see
  // CallerCommit): submitting one task at a time costs no hand-off.
  store::GroupCommitWriter::CallerCommit commit_here(&writer_);
  // Ids submitted again, dependencies and unique keys' holders that are on
  // disk come back first.
  WithWarm([&] { return sched_.ColdSeqsOfSpecs(req.tasks()); },
           [&] {
             if (stopped_) return done(Stopped());
             std::vector<v1::TaskSpec> specs(std::make_move_iterator(req.mutable_tasks()->begin()),
                                             std::make_move_iterator(req.mutable_tasks()->end()));
             auto tasks = sched_.Submit(std::move(specs));
             absl::StatusOr<v1::SubmitTasksResponse> result;
             if (!tasks.ok()) {
               result = tasks.status();
             } else {
               v1::SubmitTasksResponse resp;
               resp.mutable_tasks()->Reserve(static_cast<int>(tasks->size()));
               const std::vector<const core::AgentRecord*> agents = sched_.Agents();
               for (const core::TaskRecord* t : *tasks) {
                 sched_.Describe(*t, resp.add_tasks(), &agents);
               }
               result = std::move(resp);
             }
             Answer(std::move(result), std::move(done));
           });
}

void Engine::GetTask(const v1::GetTaskRequest& req, Reply<v1::Task> done) {
  int64_t on_disk = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return done(Stopped());
    absl::StatusOr<v1::Task> result;
    if (req.id().empty()) {
      result = absl::InvalidArgumentError("id is empty");
    } else if (const core::TaskRecord* t = sched_.Find(req.id())) {
      v1::Task task;
      sched_.Describe(*t, &task);
      result = std::move(task);
    } else if (const core::ColdTask* c = sched_.FindCold(req.id())) {
      on_disk = c->seq;
    } else {
      result = NotFound(req.id());
    }
    // Answered after the commits queued before it: never shows a state
    // that is not durable yet.
    if (on_disk == 0) return Answer(std::move(result), std::move(done));
  }
  // Finished and on disk: its row is as durable as it gets.
  absl::StatusOr<std::vector<std::optional<v1::Task>>> stored = DescribeStored({on_disk});
  if (!stored.ok()) return done(stored.status());
  if (!stored->front()) return done(NotFound(req.id()));  // deleted meanwhile
  done(std::move(*stored->front()));
}

void Engine::ListTasks(const v1::ListTasksRequest& req, Reply<v1::ListTasksResponse> done) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  core::ListFilter filter;
  filter.queue = req.queue();
  filter.job_id = req.job_id();
  filter.id_prefix = req.id_prefix();
  filter.newest_first = req.newest_first();
  absl::Status bad =
      ParsePage(req.page_size(), req.page_token(), &filter.page_size, &filter.after_seq);
  if (filter.id_prefix.size() > kMaxIdLength) {
    bad = absl::InvalidArgumentError(absl::StrCat("id_prefix is ", filter.id_prefix.size(),
                                                  " bytes; ids have at most ", kMaxIdLength));
  }
  for (int s : req.states()) {
    if (s <= v1::TASK_STATE_UNSPECIFIED || !v1::TaskState_IsValid(s)) {
      bad = absl::InvalidArgumentError(absl::StrCat("states has an unknown state ", s));
    }
    filter.states.push_back(static_cast<v1::TaskState>(s));
  }
  if (absl::Status s = core::CheckTaskLabels("labels", req.labels()); !s.ok()) bad = s;
  filter.labels.assign(req.labels().begin(), req.labels().end());
  if (!bad.ok()) return Answer(absl::StatusOr<v1::ListTasksResponse>(bad), std::move(done));
  core::ListPage page = sched_.List(filter);
  // The tasks in memory are described now; those on disk are read back
  // without the lock, then the page is put together in order.
  std::vector<std::optional<v1::Task>> described(page.tasks.size());
  std::vector<int64_t> on_disk;
  const std::vector<const core::AgentRecord*> agents = sched_.Agents();
  for (size_t i = 0; i < page.tasks.size(); ++i) {
    if (page.tasks[i] == nullptr) {
      on_disk.push_back(page.seqs[i]);
    } else {
      sched_.Describe(*page.tasks[i], &described[i].emplace(), &agents);
    }
  }
  if (!on_disk.empty()) {
    lock.unlock();
    absl::StatusOr<std::vector<std::optional<v1::Task>>> stored = DescribeStored(on_disk);
    if (!stored.ok()) return done(stored.status());
    // In order; those deleted meanwhile stay empty and are left out.
    size_t next = 0;
    for (size_t i = 0; i < page.tasks.size(); ++i) {
      if (page.tasks[i] == nullptr) described[i] = std::move((*stored)[next++]);
    }
    lock.lock();
    if (stopped_) return done(Stopped());
  }
  v1::ListTasksResponse resp;
  size_t bytes = 0;
  int64_t last_seq = 0;
  for (size_t i = 0; i < described.size(); ++i) {
    if (!described[i]) continue;
    const size_t size = described[i]->ByteSizeLong() + 6;  // with its tag and length
    if (resp.tasks_size() > 0 && bytes + size > opts_.max_page_bytes) {
      page.next_after_seq = last_seq;
      break;
    }
    bytes += size;
    last_seq = page.seqs[i];
    *resp.add_tasks() = std::move(*described[i]);
  }
  if (page.next_after_seq > 0) resp.set_next_page_token(absl::StrCat(page.next_after_seq));
  resp.set_total_size(page.total);
  Answer(absl::StatusOr<v1::ListTasksResponse>(std::move(resp)), std::move(done));
}

void Engine::TaskOp(
    absl::StatusOr<const core::TaskRecord*> (core::Scheduler::*op)(const std::string&),
    const std::string& id, Reply<v1::Task> done) {
  WithTask(id, [&] {
    if (stopped_) return done(Stopped());
    AnswerTask((sched_.*op)(id), std::move(done));
  });
}

void Engine::AnswerTask(absl::StatusOr<const core::TaskRecord*> t, Reply<v1::Task> done) {
  absl::StatusOr<v1::Task> result;
  if (!t.ok()) {
    result = t.status();
  } else {
    v1::Task task;
    sched_.Describe(**t, &task);
    result = std::move(task);
  }
  Answer(std::move(result), std::move(done));
}

void Engine::CancelTask(const std::string& id, Reply<v1::Task> done) {
  TaskOp(&core::Scheduler::Cancel, id, std::move(done));
}
void Engine::RetryTask(const std::string& id, Reply<v1::Task> done) {
  TaskOp(&core::Scheduler::Retry, id, std::move(done));
}
void Engine::ResetTask(const std::string& id, Reply<v1::Task> done) {
  TaskOp(&core::Scheduler::Reset, id, std::move(done));
}
void Engine::PauseTask(const std::string& id, Reply<v1::Task> done) {
  TaskOp(&core::Scheduler::Pause, id, std::move(done));
}
void Engine::ResumeTask(const std::string& id, Reply<v1::Task> done) {
  TaskOp(&core::Scheduler::Resume, id, std::move(done));
}

// ---------------------------------------------------------------------------
// JobService.

void Engine::SubmitJob(v1::SubmitJobRequest req, Reply<v1::Job> done) {
  store::GroupCommitWriter::CallerCommit commit_here(&writer_);  // as SubmitTasks
  auto needs = [&] {
    std::vector<int64_t> seqs = sched_.ColdSeqsOfSpecs(req.tasks());
    for (int64_t seq : sched_.ColdSeqsOfJob(req.job_id())) seqs.push_back(seq);
    return seqs;
  };
  WithWarm(needs, [&] {
    if (stopped_) return done(Stopped());
    std::vector<v1::TaskSpec> specs(std::make_move_iterator(req.mutable_tasks()->begin()),
                                    std::make_move_iterator(req.mutable_tasks()->end()));
    auto job = sched_.SubmitJob(req.job_id(), std::move(specs));
    absl::StatusOr<v1::Job> result;
    if (!job.ok()) {
      result = job.status();
    } else {
      v1::Job out;
      sched_.DescribeJob(**job, &out);
      result = std::move(out);
    }
    Answer(std::move(result), std::move(done));
  });
}

void Engine::JobOp(
    absl::StatusOr<const core::JobRecord*> (core::Scheduler::*op)(const std::string&),
    const std::string& id, Reply<v1::Job> done) {
  // A job on disk has only finished tasks: a retry reads them back.
  WithWarm([&] { return sched_.ColdSeqsOfJob(id); },
           [&] {
             if (stopped_) return done(Stopped());
             auto j = (sched_.*op)(id);
             absl::StatusOr<v1::Job> result;
             if (!j.ok()) {
               result = j.status();
             } else {
               v1::Job job;
               sched_.DescribeJob(**j, &job);
               result = std::move(job);
             }
             Answer(std::move(result), std::move(done));
           });
}

void Engine::GetJob(const std::string& id, Reply<v1::Job> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  absl::StatusOr<v1::Job> result;
  if (id.empty()) {
    result = absl::InvalidArgumentError("id is empty");
  } else if (const core::JobRecord* j = sched_.FindJob(id)) {
    v1::Job job;
    sched_.DescribeJob(*j, &job);
    result = std::move(job);
  } else {
    result = absl::NotFoundError(absl::StrCat("job \"", id, "\" does not exist"));
  }
  Answer(std::move(result), std::move(done));
}

void Engine::ListJobs(const v1::ListJobsRequest& req, Reply<v1::ListJobsResponse> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  core::JobListFilter filter;
  absl::Status bad =
      ParsePage(req.page_size(), req.page_token(), &filter.page_size, &filter.after_seq);
  for (int s : req.states()) {
    if (s <= v1::JOB_STATE_UNSPECIFIED || !v1::JobState_IsValid(s)) {
      bad = absl::InvalidArgumentError(absl::StrCat("states has an unknown job state ", s));
    }
    filter.states.push_back(static_cast<v1::JobState>(s));
  }
  absl::StatusOr<v1::ListJobsResponse> result;
  if (!bad.ok()) {
    result = bad;
  } else {
    core::JobListPage page = sched_.ListJobs(filter);
    v1::ListJobsResponse resp;
    TakeWithinBytes(page.jobs, resp.mutable_jobs(), &page.next_after_seq,
                    [&](const core::JobRecord* j, v1::Job* out) { sched_.DescribeJob(*j, out); });
    if (page.next_after_seq > 0) resp.set_next_page_token(absl::StrCat(page.next_after_seq));
    result = std::move(resp);
  }
  Answer(std::move(result), std::move(done));
}

void Engine::CancelJob(const std::string& id, Reply<v1::Job> done) {
  JobOp(&core::Scheduler::CancelJob, id, std::move(done));
}
void Engine::RetryJob(const std::string& id, Reply<v1::Job> done) {
  JobOp(&core::Scheduler::RetryJob, id, std::move(done));
}

void Engine::DeleteByMergeKey(const v1::DeleteByMergeKeyRequest& req, Reply<v1::Task> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  AnswerTask(sched_.DeleteByMergeKey(req.queue(), req.merge_key()), std::move(done));
}

void Engine::GetQueueStats(const v1::GetQueueStatsRequest& req,
                           Reply<v1::GetQueueStatsResponse> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  v1::GetQueueStatsResponse resp;
  for (v1::QueueStats& qs : sched_.Stats(req.queue())) {
    if (req.with_history()) sched_.AddHistory(&qs);
    *resp.add_queues() = std::move(qs);
  }
  Answer(absl::StatusOr<v1::GetQueueStatsResponse>(std::move(resp)), std::move(done));
}

uint64_t Engine::WaitTask(const std::string& id, absl::Duration max_wait,
                          Reply<v1::WaitTaskResponse> done) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stopped_) {
    done(Stopped());
    return 0;
  }
  absl::StatusOr<v1::WaitTaskResponse> result;
  const core::TaskRecord* t = id.empty() ? nullptr : sched_.Find(id);
  if (id.empty()) {
    result = absl::InvalidArgumentError("id is empty");
  } else if (const core::ColdTask* c = t == nullptr ? sched_.FindCold(id) : nullptr) {
    // Finished and on disk: the answer is its stored row.
    const int64_t seq = c->seq;
    lock.unlock();
    absl::StatusOr<std::vector<std::optional<v1::Task>>> stored = DescribeStored({seq});
    if (!stored.ok()) {
      done(stored.status());
    } else if (!stored->front()) {
      done(NotFound(id));
    } else {
      v1::WaitTaskResponse resp;
      *resp.mutable_task() = std::move(*stored->front());
      resp.set_done(true);
      done(std::move(resp));
    }
    return 0;
  } else if (t == nullptr) {
    result = NotFound(id);
  } else if (core::IsTerminal(t->state) || max_wait <= absl::ZeroDuration()) {
    v1::WaitTaskResponse resp;
    sched_.Describe(*t, resp.mutable_task());
    resp.set_done(core::IsTerminal(t->state));
    result = std::move(resp);
  } else {
    // `done` is kept for an error reply: Add moves it only on success.
    absl::StatusOr<uint64_t> waiter = waiters_.Add(id, clock_->Monotonic() + max_wait, done);
    if (waiter.ok()) return *waiter;
    result = waiter.status();
  }
  Answer(std::move(result), std::move(done));
  return 0;
}

void Engine::CancelWait(uint64_t waiter) {
  TaskWaiters::Waiter w;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!waiters_.Remove(waiter, &w)) return;  // answered already
  }
  w.done(absl::CancelledError("the caller went away"));
}

EngineMetrics Engine::Metrics() {
  EngineMetrics m;
  {
    std::lock_guard<std::mutex> lock(mu_);
    m.scheduler = sched_.Metrics();
    m.task_waits = static_cast<int64_t>(waiters_.size());
    m.work_waits = static_cast<int64_t>(work_waiters_.size());
  }
  m.writer = writer_.stats();
  m.watches = watch_count_.load();
  m.output_follows = static_cast<int64_t>(output_.followers());
  return m;
}

size_t Engine::waiting() {
  std::lock_guard<std::mutex> lock(mu_);
  return waiters_.size();
}

absl::StatusOr<std::shared_ptr<Watch>> Engine::StartWatch(const v1::WatchTasksRequest& req,
                                                          std::function<void()> wake) {
  for (int s : req.states()) {
    if (s <= v1::TASK_STATE_UNSPECIFIED || !v1::TaskState_IsValid(s)) {
      return absl::InvalidArgumentError(absl::StrCat("states has an unknown state ", s));
    }
  }
  if (req.after_revision() < 0) return absl::InvalidArgumentError("after_revision is negative");
  // Counted first: every commit queued from now on keeps its events for
  // the watches, and every one queued before has a revision <= newest,
  // which the watch replays from the store (waiting for it to land).
  if (static_cast<size_t>(watch_count_.fetch_add(1)) >= opts_.max_watches) {
    watch_count_.fetch_sub(1);
    return absl::ResourceExhaustedError(
        absl::StrCat("too many WatchTasks streams open (--max_watches=", opts_.max_watches,
                     "); try again later"));
  }
  int64_t oldest, newest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    oldest = sched_.oldest_revision();
    newest = sched_.last_revision();
    if (stopped_) {
      watch_count_.fetch_sub(1);
      return Stopped();
    }
  }
  int64_t after = req.after_revision();
  if (!req.has_after_revision()) {
    after = published_revision_.load();
  } else if (after + 1 < oldest) {
    watch_count_.fetch_sub(1);
    return WithResumeAfter(
        absl::OutOfRangeError(
            absl::StrCat("revision ", after, " is older than the kept history, which starts at ",
                         oldest, "; watch from now (leave after_revision unset)")),
        oldest - 1);
  } else if (after > newest) {
    watch_count_.fetch_sub(1);
    return WithResumeAfter(absl::OutOfRangeError(absl::StrCat("revision ", after,
                                                              " is ahead of the newest, ", newest)),
                           newest);
  }
  auto watch = std::make_shared<Watch>(
      req, after, store_, opts_.watch_queue, [this, wake = std::move(wake)] { PostWake(wake); },
      newest);
  std::lock_guard<std::mutex> lock(watches_mu_);
  watches_.insert(watch);
  return watch;
}

void Engine::StopWatch(const std::shared_ptr<Watch>& watch) {
  watch->Close();
  std::lock_guard<std::mutex> lock(watches_mu_);
  if (watches_.erase(watch) > 0) watch_count_.fetch_sub(1);
}

// ---------------------------------------------------------------------------
// ClusterService.

void Engine::ListAgents(Reply<v1::ListAgentsResponse> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  v1::ListAgentsResponse resp;
  for (const core::AgentRecord* a : sched_.Agents()) sched_.DescribeAgent(*a, resp.add_agents());
  Answer(absl::StatusOr<v1::ListAgentsResponse>(std::move(resp)), std::move(done));
}

void Engine::DrainAgent(const std::string& id, Reply<v1::Agent> done) {
  AgentOp(&core::Scheduler::Drain, id, std::move(done));
}

void Engine::UndrainAgent(const std::string& id, Reply<v1::Agent> done) {
  AgentOp(&core::Scheduler::Undrain, id, std::move(done));
}

void Engine::AgentOp(
    absl::StatusOr<const core::AgentRecord*> (core::Scheduler::*op)(const std::string&),
    const std::string& id, Reply<v1::Agent> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  auto a = (sched_.*op)(id);
  absl::StatusOr<v1::Agent> result;
  if (!a.ok()) {
    result = a.status();
  } else {
    v1::Agent view;
    sched_.DescribeAgent(**a, &view);
    result = std::move(view);
  }
  Answer(std::move(result), std::move(done));
}

void Engine::GetClusterStats(Reply<v1::ClusterStats> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  Answer(absl::StatusOr<v1::ClusterStats>(sched_.ClusterStats()), std::move(done));
}

// ---------------------------------------------------------------------------
// Agents.

void Engine::EndCalls(const absl::Status& why) {
  std::vector<TaskWaiters::Waiter> waiting;
  std::vector<WorkWaiters::Waiter> waiting_for_work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiting = waiters_.TakeAll();
    waiting_for_work = work_waiters_.TakeAll();
  }
  for (TaskWaiters::Waiter& w : waiting) w.done(why);
  for (WorkWaiters::Waiter& w : waiting_for_work) w.done(why);
  output_.FailAll(why);
  std::lock_guard<std::mutex> lock(channels_mu_);
  for (auto& [conn, channel] : channels_) channel->Close(why);
}

uint64_t Engine::AttachAgent(std::shared_ptr<AgentChannel> channel) {
  uint64_t conn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    conn = next_conn_++;
  }
  std::lock_guard<std::mutex> lock(channels_mu_);
  channels_[conn] = std::move(channel);
  return conn;
}

absl::Status Engine::AgentHello(uint64_t conn, const v1::Hello& hello) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return Stopped();
  absl::Status s = sched_.Connect(conn, hello);
  // Followers of what it runs ask again on this stream.
  if (s.ok() && !followed_.empty()) QueueOutputStatesLocked(FollowedOnConnLocked(conn));
  CommitLocked(nullptr);
  return s;
}

void Engine::AgentMessage(uint64_t conn, const v1::AgentMessage& msg) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stopped_) return;
  // Live output, fenced by the Scheduler, goes to its followers at once:
  // it is not stored, so it waits for no commit.
  std::vector<v1::TaskOutput> output;
  sched_.OnAgentMessage(conn, msg, &output);
  if (msg.has_heartbeat() && sched_.pending_effects().batch.empty() &&
      sched_.pending_effects().close_conns.empty()) {
    // A heartbeat changes nothing stored and its ack says nothing about
    // stored state, so the ack need not wait behind the commits queued
    // before it: answered here, without two thread hand-offs per agent per
    // second.
    CheckInvariantsLocked();
    core::Effects fx = sched_.TakeEffects();
    lock.unlock();
    Deliver(fx.messages, fx.close_conns);
    return;
  }
  CommitLocked(nullptr);
  lock.unlock();
  for (const v1::TaskOutput& o : output) output_.Offer(conn, o);
}

absl::Duration Engine::heartbeat_interval() {
  std::lock_guard<std::mutex> lock(mu_);
  return sched_.heartbeat_interval();
}

void Engine::DetachAgent(uint64_t conn) {
  {
    std::lock_guard<std::mutex> lock(channels_mu_);
    channels_.erase(conn);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return;
  const std::vector<std::string> followed =
      followed_.empty() ? std::vector<std::string>() : FollowedOnConnLocked(conn);
  sched_.Disconnect(conn);
  // Their followers learn that no output comes on that stream any more.
  QueueOutputStatesLocked(followed);
  CommitLocked(nullptr);
}

// ---------------------------------------------------------------------------

void Engine::TickerLoop() {
  std::unique_lock<std::mutex> lock(ticker_mu_);
  while (!ticker_cv_.wait_for(lock, absl::ToChronoNanoseconds(opts_.tick_interval),
                              [this] { return ticker_stop_; })) {
    lock.unlock();
    TickNow();
    lock.lock();
  }
}

void Engine::TickNow() {
  std::unique_lock<std::mutex> lock(mu_);
  if (stopped_ || !started_) return;
  sched_.Tick();
  // Waits that ran out: answer with the task as it is. Only the due ones
  // are looked at.
  for (TaskWaiters::Waiter& w : waiters_.TakeExpired(clock_->Monotonic())) {
    v1::WaitTaskResponse resp;
    sched_.Describe(*sched_.Find(w.key), resp.mutable_task());
    resp.set_done(false);
    Answer(absl::StatusOr<v1::WaitTaskResponse>(std::move(resp)), std::move(w.done));
  }
  for (WorkWaiters::Waiter& w : work_waiters_.TakeExpired(clock_->Monotonic())) {
    v1::WaitForWorkResponse resp;
    resp.set_ready(sched_.ClaimableCount(w.key, w.extra));
    Answer(absl::StatusOr<v1::WaitForWorkResponse>(std::move(resp)), std::move(w.done));
  }
  WakeControlledLocked();
  std::vector<int64_t> wanted = ColdWorkLocked();
  CommitLocked(nullptr);
  const bool trim = TrimDueLocked();
  lock.unlock();
  if (trim) TrimMemory();
  if (wanted.empty()) return;
  // A schedule's fire waits for these (its dependencies, its unique key's
  // holder): read back now, it fires on the next tick.
  WithWarm([&] { return std::exchange(wanted, {}); }, [] {});
}

void Engine::Sync() {
  std::promise<void> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CommitLocked([&done](const absl::Status&) { done.set_value(); });
  }
  done.get_future().wait();
}

void Engine::Inspect(const std::function<void(const core::Scheduler&)>& f) {
  std::lock_guard<std::mutex> lock(mu_);
  f(sched_);
}

}  // namespace taskgrid::engine
