#include "tools/bench/pipeline.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tools/bench/cluster.h"

namespace taskgrid::bench {

namespace {

constexpr absl::Duration kCallDeadline = absl::Seconds(30);

// Shared by the caller and the callbacks; kept alive by both.
class Pipeline : public std::enable_shared_from_this<Pipeline> {
 public:
  Pipeline(int64_t total, StartCallFn start) : total_(total), start_(std::move(start)) {
    contexts_.resize(static_cast<size_t>(total));
  }

  void Launch() {
    int64_t i = 0;
    grpc::ClientContext* ctx = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_ || next_ >= total_) return;
      i = next_++;
      contexts_[i] = std::make_unique<grpc::ClientContext>();
      ctx = contexts_[i].get();
      SetDeadline(ctx, kCallDeadline);
      ++outstanding_;
    }
    auto self = shared_from_this();
    start_(i, ctx, [self](const grpc::Status& s) { self->Done(s); });
  }

  // True when every call completed (or the first failure and every open
  // call ended) before `deadline`.
  bool WaitUntil(absl::Time deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, absl::ToChronoTime(deadline),
                          [this] { return completed_ == total_ || (stop_ && outstanding_ == 0); });
  }

  void CancelAll() {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    for (auto& c : contexts_) {
      if (c) c->TryCancel();
    }
  }

  grpc::Status first_error() {
    std::lock_guard<std::mutex> lock(mu_);
    return first_error_;
  }
  int64_t completed() {
    std::lock_guard<std::mutex> lock(mu_);
    return completed_;
  }

 private:
  void Done(const grpc::Status& s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      --outstanding_;
      ++completed_;
      if (!s.ok() && first_error_.ok()) {
        first_error_ = s;
        stop_ = true;
      }
      // Only when WaitUntil's condition may hold: a wake per call cost the
      // waiting thread a context switch per call, CPU the scheduler on the
      // same cores then lacked.
      if (completed_ == total_ || (stop_ && outstanding_ == 0)) cv_.notify_all();
    }
    Launch();
  }

  const int64_t total_;
  const StartCallFn start_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t next_ = 0;          // guarded by mu_
  int64_t completed_ = 0;     // guarded by mu_
  int64_t outstanding_ = 0;   // guarded by mu_
  bool stop_ = false;         // guarded by mu_
  grpc::Status first_error_;  // guarded by mu_
  // One per call started, kept until the Pipeline goes (so TryCancel never
  // touches a freed context); guarded by mu_.
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
};

}  // namespace

absl::Status RunPipelined(const std::string& what, int64_t total, int in_flight,
                          absl::Duration timeout, const StartCallFn& start) {
  if (total <= 0) return absl::OkStatus();
  auto p = std::make_shared<Pipeline>(total, start);
  for (int k = 0; k < in_flight && k < total; ++k) p->Launch();
  if (!p->WaitUntil(absl::Now() + timeout)) {
    p->CancelAll();
    const bool ended = p->WaitUntil(absl::Now() + absl::Seconds(10));
    return absl::DeadlineExceededError(absl::StrCat(
        what, ": only ", p->completed(), " of ", total, " calls completed within ",
        absl::FormatDuration(timeout), ended ? "" : " (and some did not end after cancel)"));
  }
  const grpc::Status err = p->first_error();
  if (!err.ok()) return RpcError(what, err);
  return absl::OkStatus();
}

absl::Status SubmitPipelined(v1::TaskService::Stub* stub, int64_t count, int batch, int in_flight,
                             absl::Duration timeout,
                             const std::function<v1::TaskSpec(int64_t)>& make) {
  const int64_t calls = (count + batch - 1) / batch;
  if (calls <= 0) return absl::OkStatus();
  const std::string what = absl::StrCat("SubmitTasks (", count, " tasks, ", batch, " per call)");
  // On a completion queue that this thread polls: each answer is read by
  // the thread that starts the next call. On the callback API every answer
  // went through gRPC's callback threads, a context switch or two per call
  // on the cores the scheduler shares.
  struct Call {
    grpc::ClientContext ctx;
    v1::SubmitTasksRequest req;
    v1::SubmitTasksResponse resp;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::SubmitTasksResponse>> reader;
  };
  grpc::CompletionQueue cq;
  std::set<Call*> open;
  int64_t next = 0, completed = 0;
  grpc::Status first_error;
  auto launch = [&] {
    auto* c = new Call;
    for (int64_t j = next * batch; j < count && j < (next + 1) * batch; ++j) {
      *c->req.add_tasks() = make(j);
    }
    ++next;
    SetDeadline(&c->ctx, kCallDeadline);
    c->reader = stub->AsyncSubmitTasks(&c->ctx, c->req, &cq);
    c->reader->Finish(&c->resp, &c->status, c);
    open.insert(c);
  };
  for (int k = 0; k < in_flight && next < calls; ++k) launch();
  const absl::Time deadline = absl::Now() + timeout;
  bool cancelled = false;
  while (!open.empty()) {
    void* tag = nullptr;
    bool ok = false;
    // Cancelled, each open call ends within its own deadline at the latest.
    const auto wait_until = absl::ToChronoTime(cancelled ? absl::InfiniteFuture() : deadline);
    const grpc::CompletionQueue::NextStatus r = cq.AsyncNext(&tag, &ok, wait_until);
    if (r == grpc::CompletionQueue::TIMEOUT) {
      for (Call* c : open) c->ctx.TryCancel();
      cancelled = true;
      continue;
    }
    if (r != grpc::CompletionQueue::GOT_EVENT) break;  // not shut down before the loop ends
    auto* c = static_cast<Call*>(tag);
    open.erase(c);
    ++completed;
    if (!c->status.ok() && first_error.ok()) first_error = c->status;
    delete c;
    if (first_error.ok() && !cancelled && next < calls) launch();
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) delete static_cast<Call*>(tag);
  if (cancelled) {
    return absl::DeadlineExceededError(absl::StrCat(what, ": only ", completed, " of ", calls,
                                                    " calls completed within ",
                                                    absl::FormatDuration(timeout)));
  }
  if (!first_error.ok()) return RpcError(what, first_error);
  return absl::OkStatus();
}

}  // namespace taskgrid::bench
