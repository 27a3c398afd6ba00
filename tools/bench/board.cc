// W7: pull mode under contention. A queue of noop tasks, emptied by
// w7_claimers threads that each Claim one task and complete it at once,
// all racing for the head of the same queue: claims completed per second,
// the latency of a Claim, and (must be 0) tasks handed out twice.

#include <spdlog/spdlog.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/proto_time.h"
#include "tools/bench/child_process.h"
#include "tools/bench/workload_util.h"

namespace taskgrid::bench {

absl::Status RunW7Claims(const RunContext& ctx, std::vector<Figure>* out) {
  auto cluster = StartCluster(ctx, "w7");
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  const Sizes& z = ctx.sizes;
  const std::string queue = Queue(ctx, "w7");
  if (absl::Status s = FillQueue(c, ctx, queue, "w7", z.w7_tasks, 0); !s.ok()) return s;

  std::mutex mu;
  absl::flat_hash_set<std::string> seen;  // guarded by mu
  std::vector<double> claim_ms;           // guarded by mu
  int64_t doubles = 0;                    // guarded by mu
  absl::Status failed;                    // guarded by mu
  std::atomic<int64_t> completed{0};
  const absl::Time give_up =
      absl::Now() + Budget(absl::Seconds(60), z.w7_tasks, absl::Milliseconds(5));
  const absl::Duration t0 = MonoNow();
  std::vector<std::thread> claimers;
  for (int w = 0; w < z.w7_claimers; ++w) {
    claimers.emplace_back([&, w] {
      const std::string owner = absl::StrCat("w7-claimer-", w);
      std::vector<double> mine;
      while (completed.load() < z.w7_tasks && absl::Now() < give_up) {
        v1::ClaimRequest req;
        req.set_queue(queue);
        req.set_owner(owner);
        v1::ClaimResponse resp;
        grpc::ClientContext rpc;
        SetDeadline(&rpc, kRpcDeadline);
        const absl::Duration start = MonoNow();
        const grpc::Status s = c.board()->Claim(&rpc, req, &resp);
        mine.push_back(absl::ToDoubleMilliseconds(MonoNow() - start));
        if (!s.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          failed = RpcError("Claim", s);
          return;
        }
        if (resp.claims().empty()) break;  // the queue is empty
        for (const v1::ClaimedTask& claim : resp.claims()) {
          {
            std::lock_guard<std::mutex> lock(mu);
            if (!seen.insert(claim.assignment().task_id()).second) ++doubles;
          }
          v1::CompleteClaimRequest done;
          done.mutable_claim()->set_task_id(claim.assignment().task_id());
          done.mutable_claim()->set_attempt(claim.assignment().attempt());
          done.mutable_claim()->set_owner(owner);
          done.mutable_result()->set_outcome(v1::OUTCOME_SUCCEEDED);
          v1::CompleteClaimResponse ignored;
          grpc::ClientContext rpc2;
          SetDeadline(&rpc2, kRpcDeadline);
          const grpc::Status d = c.board()->CompleteClaim(&rpc2, done, &ignored);
          if (!d.ok()) {
            std::lock_guard<std::mutex> lock(mu);
            failed = RpcError("CompleteClaim", d);
            return;
          }
          ++completed;
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      claim_ms.insert(claim_ms.end(), mine.begin(), mine.end());
    });
  }
  for (std::thread& t : claimers) t.join();
  const double secs = Seconds(MonoNow() - t0);
  if (!failed.ok()) return failed;
  if (completed.load() != z.w7_tasks) {
    return absl::InternalError(absl::StrCat("W7: completed ", completed.load(), " of ", z.w7_tasks,
                                            " claims before the time ran out"));
  }
  const auto settings = With(c.BaseSettings(), {I("claimers", z.w7_claimers), I("max", 1),
                                                I("payload_bytes", z.payload_bytes)});
  const double rate = static_cast<double>(z.w7_tasks) / secs;
  const int64_t n = static_cast<int64_t>(claim_ms.size());
  out->push_back({"W7", "claim_complete_rate", rate, "tasks/s", z.w7_tasks, settings});
  out->push_back({"W7", "claim_p50", Percentile(claim_ms, 50), "ms", n, settings});
  out->push_back({"W7", "claim_p99", Percentile(claim_ms, 99), "ms", n, settings});
  out->push_back(
      {"W7", "double_claims", static_cast<double>(doubles), "tasks", z.w7_tasks, settings});
  spdlog::info(
      "W7: {} claimers claimed and completed {} tasks in {:.2f} s ({:.0f}/s); claim p50 "
      "{:.3f} ms, p99 {:.3f} ms; {} handed out twice",
      z.w7_claimers, z.w7_tasks, secs, rate, Percentile(claim_ms, 50), Percentile(claim_ms, 99),
      doubles);
  return absl::OkStatus();
}

}  // namespace taskgrid::bench
