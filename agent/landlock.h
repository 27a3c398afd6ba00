// Confining a step with Landlock's scopes (Linux 6.12+, Landlock ABI 6):
// a process in the domain, and everything it starts, may neither signal
// nor connect to an abstract unix socket of any process outside the
// domain. So a step can reach its own processes only: not its supervisor
// (kill -9 or SIGSTOP of $PPID fail with EPERM), not the agent, not another
// task's steps or the sockets of the supervisors that keep steps through an
// agent's restart. Nothing else is restricted (files, network).
//
// Header-only, the C library only: the step supervisor applies it to the
// step between fork and exec; the agent asks whether the kernel has it.
// Debian 12's headers predate the scopes, so the ABI's values are here.
#pragma once

#include <errno.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace taskgrid::agent::landlock {

// include/uapi/linux/landlock.h, ABI 6.
inline constexpr uint32_t kCreateRulesetVersion = 1U << 0;
inline constexpr uint64_t kScopeAbstractUnixSocket = 1ULL << 0;
inline constexpr uint64_t kScopeSignal = 1ULL << 1;
inline constexpr int kScopesAbi = 6;

struct RulesetAttr {
  uint64_t handled_access_fs;
  uint64_t handled_access_net;
  uint64_t scoped;
};

// The kernel's Landlock ABI version; 0 when it has none (or it is off).
inline int Abi() {
#ifdef SYS_landlock_create_ruleset
  const long v = syscall(SYS_landlock_create_ruleset, nullptr, 0, kCreateRulesetVersion);
  return v > 0 ? static_cast<int>(v) : 0;
#else
  return 0;
#endif
}

inline bool ScopesAvailable() { return Abi() >= kScopesAbi; }

// Puts the calling process in a new domain scoped for signals and abstract
// unix sockets. A process without CAP_SYS_ADMIN needs no_new_privs for
// it, which is then set: setuid programs run from here on gain nothing.
// Returns 0 or the errno. Async-signal-safe (system calls only).
inline int ConfineScopes() {
#if defined(SYS_landlock_create_ruleset) && defined(SYS_landlock_restrict_self)
  RulesetAttr attr = {0, 0, kScopeAbstractUnixSocket | kScopeSignal};
  const long fd = syscall(SYS_landlock_create_ruleset, &attr, sizeof(attr), 0);
  if (fd < 0) return errno;
  long r = syscall(SYS_landlock_restrict_self, fd, 0);
  if (r != 0 && errno == EPERM) {
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    r = syscall(SYS_landlock_restrict_self, fd, 0);
  }
  const int err = r == 0 ? 0 : errno;
  close(static_cast<int>(fd));
  return err;
#else
  return ENOSYS;
#endif
}

}  // namespace taskgrid::agent::landlock
