// taskgrid-step-supervisor: the process between taskgrid-agent and one exec
// step (agent/step_supervisor.h says why and how it is started). It runs
// the step in a process group of its own and, as a child subreaper, keeps
// every process the step starts within its reach. It ends the step's whole
// tree with SIGKILL when
//   - the agent is gone (EOF on the lifeline pipe), or
//   - the step's main process ended (what it left running goes with it),
// then exits with the step's own status (the same exit code, or killed by
// the same signal), which is what the agent collects.
//
// SIGTERM, SIGINT, SIGHUP or SIGQUIT sent to the supervisor go on to the
// step's group as SIGTERM (with SIGCONT). The agent signals the step's
// group itself; it never kills the supervisor.
//
// An agent that restarts keeping its steps detaches first (kDetach): the
// lifeline's end then leaves the step running, the supervisor collecting
// its output, until a new agent connects to the socket named in the
// command or the deadline passes (agent/step_supervisor.h).
//
// Plain C++ and the C library only: it starts for every step, so it must be
// small and quick to load.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/landlock.h"
#include "agent/proc_tree.h"
#include "agent/step_supervisor.h"

extern char** environ;

namespace {

using taskgrid::agent::supervisor::Report;
namespace sv = taskgrid::agent::supervisor;

// Rounds of "find every descendant, SIGKILL it": a tree that keeps forking
// while it is killed is caught by the next round, since what it leaves
// orphaned comes to us.
constexpr int kKillRounds = 200;

bool ParseFd(const char* s, int* fd) {
  char* end = nullptr;
  errno = 0;
  const long v = strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < 0 || v > (1 << 24)) return false;
  *fd = static_cast<int>(v);
  return true;
}

void WriteReport(int fd, int stage, int value) {
  const Report r = {stage, value};
  ssize_t n;
  do {
    n = write(fd, &r, sizeof(r));
  } while (n < 0 && errno == EINTR);
}

// Kills the step's group and every process below us, until none is left
// (or kKillRounds), reaping them all.
void KillEverything(pid_t step_group) {
  // The group first, at once; its members are also found below, so it is
  // signalled only while its id is surely still in use.
  if (step_group > 0) kill(-step_group, SIGKILL);
  for (int round = 0; round < kKillRounds; ++round) {
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    // No child left means nothing below us either: whatever the step left
    // orphaned comes to us (we are its subreaper). The common case, a step
    // that left nothing behind, ends here without reading /proc.
    siginfo_t info;
    memset(&info, 0, sizeof(info));
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 && errno == ECHILD) break;
    const std::vector<pid_t> live = taskgrid::agent::proc::LiveDescendants(getpid());
    if (live.empty()) break;
    for (pid_t p : live) kill(p, SIGKILL);
    // Give the killed a moment to become zombies we can reap.
    for (int i = 0; i < 50; ++i) {
      int status;
      const pid_t r = waitpid(-1, &status, WNOHANG);
      if (r > 0) continue;
      if (r < 0) break;  // no children left
      usleep(1000);
    }
  }
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

// Exits as the step did: the same code, or killed by the same signal.
[[noreturn]] void ExitLike(int status) {
  if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);  // the step's core, if any, is its own
    signal(sig, SIG_DFL);
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, sig);
    sigprocmask(SIG_UNBLOCK, &only, nullptr);
    kill(getpid(), sig);
    _exit(128 + sig);
  }
  _exit(125);
}

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

bool SendFrame(int fd, int32_t type, const void* data, size_t len) {
  const sv::FrameHeader h = {type, static_cast<int32_t>(len)};
  return sv::SendAll(fd, &h, sizeof(h)) && (len == 0 || sv::SendAll(fd, data, len));
}

