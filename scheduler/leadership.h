// How taskgrid-scheduler leads a PostgreSQL schema, or waits as a standby:
// the stop signal every part of main() waits on, taking the lease (or
// waiting for it, answering callers meanwhile with the leader's address),
// and renewing it while leading.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>

#include "absl/time/time.h"
#include "scheduler/store/postgres_lease.h"
#include "scheduler/store/postgres_store.h"

namespace taskgrid {

// Fired once, by a signal, a fatal error or a lost lease; the first code
// given is the exit code.
struct StopSignal {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  int exit_code = 0;
  void Fire(int code) {
    std::lock_guard<std::mutex> lock(mu);
    if (!stop) exit_code = code;
    stop = true;
    cv.notify_all();
  }
};

// Takes the lease, or waits as a standby until it can (saying once who
// leads), and fences the store with it. -1 once this scheduler leads,
// else the exit code (a stop signal, an error, or a leader present with
// `standby` false).
// `waiting`: called with the lease's state on every poll that finds
// another leader (before the wait); false ends the wait with exit code 1.
// `*taken_at`: when the taking statement was sent (the lease lasts at
// least its TTL from then).
int LeadOrWait(store::PostgresLease* lease, store::PostgresStore* store, bool standby,
               const std::function<bool(const store::LeaseState&)>& waiting, StopSignal* stop,
               std::chrono::steady_clock::time_point* taken_at);

// How long the leader lets one commit wait for the database before it
// stops (and ends the wait): a writer whose path never answers must not
// hold every caller while the lease's own connection still renews.
inline absl::Duration CommitLimit(absl::Duration ttl) { return 2 * ttl; }

// Renews the lease every ttl / 3 until the stop; stops the scheduler (1)
// when another took the lease, or when it could not renew and what is left
// of the lease, counted from before the last renewal was sent, is less
// than one more try: a leader that cannot renew must not serve on. A
// deadline thread stops it by its own clock before the lease may expire
// whatever the renewal does; and at each renewal time a commit of
// `store`'s in flight for longer than CommitLimit(ttl) stops it too.
// `lease_mu` guards `lease` (main() also writes its address).
void RenewLease(store::PostgresLease* lease, std::mutex* lease_mu, store::PostgresStore* store,
                absl::Duration ttl, std::chrono::steady_clock::time_point taken_at,
                StopSignal* stop);

}  // namespace taskgrid
