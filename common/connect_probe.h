// Why a connection to the scheduler failed, told by trying it again by
// hand: gRPC's own texts ("Socket closed", "failed to connect to all
// addresses") say neither whether anything listens nor which side of a
// TLS handshake gave up. taskgridctl and the agent call this after a call
// ends UNAVAILABLE, and say what it found.
//
// gRPC-free (plain sockets and GnuTLS). Blocks for at most about twice
// `within`; any thread.
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace taskgrid {

// The TLS files the caller's channel uses ("" for none), as given (the
// messages name them).
struct ProbeFiles {
  std::string ca;    // --tls_ca: "" means a plaintext channel
  std::string cert;  // --tls_cert
  std::string key;   // --tls_key
};

// A sentence saying what failed connecting to `target` ("host:port"):
//  - nothing listens (refused): "nothing listens at T (connection refused):
//    is taskgrid-scheduler running there?"; no answer at all: the same for
//    a host that does not answer;
//  - with TLS (files.ca): "TLS handshake with T failed: " and the cause:
//    the scheduler requires a client certificate; refused this one; its
//    certificate is not signed by the CA, has expired, or does not name
//    the host (with the names it has); or it does not speak TLS;
//  - without TLS: the scheduler speaks TLS, so the client needs --tls_ca.
// "" when the probe finds nothing wrong (the cause is elsewhere).
std::string ExplainConnectFailure(absl::string_view target, const ProbeFiles& files,
                                  absl::Duration within = absl::Seconds(2));

}  // namespace taskgrid
