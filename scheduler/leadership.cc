#include "scheduler/leadership.h"

#include <spdlog/spdlog.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace taskgrid {

int LeadOrWait(store::PostgresLease* lease, store::PostgresStore* store, bool standby,
               const std::function<bool(const store::LeaseState&)>& waiting, StopSignal* stop,
               std::chrono::steady_clock::time_point* taken_at) {
  std::string said;
  for (;;) {
    *taken_at = std::chrono::steady_clock::now();
    absl::StatusOr<store::LeaseState> st = lease->TryAcquire();
    if (!st.ok()) {
      spdlog::error("{}", std::string(st.status().message()));
      return 1;
    }
    if (st->ours) break;
    if (!st->holder.empty() && said != st->holder) {
      said = st->holder;
      const std::string where = absl::StrCat(store->display_name(), " schema ", store->schema());
      if (!standby) {
        spdlog::error("{} is led by {} at {} (lease epoch {}); --standby=false: not waiting", where,
                      st->holder, st->address.empty() ? "(starting)" : st->address, st->epoch);
        return 1;
      }
      spdlog::info(
          "standby: {} is led by {} at {} (lease epoch {}, {} left); taking over if it "
          "expires",
          where, st->holder, st->address.empty() ? "(starting)" : st->address, st->epoch,
          absl::FormatDuration(absl::Trunc(st->remaining, absl::Milliseconds(1))));
    }
    if (standby && !waiting(*st)) return 1;
    std::unique_lock<std::mutex> lock(stop->mu);
    if (stop->cv.wait_for(lock, std::chrono::seconds(1), [stop] { return stop->stop; })) {
      return stop->exit_code;
    }
  }
  store->SetFence(lease->epoch());
  spdlog::info("leading {} schema {} (lease epoch {})", store->display_name(), store->schema(),
               lease->epoch());
  return -1;
}

void RenewLease(store::PostgresLease* lease, std::mutex* lease_mu, absl::Duration ttl,
                std::chrono::steady_clock::time_point taken_at, StopSignal* stop) {
  using Steady = std::chrono::steady_clock;
  const auto every = absl::ToChronoMilliseconds(ttl / 3);
  const auto ttl_ms = absl::ToChronoMilliseconds(ttl);
  Steady::time_point valid_until = taken_at + ttl_ms;
  std::unique_lock<std::mutex> lock(stop->mu);
  while (!stop->cv.wait_for(lock, every, [stop] { return stop->stop; })) {
    lock.unlock();
    const Steady::time_point sent = Steady::now();
    absl::Status s;
    {
      std::lock_guard<std::mutex> l(*lease_mu);
      s = lease->Renew();
    }
    lock.lock();
    if (s.ok()) {
      valid_until = sent + ttl_ms;
      continue;
    }
    if (s.code() == absl::StatusCode::kFailedPrecondition) {
      lock.unlock();
      spdlog::critical("lost the lease: {}; stopping", std::string(s.message()));
      stop->Fire(1);
      return;
    }
    if (Steady::now() + every >= valid_until) {
      lock.unlock();
      spdlog::critical("cannot renew the lease before it expires: {}; stopping",
                       std::string(s.message()));
      stop->Fire(1);
      return;
    }
    spdlog::warn("renewing the lease: {}", std::string(s.message()));
  }
}

}  // namespace taskgrid
