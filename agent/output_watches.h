// OutputWatches: the running attempts whose output the scheduler follows
// (WatchOutput), and when their new output goes out as TaskOutput
// messages. A decision of time and sizes only: it reads each attempt's
// LiveOutput and the `now` it is given, and returns the messages to send.
//
// The rules (OutputWatchOptions):
//   - Start() answers at once with everything the attempt still holds
//     (from its oldest byte kept), the last message marked caught_up; an
//     attempt that is not running here gets one empty caught_up message.
//   - Then Due() sends what is new at most every `interval`; a stream with
//     `eager_bytes` or more unsent goes at the next poll (every `poll`),
//     so a fast writer is sent before its ring overwrites it.
//   - Each message holds at most `max_chunk` bytes. A watcher the output
//     outran past the ring is sent from the oldest byte the ring holds:
//     the offset jump says how much was skipped.
//   - Finish() at the end of the attempt sends what is left at once (no
//     rate bound: it must go before the Result) and forgets the watch;
//     Stop() forgets it without a word; Clear() forgets every watch (the
//     stream ended: the scheduler asks again on the next one).
//
// Not thread-safe: the agent core holds its mutex around every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "agent/live_output.h"
#include "common/message_limits.h"
#include "taskgrid/v1/agent_service.pb.h"

namespace taskgrid::agent {

struct OutputWatchOptions {
  absl::Duration interval = absl::Milliseconds(200);
  absl::Duration poll = absl::Milliseconds(50);
  size_t eager_bytes = 32 << 10;
  size_t max_chunk = kMaxOutputChunkBytes;
};

class OutputWatches {
 public:
  explicit OutputWatches(OutputWatchOptions opts = {}) : opts_(opts) {}

  // Watches (task_id, attempt), whose output is `live` (null: not running
  // here). A watch already there starts over. Returns what to send now.
  std::vector<v1::AgentMessage> Start(const std::string& task_id, int32_t attempt,
                                      std::shared_ptr<LiveOutput> live, absl::Duration now);
  void Stop(const std::string& task_id, int32_t attempt);
  void Clear();
  // The attempt ended: what it wrote since the last message, and it is
  // watched no more. Empty when it was not watched.
  std::vector<v1::AgentMessage> Finish(const std::string& task_id, int32_t attempt);
  // What is due at `now` (monotonic).
  std::vector<v1::AgentMessage> Due(absl::Duration now);
  // When Due() should run next: InfiniteDuration when nothing is watched.
  absl::Duration NextDue() const;

  bool watching(const std::string& task_id, int32_t attempt) const {
    return watches_.count({task_id, attempt}) > 0;
  }
  size_t size() const { return watches_.size(); }

 private:
  using Key = std::pair<std::string, int32_t>;
  struct Watch {
    std::shared_ptr<LiveOutput> live;
    int64_t sent[LiveOutput::kStreams] = {0, 0};  // offset after the last byte sent
    absl::Duration last_sent;                     // when output last went
  };
  // Appends messages for everything `w` holds that was not sent yet.
  void Flush(const Key& key, Watch& w, std::vector<v1::AgentMessage>* out) const;

  const OutputWatchOptions opts_;
  std::map<Key, Watch> watches_;
  absl::Duration next_due_ = absl::InfiniteDuration();
};

}  // namespace taskgrid::agent
