#include "scheduler/engine/output.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/message_limits.h"
#include "scheduler/core/state_machine.h"

namespace taskgrid::engine {

namespace {

using Response = v1::StreamTaskOutputResponse;

// An offset no output reaches (and offset + size never overflows).
constexpr int64_t kMaxOffset = int64_t{1} << 60;

int StreamIndex(v1::OutputStream s) { return s == v1::OUTPUT_STREAM_STDERR ? 1 : 0; }
v1::OutputStream StreamOf(int index) {
  return index == 1 ? v1::OUTPUT_STREAM_STDERR : v1::OUTPUT_STREAM_STDOUT;
}

core::Outgoing WatchMsg(uint64_t conn, const std::string& task_id, int32_t attempt, bool watch) {
  core::Outgoing out;
  out.conn = conn;
  v1::WatchOutput* w = out.msg.mutable_watch_output();
  w->set_task_id(task_id);
  w->set_attempt(attempt);
  w->set_watch(watch);
  return out;
}

}  // namespace

absl::StatusOr<std::shared_ptr<OutputFollower>> OutputRelay::Admit(
    const v1::StreamTaskOutputRequest& req, std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mu_);
  if (all_.size() >= opts_.max_followers) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "too many StreamTaskOutput streams open (--max_output_follows=", opts_.max_followers,
        "); try again later"));
  }
  std::shared_ptr<OutputFollower> f(
      new OutputFollower(req.id(), req.follow(), req.stream(), std::move(wake)));
  all_[f.get()] = f;
  return f;
}

void OutputRelay::Wake(OutputFollower& f, Wakes* wakes) {
  if (!f.idle_) return;
  f.idle_ = false;
  wakes->push_back(f.wake_);
}

void OutputRelay::Queue(OutputFollower& f, Response msg, Wakes* wakes) const {
  f.pending_bytes_ += msg.data().size();
  f.pending_.push_back(std::move(msg));
  Wake(f, wakes);
}

void OutputRelay::Emit(OutputFollower& f, int stream, int64_t offset,
                       const std::string& data) const {
  if (f.only_ != v1::OUTPUT_STREAM_UNSPECIFIED && StreamIndex(f.only_) != stream) return;
  const int64_t end = offset + static_cast<int64_t>(data.size());
  if (end <= f.sent_[stream]) return;  // sent already
  for (int64_t at = std::max(offset, f.sent_[stream]); at < end;) {
    const int64_t n = std::min<int64_t>(end - at, kMaxOutputChunkBytes);
    Response r;
    r.set_kind(Response::KIND_OUTPUT);
    r.set_attempt(f.attempt_);
    r.set_stream(StreamOf(stream));
    r.set_offset(at);
    r.set_data(data.substr(static_cast<size_t>(at - offset), static_cast<size_t>(n)));
    f.pending_bytes_ += r.data().size();
    f.pending_.push_back(std::move(r));
    at += n;
  }
  f.sent_[stream] = end;
}

void OutputRelay::Started(OutputFollower& f, int32_t attempt, const std::string& holder,
                          const std::string& note, Wakes* wakes) const {
  f.phase_ = OutputFollower::Phase::kOn;
  f.attempt_ = attempt;
  f.sent_[0] = f.sent_[1] = 0;
  Response r;
  r.set_kind(Response::KIND_ATTEMPT_STARTED);
  r.set_attempt(attempt);
  r.set_agent_id(holder);
  r.set_note(note);
  Queue(f, std::move(r), wakes);
}

void OutputRelay::Started(OutputFollower& f, const OutputTaskState& s, Wakes* wakes) const {
  Started(f, s.attempt, s.holder, s.conn == 0 ? s.no_live : "", wakes);
}

void OutputRelay::TakeBacklog(OutputFollower& f, const Feed& feed) const {
  if (feed.attempt != f.attempt_) return;
  for (const Chunk& c : feed.backlog) {
    if (c.seq >= f.cursor_) Emit(f, c.stream, c.offset, c.data);
  }
  f.cursor_ = feed.next_seq;
}

