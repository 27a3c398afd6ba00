#include "tools/bench/pipeline.h"

#include <condition_variable>
#include <memory>
#include <mutex>
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
      cv_.notify_all();
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
  return RunPipelined(absl::StrCat("SubmitTasks (", count, " tasks, ", batch, " per call)"), calls,
                      in_flight, timeout,
                      [stub, count, batch, make](int64_t i, grpc::ClientContext* ctx,
                                                 std::function<void(const grpc::Status&)> done) {
                        auto req = std::make_shared<v1::SubmitTasksRequest>();
                        for (int64_t j = i * batch; j < count && j < (i + 1) * batch; ++j) {
                          *req->add_tasks() = make(j);
                        }
                        auto resp = std::make_shared<v1::SubmitTasksResponse>();
                        stub->async()->SubmitTasks(ctx, req.get(), resp.get(),
                                                   [req, resp, done](grpc::Status s) { done(s); });
                      });
}

}  // namespace taskgrid::bench