// The last `cap` bytes of a stream, and how many before them were dropped.
struct Tail {
  size_t cap = 0;
  std::string buf;
  int64_t skipped = 0;
  void Add(const char* data, size_t n) {
    buf.append(data, n);
    if (buf.size() > 2 * cap + 1) {
      const size_t drop = buf.size() - cap;
      skipped += static_cast<int64_t>(drop);
      buf.erase(0, drop);
    }
  }
  void Trim() {
    if (buf.size() <= cap) return;
    skipped += static_cast<int64_t>(buf.size() - cap);
    buf.erase(0, buf.size() - cap);
  }
};

// A listening abstract unix socket named `name`, or -1.
int Listen(const char* name) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  const size_t len = strnlen(name, sizeof(addr.sun_path) - 2);
  memcpy(addr.sun_path + 1, name, len);  // sun_path[0] == '\0': abstract
  const socklen_t addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + len);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0 || listen(fd, 4) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// The step, from fork() to exec.
[[noreturn]] void ExecStep(pid_t supervisor, int go, int lifeline, int report, int out_read,
                           int err_read, const std::vector<char*>& candidates, char* shell,
                           bool confine, char** argv) {
  setpgid(0, 0);
  // Nothing of the step runs before the supervisor has told the agent the
  // step's pid and let go of the report pipe (EOF here): a step that stops
  // its supervisor at once must not catch it holding the pipe the agent
  // waits on.
  char byte;
  while (read(go, &byte, 1) < 0 && errno == EINTR) {
  }
  close(go);
  // If the supervisor is killed from outside, the step's main process goes
  // too (a last resort: the supervisor is what finds the rest).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != supervisor) _exit(127);
  close(lifeline);
  close(out_read);
  close(err_read);
  signal(SIGPIPE, SIG_DFL);
  // Before anything of the step runs: it may reach its own processes only.
  if (confine) {
    if (const int err = taskgrid::agent::landlock::ConfineScopes(); err != 0) {
      WriteReport(report, sv::kConfineFailed, err);
      _exit(127);
    }
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);

  // The PATH search of execvp(), over the candidates the agent computed.
  int err = ENOENT;
  bool saw_eacces = false;
  for (char* candidate : candidates) {
    execve(candidate, argv, environ);
    err = errno;
    if (err == ENOEXEC) {  // no "#!": run it with the shell, as execvp() does
      std::vector<char*> shell_argv = {shell, candidate};
      for (char** a = argv + 1; *a != nullptr; ++a) shell_argv.push_back(*a);
      shell_argv.push_back(nullptr);
      execve(shell, shell_argv.data(), environ);
      err = ENOEXEC;
      break;
    }
    if (err == EACCES) {
      saw_eacces = true;
      continue;
    }
    if (err != ENOENT && err != ENOTDIR && err != ESTALE && err != ENODEV && err != ETIMEDOUT &&
        err != ELOOP && err != ENAMETOOLONG) {
      break;
    }
  }
  WriteReport(report, sv::kExec, saw_eacces ? EACCES : err);
  _exit(127);
}

}  // namespace