void OutputRelay::EndAttempt(OutputFollower& f, Feed& feed, const OutputTaskState& s,
                             Wakes* wakes) const {
  // What it has not read of the backlog first, while the feed still holds
  // this attempt's chunks.
  TakeBacklog(f, feed);
  Response ended;
  ended.set_kind(Response::KIND_ATTEMPT_ENDED);
  ended.set_attempt(f.attempt_);
  for (const v1::Attempt& a : s.ended) {
    if (a.attempt() != f.attempt_) continue;
    const v1::TaskResult& r = a.result();
    Emit(f, 0, r.stdout_cut_bytes(), r.stdout_tail());
    Emit(f, 1, r.stderr_cut_bytes(), r.stderr_tail());
    ended.set_outcome(r.outcome());
    ended.set_agent_id(a.agent_id());
  }
  Queue(f, std::move(ended), wakes);
  f.phase_ = OutputFollower::Phase::kWaiting;
}

void OutputRelay::CatchUp(OutputFollower& f, const OutputTaskState& s, Wakes* wakes) const {
  for (const v1::Attempt& a : s.ended) {
    if (a.attempt() <= f.attempt_ || !a.has_start_time()) continue;
    // Started and ended between two looks (its Accept and Result came
    // together): its stored tails are all there is of it.
    Started(f, a.attempt(), a.agent_id(), "", wakes);
    Emit(f, 0, a.result().stdout_cut_bytes(), a.result().stdout_tail());
    Emit(f, 1, a.result().stderr_cut_bytes(), a.result().stderr_tail());
    Response ended;
    ended.set_kind(Response::KIND_ATTEMPT_ENDED);
    ended.set_attempt(a.attempt());
    ended.set_agent_id(a.agent_id());
    ended.set_outcome(a.result().outcome());
    Queue(f, std::move(ended), wakes);
    f.phase_ = OutputFollower::Phase::kWaiting;
  }
}

void OutputRelay::End(OutputFollower& f, Feed* feed, const std::string& note, Wakes* wakes) const {
  Response r;
  r.set_kind(Response::KIND_END);
  r.set_state(f.state_);
  r.set_note(note);
  Queue(f, std::move(r), wakes);
  f.phase_ = OutputFollower::Phase::kEnding;
  if (feed != nullptr) feed->followers.erase(&f);
}

void OutputRelay::FailLocked(OutputFollower& f, const absl::Status& why, Wakes* wakes) {
  if (!f.failed_.ok() || f.phase_ == OutputFollower::Phase::kDone) return;
  f.failed_ = why;
  f.pending_.clear();
  f.pending_bytes_ = 0;
  auto it = feeds_.find(f.task_id_);
  if (it != feeds_.end()) it->second.followers.erase(&f);
  // An idle stream learns it at once; a busy one at its next Next().
  Wake(f, wakes);
}

void OutputRelay::SyncFeed(Feed& feed, const OutputTaskState& s, std::vector<core::Outgoing>* out) {
  const int32_t live = s.started ? s.attempt : 0;
  if (feed.attempt != live) {
    // Another attempt (or none): what came of the last one is its
    // followers' already (EndAttempt).
    feed.attempt = live;
    feed.conn = 0;
    feed.caught_up = false;
    feed.backlog.clear();
    feed.bytes = 0;
    feed.end[0] = feed.end[1] = 0;
  }
  if (live == 0 || s.conn == feed.conn) return;
  feed.conn = 0;
  feed.caught_up = false;
  if (s.conn == 0) return;  // its stream is gone: that agent stops by itself
  for (OutputFollower* f : feed.followers) {
    if (f->phase_ == OutputFollower::Phase::kOn && f->attempt_ == live) {
      // Asked (again, on a new stream): the agent answers with all it
      // holds; what the backlog has already is trimmed off in Offer.
      feed.conn = s.conn;
      out->push_back(WatchMsg(s.conn, s.task_id, live, /*watch=*/true));
      return;
    }
  }
}

