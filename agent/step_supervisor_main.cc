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
// Plain C++ and the C library only: it starts for every step, so it must be
// small and quick to load.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <unordered_map>
#include <vector>

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

// The parent and state of `pid` from /proc/PID/stat; false when it is gone.
bool ReadStat(pid_t pid, pid_t* ppid, char* state) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  // The name may hold spaces and parentheses: the fields start after the
  // last ')'.
  const char* close_paren = strrchr(buf, ')');
  if (close_paren == nullptr) return false;
  int parent = 0;
  if (sscanf(close_paren + 1, " %c %d", state, &parent) != 2) return false;
  *ppid = parent;
  return true;
}

// Every process below `root` that has not ended (zombies left out), found
// by the parent links in /proc.
std::vector<pid_t> LiveDescendants(pid_t root) {
  std::unordered_map<pid_t, std::vector<pid_t>> children;
  std::unordered_map<pid_t, char> states;
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return {};
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long pid = strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || pid <= 0) continue;
    pid_t ppid = 0;
    char state = '?';
    if (!ReadStat(static_cast<pid_t>(pid), &ppid, &state)) continue;
    children[ppid].push_back(static_cast<pid_t>(pid));
    states[static_cast<pid_t>(pid)] = state;
  }
  closedir(dir);
  std::vector<pid_t> live;
  std::vector<pid_t> todo = {root};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    auto it = children.find(p);
    if (it == children.end()) continue;
    for (pid_t c : it->second) {
      if (states[c] != 'Z') live.push_back(c);
      todo.push_back(c);
    }
  }
  return live;
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
    const std::vector<pid_t> live = LiveDescendants(getpid());
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

// The step, from fork() to exec.
[[noreturn]] void ExecStep(pid_t supervisor, int lifeline, int report,
                           const std::vector<char*>& candidates, char* shell, char** argv) {
  setpgid(0, 0);
  // If the supervisor is killed from outside, the step's main process goes
  // too (a last resort: the supervisor is what finds the rest).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != supervisor) _exit(127);
  close(lifeline);
  signal(SIGPIPE, SIG_DFL);
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
  long count = -1;
  if (argc > sv::kArgCount) count = strtol(argv[sv::kArgCount], nullptr, 10);
  const int argv_at = sv::kArgCount + 1 + static_cast<int>(count) + 1;  // after "--"
  if (argc <= sv::kArgCount || !ParseFd(argv[sv::kArgLifeline], &lifeline) ||
      !ParseFd(argv[sv::kArgReport], &report) || count < 1 || argv_at >= argc ||
      strcmp(argv[argv_at - 1], "--") != 0) {
    fprintf(stderr,
            "%s runs one step for taskgrid-agent, which starts it; it is not meant to be run "
            "by hand\n",
            sv::kBinaryName);
    return 125;
  }
  fcntl(report, F_SETFD, FD_CLOEXEC);
  fcntl(lifeline, F_SETFD, FD_CLOEXEC);
  std::vector<char*> candidates(argv + sv::kArgCount + 1, argv + sv::kArgCount + 1 + count);
  char* shell = argv[sv::kArgShell];
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
  const pid_t step = fork();
  if (step < 0) {
    WriteReport(report, sv::kSupervisor, errno);
    return 125;
  }
  if (step == 0) ExecStep(self, lifeline, report, candidates, shell, step_argv);
  setpgid(step, step);  // as the step does: the group exists before anyone signals it
  WriteReport(report, sv::kRunning, step);
  close(report);
  // The step holds stdin, stdout and stderr; we keep none of them open, so
  // the agent sees EOF on the step's output when the step's processes end.
  const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd >= 0) {
    for (int fd = 0; fd < 3; ++fd) dup2(null_fd, fd);
    if (null_fd > 2) close(null_fd);
  }

  for (;;) {
    pollfd fds[2] = {{lifeline, POLLIN, 0}, {sigfd, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;  // cannot watch any more: end it all rather than leave it unwatched
    }
    if (fds[0].revents != 0) {
      char byte;
      const ssize_t n = read(lifeline, &byte, 1);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
        // The agent is gone: nobody will collect what the step does, and
        // the scheduler will give the task to another agent.
        KillEverything(step);
        _exit(128 + SIGKILL);
      }
    }
    if (fds[1].revents != 0) {
      signalfd_siginfo si;
      bool child_ended = false;
      while (read(sigfd, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
        if (si.ssi_signo == SIGCHLD) {
          child_ended = true;
        } else {
          kill(-step, SIGTERM);
          kill(-step, SIGCONT);  // a stopped process must run to see SIGTERM
        }
      }
      if (!child_ended) continue;
      // Every child that ended: the step's end ends it all; the others are
      // orphans of the step that ended on their own.
      for (;;) {
        siginfo_t info;
        memset(&info, 0, sizeof(info));
        if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) break;
        if (info.si_pid == step) {
          int status = 0;
          waitpid(step, &status, 0);
          KillEverything(step);
          ExitLike(status);
        }
        waitpid(info.si_pid, nullptr, 0);
      }
    }
  }
  KillEverything(step);
  _exit(125);
}
