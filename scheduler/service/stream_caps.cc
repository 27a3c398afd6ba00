#include "scheduler/service/stream_caps.h"

#include "absl/strings/str_cat.h"

namespace taskgrid::service {

grpc::Status StreamCaps::Take(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_peer_.find(peer);
  const int from_peer = it == by_peer_.end() ? 0 : it->second;
  if (from_peer >= limits_.per_connection) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("too many ", what_, " from this connection: at most ",
                                     limits_.per_connection));
  }
  if (total_ >= limits_.total) {
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("too many ", what_, " open on this server: at most ", limits_.total));
  }
  ++by_peer_[peer];
  ++total_;
  return grpc::Status::OK;
}

void StreamCaps::Give(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_peer_.find(peer);
  if (it == by_peer_.end()) return;
  if (--it->second == 0) by_peer_.erase(it);
  --total_;
}

int StreamCaps::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

int StreamCaps::open_from(const std::string& peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_peer_.find(peer);
  return it == by_peer_.end() ? 0 : it->second;
}

}  // namespace taskgrid::service
