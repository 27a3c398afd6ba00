// Caps on the long-lived streams anyone may open without a token (health
// watches, server reflection): at most `per_connection` open from one
// connection and `total` on the server. A stream past either is refused
// at once with RESOURCE_EXHAUSTED naming the limit, so a caller cannot
// make the scheduler hold unbounded memory for it. Each open stream costs
// a reactor and its buffers (no thread), a few KB.
//
// The connection is the caller's peer address as gRPC reports it
// (ipv4:127.0.0.1:54321): one TCP connection each. Unix-socket callers all
// report the same peer and share one connection's cap.
//
// Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <map>
#include <mutex>
#include <string>

namespace taskgrid::service {

struct StreamLimits {
  // Far above what a load balancer, probe or grpcurl opens (one or a few
  // per connection), far below what would cost the host anything (the
  // total is a few MB).
  int per_connection = 100;
  int total = 1000;
};

class StreamCaps {
 public:
  // `what`: the streams counted, plural, for the refusal's message
  // ("health watches").
  StreamCaps(std::string what, StreamLimits limits) : what_(std::move(what)), limits_(limits) {}

  // Takes a place for a stream from `peer`: OK, or RESOURCE_EXHAUSTED
  // naming the limit it would pass (no place taken then).
  grpc::Status Take(const std::string& peer);
  // Frees the place a successful Take took.
  void Give(const std::string& peer);

  int open() const;
  int open_from(const std::string& peer) const;

 private:
  const std::string what_;
  const StreamLimits limits_;
  mutable std::mutex mu_;
  std::map<std::string, int> by_peer_;  // guarded by mu_; no zero counts
  int total_ = 0;                       // guarded by mu_
};

}  // namespace taskgrid::service
