#include "agent/outbox.h"

#include <utility>

#include "common/batching.h"

namespace taskgrid::agent {

void Outbox::Attach(Writer writer) {
  std::lock_guard<std::mutex> write_lock(write_mu_);
  writer_ = std::move(writer);
  std::lock_guard<std::mutex> lock(out_mu_);
  batches_ = false;  // until this stream's Welcome says otherwise
  attached_ = true;
}

void Outbox::SetBatches(bool batches) {
  std::lock_guard<std::mutex> lock(out_mu_);
  batches_ = batches;
}

void Outbox::Detach() {
  {
    std::lock_guard<std::mutex> lock(out_mu_);
    attached_ = false;
    out_.clear();
  }
  // A writing thread holds write_mu_ until it finds out_ empty.
  std::lock_guard<std::mutex> write_lock(write_mu_);
  writer_ = nullptr;
}

bool Outbox::Write(v1::AgentMessage msg) {
  std::vector<v1::AgentMessage> msgs;
  msgs.push_back(std::move(msg));
  return WriteAll(std::move(msgs));
}

bool Outbox::WriteAll(std::vector<v1::AgentMessage> msgs) {
  {
    std::lock_guard<std::mutex> lock(out_mu_);
    if (!attached_) return false;
    for (v1::AgentMessage& m : msgs) out_.push_back(std::move(m));
    if (writing_) return true;  // the writing thread takes them along
    writing_ = true;
  }
  std::lock_guard<std::mutex> write_lock(write_mu_);
  for (;;) {
    v1::AgentMessage next;
    {
      std::lock_guard<std::mutex> lock(out_mu_);
      if (out_.empty()) {
        writing_ = false;
        idle_.notify_all();
        return true;
      }
      next = TakeBatch(out_, batches_);
    }
    // A broken stream ends the session's read too, which detaches it.
    if (writer_ != nullptr) writer_(next);
  }
}

void Outbox::WaitIdle() {
  std::unique_lock<std::mutex> lock(out_mu_);
  idle_.wait(lock, [this] { return !writing_; });
}

}  // namespace taskgrid::agent
