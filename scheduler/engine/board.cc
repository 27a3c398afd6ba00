// The Engine's side of BoardService: each call runs on the Scheduler under
// the Engine's mutex and is answered after its rows are committed, as the
// TaskService calls are. WaitForWork waiters are answered by the commit
// that makes work ready in their queue (CommitLocked), or by the ticker
// when their time is up.

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/proto_time.h"
#include "scheduler/core/state_machine.h"
#include "scheduler/core/validate.h"
#include "scheduler/engine/engine.h"

namespace taskgrid::engine {

void Engine::Claim(const v1::ClaimRequest& req, Reply<v1::ClaimResponse> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  absl::StatusOr<std::vector<v1::ClaimedTask>> claims = sched_.Claim(req);
  absl::StatusOr<v1::ClaimResponse> result;
  if (!claims.ok()) {
    result = claims.status();
  } else {
    v1::ClaimResponse resp;
    for (v1::ClaimedTask& c : *claims) *resp.add_claims() = std::move(c);
    result = std::move(resp);
  }
  Answer(std::move(result), std::move(done));
}

// Calls that name a task read it back from disk first, should it have
// finished and left memory (a completion repeated after its answer was
// lost is recognised by the task's history).

void Engine::ExtendClaim(const v1::ExtendClaimRequest& req, Reply<v1::ExtendClaimResponse> done) {
  WithTask(req.claim().task_id(), [&] {
    if (stopped_) return done(Stopped());
    absl::StatusOr<absl::Time> until = sched_.ExtendClaim(req.claim(), req.lease());
    absl::StatusOr<v1::ExtendClaimResponse> result;
    if (!until.ok()) {
      result = until.status();
    } else {
      v1::ExtendClaimResponse resp;
      SetTimestamp(*until, resp.mutable_expire_time());
      result = std::move(resp);
    }
    Answer(std::move(result), std::move(done));
  });
}

namespace {
// The API view of the task a board call left, into its response.
template <typename Response>
absl::StatusOr<Response> TaskReply(const core::Scheduler& sched,
                                   absl::StatusOr<const core::TaskRecord*> t) {
  if (!t.ok()) return t.status();
  Response resp;
  sched.Describe(**t, resp.mutable_task());
  return resp;
}
}  // namespace

void Engine::CompleteClaim(v1::CompleteClaimRequest req, Reply<v1::CompleteClaimResponse> done) {
  WithTask(req.claim().task_id(), [&] {
    if (stopped_) return done(Stopped());
    auto t = sched_.CompleteClaim(req.claim(), std::move(*req.mutable_result()));
    Answer(TaskReply<v1::CompleteClaimResponse>(sched_, t), std::move(done));
  });
}

void Engine::AbandonClaim(const v1::AbandonClaimRequest& req,
                          Reply<v1::AbandonClaimResponse> done) {
  WithTask(req.claim().task_id(), [&] {
    if (stopped_) return done(Stopped());
    auto t = sched_.AbandonClaim(req.claim(), req.reason());
    Answer(TaskReply<v1::AbandonClaimResponse>(sched_, t), std::move(done));
  });
}

void Engine::TrashClaim(const v1::TrashClaimRequest& req, Reply<v1::TrashClaimResponse> done) {
  WithTask(req.claim().task_id(), [&] {
    if (stopped_) return done(Stopped());
    auto t = sched_.TrashClaim(req.claim(), req.reason());
    Answer(TaskReply<v1::TrashClaimResponse>(sched_, t), std::move(done));
  });
}

void Engine::RestoreTask(const std::string& id, Reply<v1::Task> done) {
  TaskOp(&core::Scheduler::RestoreTask, id, std::move(done));
}

uint64_t Engine::WaitForWork(const v1::WaitForWorkRequest& req, absl::Duration max_wait,
                             Reply<v1::WaitForWorkResponse> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) {
    done(Stopped());
    return 0;
  }
  absl::StatusOr<v1::WaitForWorkResponse> result;
  const std::string queue = req.queue().empty() ? std::string(kDefaultQueue) : req.queue();
  if (absl::Status bad = core::ValidateWaitForWork(req); !bad.ok()) {
    result = bad;
  } else if (const int64_t ready = sched_.ClaimableCount(queue, req.labels());
             ready > 0 || max_wait <= absl::ZeroDuration()) {
    v1::WaitForWorkResponse resp;
    resp.set_ready(ready);
    result = std::move(resp);
  } else {
    absl::StatusOr<uint64_t> waiter =
        work_waiters_.Add(queue, clock_->Monotonic() + max_wait, done, req.labels());
    if (waiter.ok()) return *waiter;
    result = waiter.status();
  }
  Answer(std::move(result), std::move(done));
  return 0;
}

void Engine::CancelWorkWait(uint64_t waiter) {
  WorkWaiters::Waiter w;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!work_waiters_.Remove(waiter, &w)) return;  // answered already
  }
  w.done(absl::CancelledError("the caller went away"));
}

size_t Engine::waiting_for_work() {
  std::lock_guard<std::mutex> lock(mu_);
  return work_waiters_.size();
}

std::vector<std::pair<Engine::Reply<v1::WaitForWorkResponse>, v1::WaitForWorkResponse>>
Engine::WorkArrivedLocked(const std::vector<core::EventRow>& events) {
  std::vector<std::pair<Reply<v1::WaitForWorkResponse>, v1::WaitForWorkResponse>> out;
  if (work_waiters_.size() == 0) return out;
  // Each queue once, however many of its tasks became ready.
  absl::flat_hash_set<std::string> queues;
  for (const core::EventRow& e : events) {
    if (e.to_state == v1::TASK_STATE_PENDING && work_waiters_.HasKey(e.queue)) {
      queues.insert(e.queue);
    }
  }
  for (const std::string& queue : queues) {
    // Only the waiters that may claim something now: a worker whose labels
    // allow none of the ready tasks keeps waiting.
    auto can_claim = [&](const WorkWaiters::Waiter& x) {
      return sched_.ClaimableCount(x.key, x.extra) > 0;
    };
    for (WorkWaiters::Waiter& w : work_waiters_.TakeKeyIf(queue, can_claim)) {
      v1::WaitForWorkResponse resp;
      resp.set_ready(sched_.ClaimableCount(w.key, w.extra));
      out.emplace_back(std::move(w.done), std::move(resp));
    }
  }
  return out;
}

}  // namespace taskgrid::engine
