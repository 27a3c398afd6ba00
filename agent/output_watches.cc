#include "agent/output_watches.h"

#include <algorithm>

namespace taskgrid::agent {

namespace {

v1::AgentMessage OutputMsg(const std::string& task_id, int32_t attempt, LiveOutput::Stream stream,
                           int64_t offset, std::string data) {
  v1::AgentMessage m;
  v1::TaskOutput* o = m.mutable_output();
  o->set_task_id(task_id);
  o->set_attempt(attempt);
  o->set_stream(stream == LiveOutput::kStdout ? v1::OUTPUT_STREAM_STDOUT
                                              : v1::OUTPUT_STREAM_STDERR);
  o->set_offset(offset);
  o->set_data(std::move(data));
  return m;
}

}  // namespace

void OutputWatches::Flush(const Key& key, Watch& w, std::vector<v1::AgentMessage>* out) const {
  for (int s = 0; s < LiveOutput::kStreams; ++s) {
    const auto stream = static_cast<LiveOutput::Stream>(s);
    const int64_t end = w.live->end(stream);
    // Bounded: each pass sends max_chunk bytes or reaches `end`, and the
    // ring holds only so much.
    while (w.sent[s] < end) {
      LiveOutput::Piece p = w.live->Read(stream, w.sent[s], opts_.max_chunk);
      if (p.data.empty()) break;
      w.sent[s] = p.offset + static_cast<int64_t>(p.data.size());
      out->push_back(OutputMsg(key.first, key.second, stream, p.offset, std::move(p.data)));
    }
  }
}

std::vector<v1::AgentMessage> OutputWatches::Start(const std::string& task_id, int32_t attempt,
                                                   std::shared_ptr<LiveOutput> live,
                                                   absl::Duration now) {
  std::vector<v1::AgentMessage> out;
  const Key key{task_id, attempt};
  if (live != nullptr) {
    Watch& w = watches_[key];
    w = Watch{};
    w.live = std::move(live);
    w.last_sent = now;
    Flush(key, w, &out);
    next_due_ = std::min(next_due_, now + opts_.poll);
  }
  if (out.empty()) out.push_back(OutputMsg(task_id, attempt, LiveOutput::kStdout, 0, ""));
  out.back().mutable_output()->set_caught_up(true);
  return out;
}

void OutputWatches::Stop(const std::string& task_id, int32_t attempt) {
  watches_.erase({task_id, attempt});
  if (watches_.empty()) next_due_ = absl::InfiniteDuration();
}

void OutputWatches::Clear() {
  watches_.clear();
  next_due_ = absl::InfiniteDuration();
}

std::vector<v1::AgentMessage> OutputWatches::Finish(const std::string& task_id, int32_t attempt) {
  std::vector<v1::AgentMessage> out;
  auto it = watches_.find({task_id, attempt});
  if (it == watches_.end()) return out;
  Flush(it->first, it->second, &out);
  watches_.erase(it);
  if (watches_.empty()) next_due_ = absl::InfiniteDuration();
  return out;
}

std::vector<v1::AgentMessage> OutputWatches::Due(absl::Duration now) {
  std::vector<v1::AgentMessage> out;
  if (now < next_due_) return out;
  for (auto& [key, w] : watches_) {
    bool any = false;
    bool eager = false;
    for (int s = 0; s < LiveOutput::kStreams; ++s) {
      const int64_t unsent = w.live->end(static_cast<LiveOutput::Stream>(s)) - w.sent[s];
      any |= unsent > 0;
      eager |= unsent >= static_cast<int64_t>(opts_.eager_bytes);
    }
    if (!any || (!eager && now - w.last_sent < opts_.interval)) continue;
    Flush(key, w, &out);
    w.last_sent = now;
  }
  next_due_ = watches_.empty() ? absl::InfiniteDuration() : now + opts_.poll;
  return out;
}

absl::Duration OutputWatches::NextDue() const { return next_due_; }

}  // namespace taskgrid::agent