int main(int argc, char** argv) {
  int lifeline = -1;
  int report = -1;
  int out_fd = -1;
  int err_fd = -1;
  long count = -1;
  if (argc > sv::kArgCount) count = strtol(argv[sv::kArgCount], nullptr, 10);
  const int argv_at = sv::kArgCount + 1 + static_cast<int>(count) + 1;  // after "--"
  if (argc <= sv::kArgCount || !ParseFd(argv[sv::kArgLifeline], &lifeline) ||
      !ParseFd(argv[sv::kArgReport], &report) || !ParseFd(argv[sv::kArgStdout], &out_fd) ||
      !ParseFd(argv[sv::kArgStderr], &err_fd) || count < 1 || argv_at >= argc ||
      strcmp(argv[argv_at - 1], "--") != 0) {
    fprintf(stderr,
            "%s runs one step for taskgrid-agent, which starts it; it is not meant to be run "
            "by hand\n",
            sv::kBinaryName);
    return 125;
  }
  for (int fd : {report, lifeline, out_fd, err_fd}) fcntl(fd, F_SETFD, FD_CLOEXEC);
  std::vector<char*> candidates(argv + sv::kArgCount + 1, argv + sv::kArgCount + 1 + count);
  char* shell = argv[sv::kArgShell];
  const bool confine = strcmp(argv[sv::kArgConfine], sv::kConfine) == 0;
  char** step_argv = argv + argv_at;

  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    WriteReport(report, sv::kSupervisor, errno);
    return 125;
  }
  signal(SIGPIPE, SIG_IGN);
  sigset_t handled;
  sigemptyset(&handled);
  for (int sig : {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGQUIT}) sigaddset(&handled, sig);
  sigprocmask(SIG_BLOCK, &handled, nullptr);
  const int sigfd = signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sigfd < 0) {
    WriteReport(report, sv::kSupervisor, errno);
    return 125;
  }

  const pid_t self = getpid();
  int go[2];
  if (pipe2(go, O_CLOEXEC) != 0) {
    WriteReport(report, sv::kSupervisor, errno);
    return 125;
  }
  const pid_t step = fork();
  if (step < 0) {
    WriteReport(report, sv::kSupervisor, errno);
    return 125;
  }
  if (step == 0) {
    close(go[1]);
    ExecStep(self, go[0], lifeline, report, out_fd, err_fd, candidates, shell, confine, step_argv);
  }
  close(go[0]);
  setpgid(step, step);  // as the step does: the group exists before anyone signals it
  WriteReport(report, sv::kRunning, step);
  close(report);
  close(go[1]);  // the step may run now
  // The step holds stdin, stdout and stderr; we keep none of them open, so
  // the agent sees EOF on the step's output when the step's processes end.
  const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd >= 0) {
    for (int fd = 0; fd < 3; ++fd) dup2(null_fd, fd);
    if (null_fd > 2) close(null_fd);
  }
  for (int fd : {out_fd, err_fd}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);

  // kAttached: an agent reads the output and waits for us (the first one,
  // our parent, through the lifeline pipe pair; a later one through the
  // socket it connected to: then the output and the status go to it as
  // frames). kDetached: no agent; we keep the output's tails and listen.
  enum { kAttached, kDetached } mode = kAttached;
  bool by_socket = false;  // the lifeline is a connection a later agent made
  int listen_fd = -1;
  sv::Command detach;
  bool detach_set = false;
  int64_t fence_ns = 0;  // the agent's lease (kFence); 0: none
  bool step_done = false;
  int step_status = 0;
  int64_t drain_until = 0;  // once the step ended: how long to wait for output EOF
  Tail tails[2];
  int outs[2] = {out_fd, err_fd};
  std::string commands;
  // kSecret: what a later agent must send first (empty: any agent of our
  // user is let in, as from an agent before secrets).
  std::string secret;
  // kStopAt: the step's own deadline and kill grace, kept while no agent
  // is attached; stop_began: when we sent SIGTERM for it (0: not yet);
  // term_sent: a SIGTERM went to the step already (ours or an agent's).
  int64_t stop_at_ns = 0;
  int64_t grace_ns = 0;
  int64_t stop_began = 0;
  bool term_sent = false;
  bool timed_out = false;
  // Connections to the socket that have not yet proven the secret, each
  // with until when it may take to.
  struct Pending {
    int fd;
    int64_t until;
    std::string got;
  };
  std::vector<Pending> pending;
  constexpr size_t kMaxPending = 4;
  constexpr int64_t kProveWithinNs = 2000LL * 1000000;

  auto term_step = [&]() {
    if (step_done || term_sent) return;
    term_sent = true;
    kill(-step, SIGTERM);
    kill(-step, SIGCONT);  // a stopped process must run to see SIGTERM
  };
  // The agent that started us is told that everything below us is gone.
  auto say_gone = [&]() {
    if (lifeline >= 0 && !by_socket) SendFrame(lifeline, sv::kGone, nullptr, 0);
  };
  // The step and what it left are killed; we exit as the step did (or as
  // killed, when it had not ended).
  auto end_all = [&]() {
    KillEverything(step);
    say_gone();
    if (step_done && !by_socket) ExitLike(step_status);
    _exit(128 + SIGKILL);
  };
  auto close_output = [&](int i) {
    close(outs[i]);
    outs[i] = -1;
  };
  // Reads what the agent wrote; false when the lifeline ended.
  auto read_commands = [&]() -> bool {
    char buf[512];
    for (;;) {
      const ssize_t n = recv(lifeline, buf, sizeof(buf), MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n <= 0) return false;
      commands.append(buf, static_cast<size_t>(n));
      while (commands.size() >= sizeof(sv::Command)) {
        sv::Command c;
        memcpy(&c, commands.data(), sizeof(c));
        commands.erase(0, sizeof(c));
        if (c.type == sv::kSecret) {
          secret.assign(c.name, sv::kSecretBytes);
          continue;
        }
        if (c.type == sv::kStopAt) {
          stop_at_ns = c.deadline_ns;
          grace_ns = c.tail_bytes > 0 ? c.tail_bytes : 0;
          continue;
        }
        c.name[sizeof(c.name) - 1] = '\0';
        if (c.type == sv::kDetach) {
          // Listening before the answer, so the next agent, which may come
          // as soon as this one has gone, never finds nobody there. (It is
          // accepted only once this agent's lifeline has ended.) No socket:
          // no answer, and the step stays this agent's until it ends.
          if (listen_fd >= 0) close(listen_fd);
          listen_fd = Listen(c.name);
          if (listen_fd < 0) continue;
          detach = c;
          detach_set = true;
          fence_ns = 0;  // the next agent's lease, if one comes, is its own
          // From now on the output is kept here, not sent: the agent took
          // what it had into the kept file before it asked.
          for (Tail& t : tails) t.cap = static_cast<size_t>(c.tail_bytes > 0 ? c.tail_bytes : 0);
          if (!SendFrame(lifeline, sv::kDetached, nullptr, 0)) return false;
        } else if (c.type == sv::kTerm && !step_done) {
          term_step();
        } else if (c.type == sv::kKill && !step_done) {
          kill(-step, SIGKILL);
        } else if (c.type == sv::kFence) {
          fence_ns = c.deadline_ns;
        }
      }
    }
  };
  // The lifeline ended: detach as asked, else end it all.
  auto lifeline_ended = [&]() {
    close(lifeline);
    lifeline = -1;
    by_socket = false;
    commands.clear();
    if (!detach_set || listen_fd < 0 || MonotonicNs() >= detach.deadline_ns) end_all();
    detach_set = false;
    mode = kDetached;
    for (Tail& t : tails)
      t.cap = static_cast<size_t>(detach.tail_bytes > 0 ? detach.tail_bytes : 0);
  };
  // `c`, a connection that proved itself, is the lifeline from now on.
  auto attach = [&](int c) {
    for (const Pending& p : pending) {
      if (p.fd != c) close(p.fd);
    }
    pending.clear();
    close(listen_fd);
    listen_fd = -1;
    lifeline = c;
    by_socket = true;
    mode = kAttached;
    for (Tail& t : tails) t.Trim();
    const int64_t skipped[2] = {tails[0].skipped, tails[1].skipped};
    bool ok = SendFrame(c, sv::kSkipped, skipped, sizeof(skipped)) &&
              SendFrame(c, sv::kStdout, tails[0].buf.data(), tails[0].buf.size()) &&
              SendFrame(c, sv::kStderr, tails[1].buf.data(), tails[1].buf.size());
    for (Tail& t : tails) t = Tail{};
    if (!ok) lifeline_ended();
  };
  // Whether `got` (a whole command) is kSecret with our secret: compared in
  // time that does not depend on where they differ.
  auto proves = [&](const std::string& got) {
    sv::Command c;
    memcpy(&c, got.data(), sizeof(c));
    if (c.type != sv::kSecret || secret.size() != sv::kSecretBytes) return false;
    unsigned char diff = 0;
    for (size_t i = 0; i < sv::kSecretBytes; ++i) {
      diff |= static_cast<unsigned char>(c.name[i] ^ secret[i]);
    }
    return diff == 0;
  };
  // A re-attached agent has everything: the status goes, and we are done.
  auto maybe_finish = [&]() {
    if (mode != kAttached || !by_socket || !step_done) return;
    if ((outs[0] >= 0 || outs[1] >= 0) && MonotonicNs() < drain_until) return;
    if (timed_out) SendFrame(lifeline, sv::kTimedOut, nullptr, 0);
    SendFrame(lifeline, sv::kExit, &step_status, sizeof(step_status));
    _exit(0);
  };
  auto until_ms = [](int64_t at, int64_t now) {
    return static_cast<int>(
        std::min<int64_t>(std::max<int64_t>(0, (at - now) / 1000000 + 1), 3600 * 1000));
  };

  for (;;) {
    pollfd fds[5 + kMaxPending];
    nfds_t nfds = 0;
    int at_line = -1, at_listen = -1, at_out[2] = {-1, -1};
    if (lifeline >= 0) {
      at_line = static_cast<int>(nfds);
      fds[nfds++] = {lifeline, POLLIN, 0};
    }
    if (listen_fd >= 0 && mode == kDetached && pending.size() < kMaxPending) {
      at_listen = static_cast<int>(nfds);
      fds[nfds++] = {listen_fd, POLLIN, 0};
    }
    const int at_pending = static_cast<int>(nfds);
    for (const Pending& p : pending) fds[nfds++] = {p.fd, POLLIN, 0};
    const int at_sig = static_cast<int>(nfds);
    fds[nfds++] = {sigfd, POLLIN, 0};
    // The first agent reads the output itself.
    if (mode == kDetached || by_socket) {
      for (int i = 0; i < 2; ++i) {
        if (outs[i] < 0) continue;
        at_out[i] = static_cast<int>(nfds);
        fds[nfds++] = {outs[i], POLLIN, 0};
      }
    }
    int timeout_ms = -1;
    auto wake_by = [&timeout_ms](int ms) {
      timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    };
    const int64_t now = MonotonicNs();
    // An agent that lets its lease pass without moving it is not running
    // (frozen): by now the scheduler may give the task to another agent.
    if (mode == kAttached && !detach_set && fence_ns > 0 && !step_done) {
      if (now >= fence_ns) end_all();
      wake_by(until_ms(fence_ns, now));
    }
    if (mode == kDetached) {
      if (now >= detach.deadline_ns) end_all();  // nobody came back for it
      wake_by(until_ms(detach.deadline_ns, now));
      // No agent to stop the step at its own deadline: we do, as it would.
      if (!step_done && stop_at_ns > 0 && stop_began == 0) {
        if (now >= stop_at_ns) {
          stop_began = now;
          timed_out = true;
          term_sent = false;  // ours, whatever an agent sent before
          term_step();
        } else {
          wake_by(until_ms(stop_at_ns, now));
        }
      }
    }
    // A stop we began ends with SIGKILL after the grace, agent or none.
    if (!step_done && stop_began > 0) {
      if (now >= stop_began + grace_ns) {
        kill(-step, SIGKILL);
        stop_began = -1;  // sent
      } else {
        wake_by(until_ms(stop_began + grace_ns, now));
      }
    }
    for (size_t i = 0; i < pending.size();) {
      if (now >= pending[i].until) {
        close(pending[i].fd);  // did not prove itself in time
        pending.erase(pending.begin() + static_cast<ptrdiff_t>(i));
        continue;
      }
      wake_by(until_ms(pending[i].until, now));
      ++i;
    }
    if (step_done && by_socket) wake_by(until_ms(drain_until, now));
    if (poll(fds, nfds, timeout_ms) < 0) {
      if (errno == EINTR) continue;
      end_all();  // cannot watch any more: end it all rather than leave it unwatched
    }
    if (at_line >= 0 && fds[at_line].revents != 0 && !read_commands()) lifeline_ended();
    // Connections waiting to prove themselves: the first whole command
    // decides (the list may change as one is let in).
    const size_t pending_polled = pending.size();
    std::vector<int> ready_fds;
    for (size_t i = 0; i < pending_polled; ++i) {
      if (fds[at_pending + static_cast<int>(i)].revents != 0) ready_fds.push_back(pending[i].fd);
    }
    for (int fd : ready_fds) {
      auto it = std::find_if(pending.begin(), pending.end(),
                             [fd](const Pending& p) { return p.fd == fd; });
      if (it == pending.end()) continue;
      char buf[sizeof(sv::Command)];
      const size_t want = sizeof(sv::Command) - it->got.size();
      const ssize_t n = recv(fd, buf, want, MSG_DONTWAIT);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (n > 0) it->got.append(buf, static_cast<size_t>(n));
      if (n > 0 && it->got.size() < sizeof(sv::Command)) continue;
      if (n > 0 && proves(it->got)) {
        attach(fd);
        break;
      }
      close(fd);  // gone, or not the agent: the socket listens on
      pending.erase(it);
    }
    if (at_listen >= 0 && fds[at_listen].revents != 0 && listen_fd >= 0) {
      const int c = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      ucred cred;
      socklen_t cred_len = sizeof(cred);
      if (c >= 0 && getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) == 0 &&
          cred.uid == getuid()) {
        if (secret.empty()) {
          attach(c);
        } else {
          pending.push_back({c, MonotonicNs() + kProveWithinNs, std::string()});
        }
      } else if (c >= 0) {
        close(c);  // another user's process: not the agent
      }
    }
    for (int i = 0; i < 2; ++i) {
      if (at_out[i] < 0 || fds[at_out[i]].revents == 0 || outs[i] < 0) continue;
      char buf[64 << 10];
      const ssize_t n = read(outs[i], buf, sizeof(buf));
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        close_output(i);
      } else if (mode == kDetached || detach_set) {
        tails[i].Add(buf, static_cast<size_t>(n));
      } else if (!SendFrame(lifeline, i == 0 ? sv::kStdout : sv::kStderr, buf,
                            static_cast<size_t>(n))) {
        lifeline_ended();
      }
    }
    if (fds[at_sig].revents != 0) {
      signalfd_siginfo si;
      bool child_ended = false;
      while (read(sigfd, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
        if (si.ssi_signo == SIGCHLD) {
          child_ended = true;
        } else if (!step_done) {
          kill(-step, SIGTERM);
          kill(-step, SIGCONT);  // a stopped process must run to see SIGTERM
        }
      }
      // Every child that ended: the step's end ends it all; the others are
      // orphans of the step that ended on their own.
      while (child_ended) {
        siginfo_t info;
        memset(&info, 0, sizeof(info));
        if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) break;
        if (info.si_pid == step && !step_done) {
          waitpid(step, &step_status, 0);
          step_done = true;
          KillEverything(step);
          drain_until = MonotonicNs() + 500 * 1000000LL;
          if (mode == kAttached && !by_socket) {
            // The first agent waits for our exit. A detach it asked for
            // meanwhile keeps the status for the next agent instead.
            if (lifeline >= 0 && !read_commands()) lifeline_ended();
            if (mode == kAttached && !detach_set) {
              say_gone();
              ExitLike(step_status);
            }
          }
          break;
        }
        waitpid(info.si_pid, nullptr, 0);
      }
    }
    maybe_finish();
  }
}
