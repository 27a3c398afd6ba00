// W8: delivery by merge key. Submits of single tasks, 64 in flight, each
// with one of w8_keys merge keys and a fire time an hour ahead, so every
// submit after the first of a key joins that key's task: merge submits per
// second, and a check that the queue ends with one task per key holding
// every payload.

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "common/proto_time.h"
#include "tools/bench/child_process.h"
#include "tools/bench/pipeline.h"
#include "tools/bench/workload_util.h"

namespace taskgrid::bench {

absl::Status RunW8MergeKeys(const RunContext& ctx, std::vector<Figure>* out) {
  auto cluster = StartCluster(ctx, "w8");
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  const Sizes& z = ctx.sizes;
  const std::string queue = Queue(ctx, "w8");
  const absl::Time fire = absl::Now() + absl::Hours(1);
  constexpr int kInFlight = 64;
  const absl::Duration t0 = MonoNow();
  absl::Status s = SubmitPipelined(c.tasks(), z.w8_submits, 1, kInFlight,
                                   Budget(absl::Seconds(60), z.w8_submits, absl::Milliseconds(5)),
                                   [&](int64_t i) {
                                     v1::TaskSpec t = NoopTask("", queue, z.payload_bytes);
                                     t.set_merge_key(absl::StrCat("key-", i % z.w8_keys));
                                     *t.mutable_not_before() = ToProto(fire);
                                     return t;
                                   });
  const double secs = Seconds(MonoNow() - t0);
  if (!s.ok()) return s;
  auto tasks = c.ListAll(queue, {});
  if (!tasks.ok()) return tasks.status();
  int64_t payloads = 0;
  for (const v1::Task& t : *tasks) payloads += t.merged().payloads_size();
  if (static_cast<int64_t>(tasks->size()) != z.w8_keys || payloads != z.w8_submits) {
    return absl::InternalError(absl::StrCat("W8: ", tasks->size(), " tasks holding ", payloads,
                                            " payloads; expected ", z.w8_keys, " holding ",
                                            z.w8_submits));
  }
  const double rate = static_cast<double>(z.w8_submits) / secs;
  const auto settings = With(c.BaseSettings(), {I("keys", z.w8_keys), I("in_flight", kInFlight),
                                                I("payload_bytes", z.payload_bytes)});
  out->push_back({"W8", "merge_submit_rate", rate, "submits/s", z.w8_submits, settings});
  spdlog::info("W8: {} submits into {} merge keys in {:.2f} s ({:.0f}/s); {} tasks hold them all",
               z.w8_submits, z.w8_keys, secs, rate, tasks->size());
  return absl::OkStatus();
}

}  // namespace taskgrid::bench