std::vector<core::Outgoing> OutputRelay::Attach(const std::shared_ptr<OutputFollower>& fp,
                                                const OutputTaskState& s) {
  std::vector<core::Outgoing> out;
  Wakes wakes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    OutputFollower& f = *fp;
    if (f.removed_ || !f.failed_.ok() || f.phase_ != OutputFollower::Phase::kPending) return out;
    f.state_ = s.state;
    if (core::IsTerminal(s.state)) {
      // Its last result's tails, then the end.
      for (const v1::Attempt& a : s.ended) {
        f.attempt_ = a.attempt();
        f.sent_[0] = f.sent_[1] = 0;
        Emit(f, 0, a.result().stdout_cut_bytes(), a.result().stdout_tail());
        Emit(f, 1, a.result().stderr_cut_bytes(), a.result().stderr_tail());
      }
      End(f, nullptr, "", &wakes);
    } else if (!s.started && !f.follow_) {
      End(f, nullptr, "not started yet: no output", &wakes);
    } else {
      Feed& feed = feeds_[s.task_id];
      feed.followers.insert(&f);
      if (s.started) {
        Started(f, s, &wakes);
      } else {
        // Waits for the next attempt to start: a dispatched one counts.
        f.phase_ = OutputFollower::Phase::kWaiting;
        f.attempt_ = core::IsInFlight(s.state) ? s.attempt - 1 : s.attempt;
      }
      SyncFeed(feed, s, &out);
      if (!feed.backlog.empty()) f.cursor_ = feed.backlog.front().seq;
      if (s.started && !f.follow_ && feed.conn == 0) {
        // Nothing will come live (ATTEMPT_STARTED said why): what there
        // is now is nothing.
        End(f, &feed, "", &wakes);
        DropIfUnfollowed(s.task_id, &out);
      }
    }
  }
  for (auto& w : wakes) w();
  return out;
}

std::vector<core::Outgoing> OutputRelay::Update(const OutputTaskState& s) {
  std::vector<core::Outgoing> out;
  Wakes wakes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = feeds_.find(s.task_id);
    if (it == feeds_.end()) return out;
    Feed& feed = it->second;
    const bool terminal = core::IsTerminal(s.state);
    std::vector<OutputFollower*> starting;
    const std::vector<OutputFollower*> followers(feed.followers.begin(), feed.followers.end());
    for (OutputFollower* f : followers) {
      f->state_ = s.state;
      if (f->phase_ == OutputFollower::Phase::kWaiting) CatchUp(*f, s, &wakes);
      if (f->phase_ == OutputFollower::Phase::kOn &&
          (terminal || !s.started || s.attempt != f->attempt_)) {
        EndAttempt(*f, feed, s, &wakes);
        if (!f->follow_) {
          End(*f, &feed, "", &wakes);
          continue;
        }
      }
      if (f->phase_ != OutputFollower::Phase::kWaiting) continue;
      if (terminal) {
        End(*f, &feed, "", &wakes);
      } else if (s.started && s.attempt > f->attempt_) {
        Started(*f, s, &wakes);
        starting.push_back(f);
      }
    }
    for (OutputFollower* f : followers) {
      if (f->failed_.ok() && f->pending_bytes_ > opts_.max_pending_bytes) {
        FailLocked(*f,
                   absl::ResourceExhaustedError(
                       absl::StrCat("this stream fell behind: ", f->pending_bytes_,
                                    " bytes of stored output wait unread (the limit is ",
                                    opts_.max_pending_bytes, "); follow the task again")),
                   &wakes);
      }
    }
    SyncFeed(feed, s, &out);
    for (OutputFollower* f : starting) {
      f->cursor_ = feed.backlog.empty() ? feed.next_seq : feed.backlog.front().seq;
    }
    if (feed.conn == 0 && feed.attempt != 0) {
      // No answer will come from a stream that is gone: followers that
      // wanted only what there is now have it.
      for (OutputFollower* f : followers) {
        if (!f->follow_ && f->phase_ == OutputFollower::Phase::kOn && f->failed_.ok()) {
          TakeBacklog(*f, feed);
          End(*f, &feed, s.no_live, &wakes);
        }
      }
    }
    DropIfUnfollowed(s.task_id, &out);
  }
  for (auto& w : wakes) w();
  return out;
}

void OutputRelay::Offer(uint64_t conn, const v1::TaskOutput& o) {
  const bool has_data = !o.data().empty();
  if (o.offset() < 0 || o.offset() > kMaxOffset ||
      (has_data && o.stream() != v1::OUTPUT_STREAM_STDOUT &&
       o.stream() != v1::OUTPUT_STREAM_STDERR)) {
    return;
  }
  Wakes wakes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = feeds_.find(o.task_id());
    if (it == feeds_.end()) return;
    Feed& feed = it->second;
    if (feed.attempt != o.attempt() || feed.conn != conn || conn == 0) return;
    bool news = false;
    if (has_data) {
      const int s = StreamIndex(o.stream());
      const int64_t end = o.offset() + static_cast<int64_t>(o.data().size());
      if (end > feed.end[s]) {
        // Only what is past the end received: offsets never go back.
        const int64_t from = std::max(o.offset(), feed.end[s]);
        Chunk c;
        c.seq = feed.next_seq++;
        c.stream = s;
        c.offset = from;
        c.data = o.data().substr(static_cast<size_t>(from - o.offset()));
        feed.bytes += c.data.size();
        feed.end[s] = end;
        feed.backlog.push_back(std::move(c));
        while (feed.bytes > opts_.backlog_bytes && feed.backlog.size() > 1) {
          feed.bytes -= feed.backlog.front().data.size();
          feed.backlog.pop_front();
        }
        news = true;
      }
    }
    if (o.caught_up() && !feed.caught_up) {
      feed.caught_up = true;
      news = true;
    }
    if (news) {
      for (OutputFollower* f : feed.followers) {
        if (f->phase_ == OutputFollower::Phase::kOn && f->attempt_ == feed.attempt) {
          Wake(*f, &wakes);
        }
      }
    }
  }
  for (auto& w : wakes) w();
}

