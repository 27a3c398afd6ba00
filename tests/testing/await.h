// Test-only: calls an Engine operation that answers through a callback and
// waits for its answer.
#pragma once

#include <functional>
#include <future>
#include <utility>

#include "absl/status/statusor.h"
#include "scheduler/engine/engine.h"

namespace taskgrid::testing {

template <typename T>
absl::StatusOr<T> Await(const std::function<void(engine::Engine::Reply<T>)>& call) {
  std::promise<absl::StatusOr<T>> p;
  call([&p](absl::StatusOr<T> r) { p.set_value(std::move(r)); });
  return p.get_future().get();
}

}  // namespace taskgrid::testing
