// Whether anything listens at a scheduler's address: how an agent that
// lost its scheduler tells a restart (the host answers, nothing listens:
// the connection is refused) from silence (nothing answers at all: the
// host is down, or the network between is cut), which it cannot tell from
// gRPC's own error texts.
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace taskgrid {

enum class TcpProbe {
  kAccepted,  // something listens there
  kRefused,   // the host answered that nothing listens (ECONNREFUSED)
  kNoAnswer,  // no answer within the time, no such host, no route, ...
};

// Opens a TCP connection to `target` ("host:port" or "[v6]:port", every
// address the host name resolves to in turn) and closes it at once.
// The connections take at most `within` in all (the name lookup before
// them may take longer when the resolver is slow). kRefused only when
// every address refused.
TcpProbe ProbeTcp(absl::string_view target, absl::Duration within);

// As ProbeTcp, but keeps the connection: on kAccepted *fd is the connected
// socket (blocking, close-on-exec), which the caller closes; otherwise -1.
TcpProbe ConnectTcp(absl::string_view target, absl::Duration within, int* fd);

// "host:port", "[v6]:port" or "dns:///host:port" -> host (without the
// brackets) and port; false when malformed.
bool SplitTarget(absl::string_view target, std::string* host, std::string* port);

}  // namespace taskgrid