void OutputRelay::Fail(const std::shared_ptr<OutputFollower>& f, const absl::Status& why) {
  Wakes wakes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    FailLocked(*f, why, &wakes);
  }
  for (auto& w : wakes) w();
}

void OutputRelay::FailAll(const absl::Status& why) {
  Wakes wakes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [p, f] : all_) FailLocked(*f, why, &wakes);
    feeds_.clear();
  }
  for (auto& w : wakes) w();
}

absl::StatusOr<OutputRelay::Batch> OutputRelay::Next(const std::shared_ptr<OutputFollower>& fp,
                                                     size_t max_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  OutputFollower& f = *fp;
  if (!f.failed_.ok()) return f.failed_;
  Batch b;
  size_t bytes = 0;
  auto room = [&] { return b.msgs.empty() || bytes < max_bytes; };
  auto take_pending = [&] {
    while (!f.pending_.empty() && room()) {
      bytes += f.pending_.front().data().size();
      f.pending_bytes_ -= f.pending_.front().data().size();
      b.msgs.push_back(std::move(f.pending_.front()));
      f.pending_.pop_front();
    }
  };
  take_pending();
  if (f.phase_ == OutputFollower::Phase::kOn && f.pending_.empty()) {
    auto it = feeds_.find(f.task_id_);
    if (it != feeds_.end() && it->second.attempt == f.attempt_) {
      Feed& feed = it->second;
      // Chunks the backlog let go of are skipped: the offsets say so.
      if (!feed.backlog.empty()) f.cursor_ = std::max(f.cursor_, feed.backlog.front().seq);
      while (!feed.backlog.empty() && f.cursor_ < feed.next_seq && room()) {
        const Chunk& c = feed.backlog[f.cursor_ - feed.backlog.front().seq];
        ++f.cursor_;
        Emit(f, c.stream, c.offset, c.data);
        take_pending();
      }
      if (!f.follow_ && feed.caught_up && f.cursor_ >= feed.next_seq) {
        // What the agent held when asked is all sent: that is "now".
        Wakes none;  // this is the follower's own call: nobody to wake
        End(f, &feed, "", &none);
        take_pending();
      }
    }
  }
  if (f.phase_ == OutputFollower::Phase::kEnding && f.pending_.empty()) {
    // END was queued last: once it is taken, that is all.
    b.done = true;
    f.phase_ = OutputFollower::Phase::kDone;
  }
  if (b.msgs.empty() && !b.done) f.idle_ = true;
  return b;
}

void OutputRelay::DropIfUnfollowed(const std::string& task_id, std::vector<core::Outgoing>* out) {
  auto it = feeds_.find(task_id);
  if (it == feeds_.end() || !it->second.followers.empty()) return;
  if (it->second.conn != 0) {
    out->push_back(WatchMsg(it->second.conn, task_id, it->second.attempt, /*watch=*/false));
  }
  feeds_.erase(it);
}

std::vector<core::Outgoing> OutputRelay::Remove(const std::shared_ptr<OutputFollower>& fp) {
  std::vector<core::Outgoing> out;
  std::lock_guard<std::mutex> lock(mu_);
  OutputFollower& f = *fp;
  if (f.removed_) return out;
  f.removed_ = true;
  auto it = feeds_.find(f.task_id_);
  if (it != feeds_.end()) {
    // It may have left the feed already (it ended): the feed goes with the
    // last one either way.
    it->second.followers.erase(&f);
    DropIfUnfollowed(f.task_id_, &out);
  }
  all_.erase(&f);  // the caller still holds it
  return out;
}

size_t OutputRelay::followers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return all_.size();
}

}  // namespace taskgrid::engine
