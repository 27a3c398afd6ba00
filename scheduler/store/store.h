// Store: where the task table lives. The scheduler keeps everything it
// decides on in memory and treats the store as the durable truth it reads
// back at start-up (recovery) and appends to in WriteBatch transactions.
//
// Implementations: SqliteStore (production), MemoryStore (tests). Both pass
// the shared conformance suite in tests/unit/store_conformance_test.cc.
//
// Thread contract: Apply is called by one writer thread at a time (the
// GroupCommitWriter); LoadTasks only before that writer starts; ReadEvents
// may be called from any thread.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "scheduler/core/model.h"

namespace taskgrid::store {

struct StoredEvent {
  int64_t revision = 0;  // increasing, from 1
  core::EventRow event;
};

class Store {
 public:
  virtual ~Store() = default;

  // Applies the whole batch in one transaction, or nothing of it. Returns
  // only once the transaction is as durable as the store promises.
  virtual absl::Status Apply(const core::WriteBatch& batch) = 0;

  // Every task with its finished attempts, in submit (seq) order.
  virtual absl::StatusOr<std::vector<core::StoredTask>> LoadTasks() = 0;

  // Up to `limit` events with revision > after, oldest first.
  virtual absl::StatusOr<std::vector<StoredEvent>> ReadEvents(int64_t after, int limit) = 0;

  // The oldest and newest stored event revisions; {0, 0} when there are none.
  virtual absl::StatusOr<std::pair<int64_t, int64_t>> EventRange() = 0;
};

}  // namespace taskgrid::store
