// Batches for the agent stream, in both directions.
//
// One stream message carries either one message or a batch of queued ones
// (AgentMessage.batch, SchedulerMessage.batch). A batch holds as many of the
// oldest queued messages as fit in `max_bytes` (and at least one), so no
// write exceeds what the other side accepts however much queued meanwhile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>

namespace taskgrid {

// The bytes the agent stream puts into one batch (the receiver accepts
// 64 MiB; a single message is bounded well below that on its own).
inline constexpr size_t kMaxBatchBytes = 4 << 20;

// Removes the oldest messages of `queue` (not empty) and returns them as
// the next message to write: the oldest alone when `batches` is false, when
// only one is queued, or when the two oldest together pass `max_bytes`;
// else a batch of the longest run from the front within `max_bytes`.
// `sizes`, when given, runs beside `queue` with each message's
// ByteSizeLong() (so none is computed twice) and loses the same entries;
// `taken_bytes`, when given, is set to the sum of the sizes taken.
// Msg is v1::AgentMessage or v1::SchedulerMessage.
template <typename Msg>
Msg TakeBatch(std::deque<Msg>& queue, bool batches, size_t max_bytes = kMaxBatchBytes,
              std::deque<size_t>* sizes = nullptr, size_t* taken_bytes = nullptr) {
  auto size_of = [&](size_t i) { return sizes != nullptr ? (*sizes)[i] : queue[i].ByteSizeLong(); };
  size_t n = 1;
  if (batches && queue.size() > 1) {
    // In a batch each message adds its tag and length: at most 6 bytes.
    size_t in_batch = size_of(0) + 6;
    while (n < queue.size()) {
      const size_t size = size_of(n);
      if (in_batch + size + 6 > max_bytes) break;
      in_batch += size + 6;
      ++n;
    }
  }
  if (taken_bytes != nullptr) {
    *taken_bytes = 0;
    for (size_t i = 0; i < n; ++i) *taken_bytes += size_of(i);
  }
  if (sizes != nullptr) sizes->erase(sizes->begin(), sizes->begin() + static_cast<ptrdiff_t>(n));
  Msg out;
  if (n == 1) {
    out = std::move(queue.front());
    queue.pop_front();
    return out;
  }
  auto* msgs = out.mutable_batch()->mutable_msgs();
  msgs->Reserve(static_cast<int>(n));
  for (size_t i = 0; i < n; ++i) {
    *msgs->Add() = std::move(queue.front());
    queue.pop_front();
  }
  return out;
}

}  // namespace taskgrid
