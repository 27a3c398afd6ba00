// Listen addresses as gRPC spells them ("host:port", "[v6]:port",
// "unix:/path"): which ones only this machine can reach.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace taskgrid {

// True for loopback hosts (127.0.0.0/8, ::1, localhost) and Unix sockets;
// false for the wildcard (0.0.0.0, ::, empty host) and every other host.
bool IsLoopbackAddress(absl::string_view address);

// `flag` when given; else the environment variable `env` when set and not
// empty; else `fallback`. How every binary reads TASKGRID_ADDR and
// TASKGRID_DATA_DIR.
std::string FlagOrEnv(const std::string& flag, const char* env, absl::string_view fallback);

// Where taskgrid-scheduler listens and where the others find it, when
// neither a flag nor TASKGRID_ADDR says.
inline constexpr char kDefaultAddress[] = "127.0.0.1:7070";

// The address a scheduler that listens on `listen` and got `port` tells
// others to use: the listen host with the port it got, or this machine's
// host name when it listens on every interface (0.0.0.0, [::], no host).
std::string AdvertisedAddress(absl::string_view listen, int port);

// Where agents and clients look for the scheduler that leads: the
// addresses of a scheduler and its standbys ("a:7070,b:7070"), and which
// one to use now. The first address is used first. A standby answers
// UNAVAILABLE naming the leader (kLeaderKey, common/grpc_status.h): that
// one is next. An address that did not answer at all is marked silent and
// the next address not so marked is next; a silent leader that a standby
// names is not gone back to at once (the standby is asked once more, and
// may lead by then), but is tried again after that.
// Not thread-safe.
class SchedulerAddresses {
 public:
  // "HOST:PORT[,HOST:PORT...]"; an empty entry is an error.
  static absl::StatusOr<SchedulerAddresses> Parse(absl::string_view list);
  // Parse() of a list its caller checked already: a bad one is a bug
  // (logged, then abort). `what` names it in the log line.
  static SchedulerAddresses ParseChecked(absl::string_view list, absl::string_view what);

  const std::string& current() const { return list_[current_]; }
  const std::vector<std::string>& all() const { return list_; }
  size_t size() const { return list_.size(); }
  // The list as given, for messages ("a:7070,b:7070").
  std::string text() const;

  // The call to current() failed. `leader`: the address its answer named
  // as the leader, when it was a standby's; "" when it did not answer (it
  // is then marked silent). The leader named becomes current (added to the
  // list when new) unless it is current() or silent; else the next address
  // in turn that is not silent (all silent: every mark is dropped).
  void Failed(absl::string_view leader);
  // The call to current() got an answer: it is not silent.
  void Answered() { silent_[current_] = false; }

 private:
  explicit SchedulerAddresses(std::vector<std::string> list)
      : list_(std::move(list)), silent_(list_.size(), false) {}
  std::vector<std::string> list_;
  std::vector<bool> silent_;  // per list_ entry
  size_t current_ = 0;
};

}  // namespace taskgrid
