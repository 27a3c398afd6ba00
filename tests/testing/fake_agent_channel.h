// An AgentChannel that keeps what the Engine sends, for Engine tests.
// Thread-safe: the Engine sends from its commit threads.
#pragma once

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/engine/engine.h"

namespace taskgrid::testing {

class FakeAgentChannel : public engine::AgentChannel {
 public:
  void Send(v1::SchedulerMessage msg) override {
    std::lock_guard<std::mutex> lock(mu_);
    sent_.push_back(std::move(msg));
  }
  void Close(const absl::Status& why) override {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = why;
  }
  std::vector<v1::SchedulerMessage> sent() {
    std::lock_guard<std::mutex> lock(mu_);
    return sent_;
  }
  // The tasks of every Assign so far.
  int assigns() {
    int n = 0;
    for (const auto& m : sent()) n += m.has_assign() ? m.assign().tasks_size() : 0;
    return n;
  }

 private:
  std::mutex mu_;
  std::vector<v1::SchedulerMessage> sent_;  // guarded by mu_
  absl::Status closed_;                     // guarded by mu_
};

}  // namespace taskgrid::testing
