#include "scheduler/leadership.h"

#include <spdlog/spdlog.h>

#include <string>
#include <thread>

#include "absl/strings/str_cat.h"

namespace taskgrid {

int LeadOrWait(store::PostgresLease* lease, store::PostgresStore* store, bool standby,
               const std::function<bool(const store::LeaseState&)>& waiting, StopSignal* stop,
               std::chrono::steady_clock::time_point* taken_at) {
  std::string said;
  bool reap_refused = false;
  for (;;) {
    *taken_at = std::chrono::steady_clock::now();
    absl::StatusOr<store::LeaseState> st = lease->TryAcquire();
    if (!st.ok()) {
      spdlog::error("{}", std::string(st.status().message()));
      return 1;
    }
    if (st->writers_ended > 0) {
      spdlog::warn(
          "ended {} database session(s) of an earlier leader's writer, left open mid-commit "
          "past its lease",
          st->writers_ended);
    }
    if (!st->reap_error.empty() && !reap_refused) {
      reap_refused = true;
      spdlog::warn(
          "{} (grant this scheduler's role pg_signal_backend, or run every scheduler as one "
          "role: until then a leader cut off mid-commit holds its locks until PostgreSQL ends "
          "its session)",
          st->reap_error);
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

void RenewLease(store::PostgresLease* lease, std::mutex* lease_mu, store::PostgresStore* store,
                absl::Duration ttl, std::chrono::steady_clock::time_point taken_at,
                StopSignal* stop) {
  using Steady = std::chrono::steady_clock;
  const auto every = absl::ToChronoMilliseconds(ttl / 3);
  const auto ttl_ms = absl::ToChronoMilliseconds(ttl);
  // Guarded by stop->mu: until when the lease surely holds, counted from
  // before the last renewal that succeeded was sent.
  Steady::time_point valid_until = taken_at + ttl_ms;
  bool renewing = true;  // guarded by stop->mu; false once this returns
  // The lease's own clock: whatever a renewal does (a database path that
  // takes the bytes and never answers blocks it with no error), the
  // leader stops serving before its lease may expire, a sixth of the TTL
  // early, so that no standby can lead while it still serves.
  const auto margin = absl::ToChronoMilliseconds(ttl / 6);
  std::thread deadline([&] {
    std::unique_lock<std::mutex> lock(stop->mu);
    for (;;) {
      const Steady::time_point due = valid_until - margin;
      if (stop->cv.wait_until(lock, due, [&] { return stop->stop || !renewing; })) return;
      if (Steady::now() < valid_until - margin) continue;  // renewed meanwhile
      lock.unlock();
      spdlog::critical(
          "the lease was not renewed in time (the database does not answer); stopping before it "
          "expires");
      stop->Fire(1);
      lease->Interrupt();  // a renewal blocked on the connection returns
      return;
    }
  });
  std::unique_lock<std::mutex> lock(stop->mu);
  while (!stop->cv.wait_for(lock, every, [stop] { return stop->stop; })) {
    lock.unlock();
    if (const absl::Duration waited = store->CommitInFlightFor(); waited > CommitLimit(ttl)) {
      // The writer's database path (or the server) never answers while the
      // lease's still does: stop, so a standby with a path that works leads.
      spdlog::critical(
          "a commit has waited {} for the database (the limit is twice --lease_ttl); stopping",
          absl::FormatDuration(absl::Trunc(waited, absl::Milliseconds(1))));
      stop->Fire(1);
      store->InterruptCommit();
      lock.lock();
      break;
    }
    const Steady::time_point sent = Steady::now();
    absl::Status s;
    {
      std::lock_guard<std::mutex> l(*lease_mu);
      s = lease->Renew();
    }
    lock.lock();
    if (s.ok()) {
      valid_until = sent + ttl_ms;
      stop->cv.notify_all();
      continue;
    }
    if (s.code() == absl::StatusCode::kFailedPrecondition) {
      lock.unlock();
      spdlog::critical("lost the lease: {}; stopping", std::string(s.message()));
      stop->Fire(1);
      lock.lock();
      break;
    }
    if (Steady::now() + every >= valid_until) {
      lock.unlock();
      spdlog::critical("cannot renew the lease before it expires: {}; stopping",
                       std::string(s.message()));
      stop->Fire(1);
      lock.lock();
      break;
    }
    spdlog::warn("renewing the lease: {}", std::string(s.message()));
  }
  renewing = false;
  stop->cv.notify_all();
  lock.unlock();
  deadline.join();
}

}  // namespace taskgrid
