#include "common/tcp_probe.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <string>

#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace taskgrid {
namespace {

// One address: kAccepted (*fd the connected socket, blocking), kRefused,
// or kNoAnswer by `deadline` (*fd -1).
TcpProbe ConnectOne(const addrinfo& ai, absl::Time deadline, int* fd_out) {
  *fd_out = -1;
  const int fd =
      socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai.ai_protocol);
  if (fd < 0) return TcpProbe::kNoAnswer;
  TcpProbe result = TcpProbe::kNoAnswer;
  if (connect(fd, ai.ai_addr, ai.ai_addrlen) == 0) {
    result = TcpProbe::kAccepted;
  } else if (errno == ECONNREFUSED) {
    result = TcpProbe::kRefused;
  } else if (errno == EINPROGRESS) {
    for (;;) {
      const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (left_ms <= 0) break;
      pollfd p = {fd, POLLOUT, 0};
      const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 60'000)));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) break;
      int err = 0;
      socklen_t len = sizeof(err);
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) break;
      if (err == 0) result = TcpProbe::kAccepted;
      if (err == ECONNREFUSED) result = TcpProbe::kRefused;
      break;
    }
  }
  if (result == TcpProbe::kAccepted) {
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    *fd_out = fd;
  } else {
    close(fd);
  }
  return result;
}

}  // namespace

bool SplitTarget(absl::string_view target, std::string* host, std::string* port) {
  absl::ConsumePrefix(&target, "dns:///");
  const size_t colon = target.rfind(':');
  if (colon == absl::string_view::npos || colon + 1 == target.size()) return false;
  absl::string_view h = target.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  *host = std::string(h);
  *port = std::string(target.substr(colon + 1));
  return !host->empty();
}

TcpProbe ProbeTcp(absl::string_view target, absl::Duration within) {
  int fd = -1;
  const TcpProbe result = ConnectTcp(target, within, &fd);
  if (fd >= 0) close(fd);
  return result;
}

TcpProbe ConnectTcp(absl::string_view target, absl::Duration within, int* fd) {
  *fd = -1;
  const absl::Time deadline = absl::Now() + within;
  std::string host, port;
  if (!SplitTarget(target, &host, &port)) return TcpProbe::kNoAnswer;
  // A resolver that does not answer can make the lookup itself take longer
  // than `within`; the connections after it keep to the deadline.
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    return TcpProbe::kNoAnswer;
  }
  bool all_refused = true;
  TcpProbe result = TcpProbe::kNoAnswer;
  for (const addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    if (absl::Now() >= deadline) {
      all_refused = false;
      break;
    }
    const TcpProbe one = ConnectOne(*ai, deadline, fd);
    if (one == TcpProbe::kAccepted) {
      result = TcpProbe::kAccepted;
      all_refused = false;
      break;
    }
    if (one != TcpProbe::kRefused) all_refused = false;
  }
  freeaddrinfo(res);
  if (result == TcpProbe::kAccepted) return result;
  return all_refused ? TcpProbe::kRefused : TcpProbe::kNoAnswer;
}

}  // namespace taskgrid
