#include "common/address.h"

#include <arpa/inet.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace taskgrid {

bool IsLoopbackAddress(absl::string_view address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) {
    return true;
  }
  absl::string_view host = address;
  if (absl::StartsWith(host, "[")) {
    const size_t close = host.find(']');
    if (close == absl::string_view::npos) return false;
    host = host.substr(1, close - 1);
  } else if (const size_t colon = host.rfind(':'); colon != absl::string_view::npos) {
    host = host.substr(0, colon);
  }
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  const std::string h(host);
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

std::string FlagOrEnv(const std::string& flag, const char* env, absl::string_view fallback) {
  if (!flag.empty()) return flag;
  const char* value = std::getenv(env);
  return value != nullptr && *value != '\0' ? std::string(value) : std::string(fallback);
}

std::string AdvertisedAddress(absl::string_view listen, int port) {
  std::string host(listen.substr(0, std::min(listen.size(), listen.rfind(':'))));
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "[::0]") {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    host = name;
  }
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<SchedulerAddresses> SchedulerAddresses::Parse(absl::string_view list) {
  std::vector<std::string> out;
  for (absl::string_view a : absl::StrSplit(list, ',')) {
    a = absl::StripAsciiWhitespace(a);
    if (a.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", list, "' has an empty address: give HOST:PORT[,HOST:PORT...]"));
    }
    out.emplace_back(a);
  }
  return SchedulerAddresses(std::move(out));
}

SchedulerAddresses SchedulerAddresses::ParseChecked(absl::string_view list,
                                                    absl::string_view what) {
  absl::StatusOr<SchedulerAddresses> a = Parse(list);
  if (!a.ok()) {
    spdlog::critical("{}: {}", std::string(what), std::string(a.status().message()));
    std::abort();
  }
  return *std::move(a);
}

std::string SchedulerAddresses::text() const { return absl::StrJoin(list_, ","); }

void SchedulerAddresses::Failed(absl::string_view leader) {
  if (leader.empty()) {
    silent_[current_] = true;
  } else {
    silent_[current_] = false;  // a standby: it answered
    if (leader != current()) {
      size_t i = 0;
      while (i < list_.size() && list_[i] != leader) ++i;
      if (i == list_.size()) {
        list_.emplace_back(leader);
        silent_.push_back(false);
      }
      if (!silent_[i]) {
        current_ = i;
        return;
      }
      // Silent when last tried: this standby once more first.
      silent_[i] = false;
      return;
    }
  }
  for (size_t step = 1; step <= list_.size(); ++step) {
    const size_t next = (current_ + step) % list_.size();
    if (!silent_[next]) {
      current_ = next;
      return;
    }
  }
  silent_.assign(list_.size(), false);
  current_ = (current_ + 1) % list_.size();
}

}  // namespace taskgrid
