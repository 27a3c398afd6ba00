// Simulated agents for W6: many light AgentService.Connect streams in one
// process. Each stream says Hello with its own id, then sends a Heartbeat
// every Welcome.heartbeat_interval, adopts each HeartbeatAck's interval
// (it says adaptive_heartbeat in Hello, as taskgrid-agent does) and reads
// (and ignores) whatever else the scheduler sends; it never accepts work. A stream that ends is
// counted as failed and not reopened, so the scheduler's ListAgents shows exactly how many held.
//
// Run as `taskgrid-bench --sim_agents=N --addr=HOST:PORT --sim_id_prefix=P`,
// a child process the W6 workload starts (so the load generator's CPU is
// not the bench's). Each stream has its own channel and TCP connection
// (a local subchannel pool), as a real agent has.
//
// Threads: gRPC's callback threads run the reactions; one heartbeat thread
// starts the heartbeat writes; the caller's thread opens the streams and
// reports progress on stderr.
#pragma once

#include <grpcpp/security/credentials.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace taskgrid::bench {

struct SimAgentOptions {
  std::string addr;
  std::string id_prefix = "sim-";
  int64_t agents = 100;
  int slots = 1;
  // Streams opened before waiting for their Welcome (bounded by
  // `wave_timeout`), so thousands of connects do not arrive at once.
  int wave = 200;
  absl::Duration wave_timeout = absl::Seconds(20);
  // The process ends by itself after this long, whatever happens.
  absl::Duration max_run = absl::Minutes(30);
  // How the streams are secured (common/tls.h); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

// Opens the streams, keeps them heartbeating until max_run passed (or the
// process is killed); an error when no stream could be opened at all.
absl::Status RunSimAgents(const SimAgentOptions& opts);

}  // namespace taskgrid::bench
