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
// `taken_bytes`, when given, is set to the ByteSizeLong() of the messages
// taken. Msg is v1::AgentMessage or v1::SchedulerMessage.
template <typename Msg>
Msg TakeBatch(std::deque<Msg>& queue, bool batches, size_t max_bytes = kMaxBatchBytes,
              size_t* taken_bytes = nullptr) {
  size_t n = 1;
  size_t bytes = queue.front().ByteSizeLong();
  if (batches) {
    // In a batch each message adds its tag and length: at most 6 bytes.
    size_t in_batch = bytes + 6;
    while (n < queue.size()) {
      const size_t size = queue[n].ByteSizeLong();
      if (in_batch + size + 6 > max_bytes) break;
      in_batch += size + 6;
      bytes += size;
      ++n;
    }
  }
  if (taken_bytes != nullptr) *taken_bytes = bytes;
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
