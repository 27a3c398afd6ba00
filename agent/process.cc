#include "agent/process.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/proc_tree.h"
#include "agent/step_supervisor.h"
#include "common/clock.h"
#include "spdlog/spdlog.h"

namespace taskgrid::agent::internal {
namespace {

constexpr size_t kIoChunk = 64 << 10;
// Once the child ended and its group was killed, how long to wait for EOF on
// its output pipes: a process that left the group may still hold them.
constexpr absl::Duration kDrainLimit = absl::Milliseconds(500);
// Poll period when no fd tells us about the child's end or about Cancel().
constexpr absl::Duration kFallbackPoll = absl::Milliseconds(20);
// After the step's group was killed, how long its supervisor may take to
// end (it is woken with SIGCONT, in case the step stopped it) before it is
// killed too, and what it had below it with it (KillOrphans).
constexpr absl::Duration kSupervisorGrace = absl::Seconds(1);

namespace sv = supervisor;

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }
  void Reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

absl::Duration Now() { return RealClock::Get()->Monotonic(); }

std::string ErrnoText(int err) {
  char buf[128];
  return strerror_r(err, buf, sizeof(buf));  // the GNU variant: returns the text
}

// Both ends close-on-exec and above 2, so that the child's dup2() calls onto
// 0, 1 and 2 cannot overwrite one it still needs (only an agent started
// with stdio closed gets such low numbers). `fds` as pipe2() or
// socketpair() made them (or failed: `made` false).
bool TakePair(bool made, int fds[2], Fd* first, Fd* second) {
  if (!made) return false;
  for (int i = 0; i < 2; ++i) {
    if (fds[i] < 3) {
      const int moved = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
      ::close(fds[i]);
      fds[i] = moved;
    }
  }
  first->Reset(fds[0]);
  second->Reset(fds[1]);
  return fds[0] >= 0 && fds[1] >= 0;
}

bool MakePipe(Fd* read_end, Fd* write_end) {
  int fds[2];
  return TakePair(pipe2(fds, O_CLOEXEC) == 0, fds, read_end, write_end);
}

// A unix socket pair, both ends as MakePipe's: the lifeline, which the
// supervisor answers on.
bool MakeSocketPair(Fd* agent_end, Fd* supervisor_end) {
  int fds[2];
  return TakePair(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0, fds, agent_end,
                  supervisor_end);
}

// Frames from a supervisor, as they arrive on its socket.
class FrameReader {
 public:
  // Reads what is there (non-blocking); false on EOF or an error.
  bool Fill(int fd) {
    char buf[64 << 10];
    for (;;) {
      const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n <= 0) return false;
      data_.append(buf, static_cast<size_t>(n));
      if (static_cast<size_t>(n) < sizeof(buf)) return true;
    }
  }
  // The next whole frame, if one is in.
  bool Next(sv::FrameHeader* h, std::string* body) {
    if (data_.size() - pos_ < sizeof(*h)) return Compact();
    memcpy(h, data_.data() + pos_, sizeof(*h));
    if (h->len < 0 || data_.size() - pos_ - sizeof(*h) < static_cast<size_t>(h->len)) {
      return Compact();
    }
    body->assign(data_, pos_ + sizeof(*h), static_cast<size_t>(h->len));
    pos_ += sizeof(*h) + static_cast<size_t>(h->len);
    return true;
  }

 private:
  bool Compact() {
    data_.erase(0, pos_);
    pos_ = 0;
    return false;
  }
  std::string data_;
  size_t pos_ = 0;
};

void SetNonBlocking(const Fd& fd) {
  if (!fd.ok()) return;
  const int flags = fcntl(fd.get(), F_GETFL);
  if (flags >= 0) fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK);
}

// Blocks SIGPIPE in this thread while it lives: a write to a stdin pipe the
// child closed then fails with EPIPE instead of killing the agent. The
// signal a failed write leaves pending is taken back by Consume().
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~ScopedSigpipeBlock() {
    if (sigismember(&old_, SIGPIPE)) return;
    Consume();
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

  void Consume() {
    const timespec zero = {0, 0};
    while (sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
    }
  }

 private:
  sigset_t pipe_;
  sigset_t old_;
};

// Everything the child needs, prepared before fork(): between fork() and
// exec the child of a multithreaded process may only make async-signal-safe
// calls, so it must not allocate. The child execs the step supervisor
// (agent/step_supervisor.h), which runs the program.
struct ExecPlan {
  std::vector<std::string> strings;  // what argv points into
  std::vector<char*> argv;           // the supervisor's, null-terminated
  std::vector<char*> envp;           // null-terminated
  const char* supervisor = nullptr;
  const char* cwd = nullptr;
  int max_fd = 1024;  // for closing fds when close_range() is missing
};

char* Mutable(const std::string& s) { return const_cast<char*>(s.c_str()); }

void MakePlan(const ChildSpec& spec, int lifeline_fd, int report_fd, int out_read, int err_read,
              ExecPlan* plan) {
  std::vector<std::string> candidates;
  const std::string& name = spec.argv[0];
  if (name.find('/') != std::string::npos) {
    candidates.push_back(name);
  } else {
    for (absl::string_view dir : absl::StrSplit(spec.search_path, ':')) {
      // An empty PATH entry means the current directory, as for execvp().
      candidates.push_back(absl::StrCat(dir.empty() ? "." : dir, "/", name));
    }
  }
  std::vector<std::string>& s = plan->strings;
  s.push_back(spec.supervisor);
  s.resize(sv::kArgCount + 1);
  s[sv::kArgLifeline] = absl::StrCat(lifeline_fd);
  s[sv::kArgReport] = absl::StrCat(report_fd);
  s[sv::kArgStdout] = absl::StrCat(out_read);
  s[sv::kArgStderr] = absl::StrCat(err_read);
  s[sv::kArgShell] = spec.shell_path;
  s[sv::kArgConfine] = spec.confine ? sv::kConfine : sv::kNoConfine;
  s[sv::kArgCount] = absl::StrCat(candidates.size());
  s.insert(s.end(), candidates.begin(), candidates.end());
  s.push_back("--");
  s.insert(s.end(), spec.argv.begin(), spec.argv.end());
  for (const std::string& a : s) plan->argv.push_back(Mutable(a));
  plan->argv.push_back(nullptr);
  for (const std::string& e : spec.env) plan->envp.push_back(Mutable(e));
  plan->envp.push_back(nullptr);
  plan->supervisor = spec.supervisor.c_str();
  if (!spec.cwd.empty()) plan->cwd = spec.cwd.c_str();
  const long open_max = sysconf(_SC_OPEN_MAX);
  if (open_max > 0) plan->max_fd = static_cast<int>(std::min<long>(open_max, 1 << 20));
}

// The child, from fork() to exec of the supervisor. Async-signal-safe calls
// only. Every fd it is given is above 2 (MakePipe).
[[noreturn]] void ExecChild(const ExecPlan& plan, int in_fd, int out_fd, int err_fd, int report_fd,
                            int lifeline_fd, int out_read, int err_read) {
  auto fail = [report_fd](int stage) {
    const sv::Report report = {stage, errno};
    ssize_t n;
    do {
      n = write(report_fd, &report, sizeof(report));
    } while (n < 0 && errno == EINTR);
    _exit(127);
  };
  if (setpgid(0, 0) != 0) fail(sv::kSetup);
  const int fds[3] = {in_fd, out_fd, err_fd};
  for (int target = 0; target < 3; ++target) {
    if (dup2(fds[target], target) < 0) fail(sv::kSetup);  // dup2 clears FD_CLOEXEC
  }
  if (plan.cwd != nullptr && chdir(plan.cwd) != 0) fail(sv::kChdir);
  // Nothing of the agent's leaks into the step: keep 0, 1, 2, the report
  // pipe, the lifeline and the output pipes' read ends, which the
  // supervisor takes over.
  int keep[4] = {report_fd, lifeline_fd, out_read, err_read};
  for (int i = 1; i < 4; ++i) {  // sorted, without allocating
    for (int j = i; j > 0 && keep[j - 1] > keep[j]; --j) std::swap(keep[j - 1], keep[j]);
  }
  bool closed = true;
  int from = 3;
  for (int fd : keep) {
    if (fd > from) closed = closed && close_range(from, fd - 1, 0) == 0;
    from = fd + 1;
  }
  closed = closed && close_range(from, ~0U, 0) == 0;
  if (!closed) {
    for (int fd = 3; fd < plan.max_fd; ++fd) {
      if (fd != keep[0] && fd != keep[1] && fd != keep[2] && fd != keep[3]) close(fd);
    }
  }
  for (int fd : keep) {
    if (fcntl(fd, F_SETFD, 0) != 0) fail(sv::kSetup);
  }
  // Handlers are reset by exec, ignored signals are not: give the program
  // the defaults it expects, then unblock everything (the parent blocked all
  // signals around fork()).
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction old;
    if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) {
      sigaction(sig, &dfl, nullptr);
    }
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve(plan.supervisor, plan.argv.data(), plan.envp.data());
  fail(sv::kSupervisor);
  _exit(127);  // not reached
}

std::string DescribeReport(const ChildSpec& spec, const sv::Report& report) {
  switch (report.stage) {
    case sv::kChdir:
      return absl::StrCat("cannot change directory to ", spec.cwd, ": ", ErrnoText(report.value));
    case sv::kExec:
      return absl::StrCat("cannot run ", spec.argv[0], ": ", ErrnoText(report.value));
    case sv::kSupervisor:
      return absl::StrCat("cannot start the step supervisor ", spec.supervisor, ": ",
                          ErrnoText(report.value));
    case sv::kConfineFailed:
      return absl::StrCat("cannot confine ", spec.argv[0],
                          " (Landlock): ", ErrnoText(report.value));
    default:
      return absl::StrCat("cannot set up the process for ", spec.argv[0], ": ",
                          ErrnoText(report.value));
  }
}

void KillGroup(pid_t pgid, int sig) {
  if (kill(-pgid, sig) != 0 && errno != ESRCH) {
    spdlog::warn("kill(-{}, {}) failed: {}", pgid, sig, ErrnoText(errno));
  }
}

// True once `pid` (the supervisor) has ended. Leaves it a zombie. The step's
// group is signalled only before that: the supervisor keeps the step's pid
// (its group's id) from being reused until the step's whole tree is gone.
bool HasEnded(pid_t pid) {
  siginfo_t info;
  memset(&info, 0, sizeof(info));
  return waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
}

// The live step supervisors this process started: its only children but
// for what a killed supervisor left (KillOrphans). A supervisor is entered
// under the lock across its fork(), so the sweep never takes a new one for
// an orphan.
std::mutex supervisors_mu;
std::set<pid_t>& Supervisors() {
  static auto* set = new std::set<pid_t>();
  return *set;
}

// Reaps the supervisor `pid` and takes it out of Supervisors() at once,
// under the lock a fork() holds, so that its pid, should it be reused by
// the next supervisor, is never taken out from under that one.
void ReapSupervisor(pid_t pid, int* status) {
  std::lock_guard<std::mutex> lock(supervisors_mu);
  while (waitpid(pid, status, 0) < 0 && errno == EINTR) {
  }
  Supervisors().erase(pid);
}

bool IsSubreaper() {
  int on = 0;
  return prctl(PR_GET_CHILD_SUBREAPER, &on) == 0 && on != 0;
}

// Sends what a detach tells the supervisor on `fd`; false when it is gone.
bool SendDetach(int fd, const DetachRequest& r) {
  sv::Command secret;
  memset(&secret, 0, sizeof(secret));
  secret.type = sv::kSecret;
  memcpy(secret.name, r.secret.data(), std::min(r.secret.size(), sv::kSecretBytes));
  sv::Command stop;
  memset(&stop, 0, sizeof(stop));
  stop.type = sv::kStopAt;
  stop.deadline_ns = r.stop_at_ns;
  stop.tail_bytes = r.grace_ns;
  sv::Command detach = r.command;
  detach.type = sv::kDetach;
  return sv::SendAll(fd, &secret, sizeof(secret)) && sv::SendAll(fd, &stop, sizeof(stop)) &&
         sv::SendAll(fd, &detach, sizeof(detach));
}

}  // namespace

int KillOrphans() {
  if (!IsSubreaper()) return 0;
  int killed = 0;
  const pid_t self = getpid();
  for (int round = 0; round < 200; ++round) {
    std::vector<pid_t> orphans;
    {
      std::lock_guard<std::mutex> lock(supervisors_mu);
      const proc::Tree tree = proc::ReadTree();
      auto it = tree.children.find(self);
      if (it == tree.children.end()) break;
      for (pid_t child : it->second) {
        if (Supervisors().count(child) > 0) continue;
        orphans.push_back(child);
        // Stopped first, then killed: none forks or moves away meanwhile.
        const std::vector<pid_t> below = proc::Below(tree, child);
        for (pid_t p : below) kill(p, SIGSTOP);
        for (pid_t p : below) kill(p, SIGKILL);
        kill(child, SIGKILL);
        killed += 1 + static_cast<int>(below.size());
      }
    }
    if (orphans.empty()) break;
    for (pid_t p : orphans) {
      for (int i = 0; i < 100; ++i) {  // a killed process is a zombie within moments
        const pid_t r = waitpid(p, nullptr, WNOHANG);
        if (r == p || (r < 0 && errno != EINTR)) break;
        usleep(1000);
      }
    }
  }
  return killed;
}

int PollTimeoutMs(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return -1;
  if (d <= absl::ZeroDuration()) return 0;
  d = std::min(d, absl::Hours(1));
  return static_cast<int>(absl::ToInt64Milliseconds(absl::Ceil(d, absl::Milliseconds(1))));
}

StopReason StopControl::Due(absl::Duration now) const {
  if (cancelled && cancelled()) return StopReason::kCancelled;
  if (now >= deadline) return deadline_reason;
  return StopReason::kNone;
}

void StopControl::ClearWake() const {
  uint64_t count;
  if (wake_fd >= 0) (void)!read(wake_fd, &count, sizeof(count));
}

OutputTail::OutputTail(int64_t cap, LiveOutput* live, LiveOutput::Stream stream)
    : cap_(cap > 0 ? static_cast<size_t>(cap) : 0), live_(live), stream_(stream) {}

void OutputTail::Append(const char* data, size_t n) {
  if (live_ != nullptr) live_->Append(stream_, data, n);
  appended_ += n;
  if (cap_ == 0 || n == 0) return;
  if (n >= cap_) {
    buf_.assign(data + (n - cap_), data + n);
    return;
  }
  if (buf_.size() + n > 2 * cap_) {
    // Keep the last cap_ - n bytes; with the new ones that makes cap_.
    buf_.erase(buf_.begin(), buf_.begin() + (buf_.size() - (cap_ - n)));
  }
  if (buf_.size() + n > buf_.capacity()) {
    // vector::reserve allocates exactly what is asked: never above 2 * cap_.
    buf_.reserve(std::min(2 * cap_, std::max(2 * buf_.capacity(), buf_.size() + n)));
  }
  buf_.insert(buf_.end(), data, data + n);
}

void OutputTail::Skip(int64_t n) {
  if (n <= 0) return;
  appended_ += static_cast<uint64_t>(n);
  buf_.clear();
}

std::string OutputTail::Peek() const {
  const size_t keep = std::min(cap_, buf_.size());
  return std::string(buf_.end() - keep, buf_.end());
}

std::string OutputTail::Take() {
  const size_t keep = std::min(cap_, buf_.size());
  std::string out(buf_.end() - keep, buf_.end());
  buf_.clear();
  appended_ = 0;
  return out;
}

namespace {

// Tells the supervisor on `fd` the agent's lease when it is not what was
// told last (`*told`).
void TellFence(int fd, const ChildControl& ctl, int64_t* told) {
  if (ctl.fence_ns == nullptr) return;
  const int64_t fence = ctl.fence_ns->load(std::memory_order_relaxed);
  if (fence == *told) return;
  sv::Command c;
  memset(&c, 0, sizeof(c));
  c.type = sv::kFence;
  c.deadline_ns = fence;
  if (sv::SendAll(fd, &c, sizeof(c))) *told = fence;
}

// The supervisor ended because the lease it was told passed: the step was
// killed with everything it started (and the agent did not stop it).
bool FencePassed(int64_t told) { return told > 0 && absl::ToInt64Nanoseconds(Now()) >= told; }

}  // namespace

ChildExit RunChild(const ChildSpec& spec, const ChildControl& ctl, OutputTail* out,
                   OutputTail* err) {
  ChildExit result;
  if (spec.supervisor.empty()) {
    result.start_error = absl::StrCat("cannot run ", spec.argv[0], ": no ", sv::kBinaryName,
                                      " was found to run it under");
    return result;
  }
  // The lifeline's write end stays here, close-on-exec: when this process
  // ends, the supervisor reads EOF and kills the step's whole tree.
  Fd in_r, in_w, out_r, out_w, err_r, err_w, report_r, report_w, lifeline_r, lifeline_w;
  if (!MakePipe(&in_r, &in_w) || !MakePipe(&out_r, &out_w) || !MakePipe(&err_r, &err_w) ||
      !MakePipe(&report_r, &report_w) || !MakeSocketPair(&lifeline_w, &lifeline_r)) {
    result.start_error = absl::StrCat("cannot create pipes: ", ErrnoText(errno));
    return result;
  }
  ExecPlan plan;
  MakePlan(spec, lifeline_r.get(), report_w.get(), out_r.get(), err_r.get(), &plan);
  ScopedSigpipeBlock sigpipe;

  // All signals blocked across fork(): no handler of the agent runs in the
  // child before it restored the default dispositions.
  sigset_t all, old_mask;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old_mask);
  std::unique_lock<std::mutex> registry(supervisors_mu);
  const pid_t supervisor = fork();
  if (supervisor == 0) {
    ExecChild(plan, in_r.get(), out_w.get(), err_w.get(), report_w.get(), lifeline_r.get(),
              out_r.get(), err_r.get());
  }
  const int fork_errno = errno;
  if (supervisor > 0) Supervisors().insert(supervisor);
  registry.unlock();
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);

  if (supervisor < 0) {
    result.start_error = absl::StrCat("cannot fork: ", ErrnoText(fork_errno));
    return result;
  }
  // The child does the same; whichever runs first, the group exists before
  // anyone may signal it. Fails harmlessly once the child has exec'd.
  setpgid(supervisor, supervisor);
  in_r.Reset();
  out_w.Reset();
  err_w.Reset();
  report_w.Reset();
  lifeline_r.Reset();

  // The supervisor's records (the step's pid; or why nothing runs), then
  // EOF once the step's program was exec'd (the pipe is close-on-exec).
  pid_t pid = 0;  // the step: its pid and its process group's id
  sv::Report failure = {0, 0};
  {
    sv::Report report;
    size_t got = 0;
    for (;;) {
      const ssize_t n =
          read(report_r.get(), reinterpret_cast<char*>(&report) + got, sizeof(report) - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
      if (got < sizeof(report)) continue;
      got = 0;
      if (report.stage == sv::kRunning) {
        pid = report.value;
      } else if (failure.stage == 0) {
        failure = report;
      }
    }
    report_r.Reset();
  }
  if (failure.stage != 0 || pid <= 0) {
    int status = 0;
    ReapSupervisor(supervisor, &status);
    result.start_error =
        failure.stage != 0
            ? DescribeReport(spec, failure)
            : absl::StrCat("the step supervisor ", spec.supervisor,
                           " ended before it started the step (wait status ", status, ")");
    return result;
  }
  if (ctl.on_pid) ctl.on_pid(pid);

  // Readable once the supervisor ended, which it does once the step and
  // everything it started are gone (Linux 5.3+); without it we poll.
  Fd pidfd(static_cast<int>(syscall(SYS_pidfd_open, supervisor, 0)));
  SetNonBlocking(in_w);
  SetNonBlocking(out_r);
  SetNonBlocking(err_r);
  size_t in_off = 0;
  if (spec.stdin_data.empty()) in_w.Reset();

  std::vector<char> buf(kIoChunk);
  auto read_some = [&buf](Fd& fd, OutputTail* tail) {
    const ssize_t n = read(fd.get(), buf.data(), buf.size());
    if (n > 0) {
      tail->Append(buf.data(), static_cast<size_t>(n));
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      fd.Reset();
    }
  };
  auto write_some = [&]() {
    const size_t len = std::min(kIoChunk, spec.stdin_data.size() - in_off);
    const ssize_t n = write(in_w.get(), spec.stdin_data.data() + in_off, len);
    if (n > 0) {
      in_off += static_cast<size_t>(n);
      if (in_off == spec.stdin_data.size()) in_w.Reset();  // EOF for the child
    } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
      if (errno == EPIPE) sigpipe.Consume();  // the child does not read its stdin
      in_w.Reset();
    }
  };

  absl::Duration kill_at = absl::InfiniteDuration();
  bool killed = false;
  // Once the step's group was killed: when its supervisor, if it has not
  // ended by then (a step may have stopped it), is killed too.
  absl::Duration supervisor_kill_at = absl::InfiniteDuration();
  bool supervisor_killed = false;
  absl::Duration max_wait = absl::InfiniteDuration();
  if (!pidfd.ok() || (ctl.wake_fd < 0 && ctl.cancelled)) max_wait = kFallbackPoll;
  // A detach asked for and sent: waiting for the supervisor's answer.
  bool detach_sent = false;
  bool detach_tried = false;
  int64_t fence_told = 0;
  FrameReader answers;
  bool gone = false;  // the supervisor said kGone: nothing of the step is left
  for (;;) {
    const absl::Duration now = Now();
    const StopReason due =
        result.stopped_by == StopReason::kNone && !detach_sent ? ctl.Due(now) : StopReason::kNone;
    DetachRequest request;
    memset(&request.command, 0, sizeof(request.command));
    request.supervisor = supervisor;
    // Asked after Due(): a detach comes before the stop that goes with it.
    if (!detach_tried && result.stopped_by == StopReason::kNone && !in_w.ok() && ctl.detach &&
        ctl.detach(&request)) {
      detach_tried = true;
      // No answer (the supervisor ended with the step first): collected
      // as usual below.
      detach_sent = SendDetach(lifeline_w.get(), request);
    } else if (due != StopReason::kNone) {
      result.stopped_by = due;
      KillGroup(pid, SIGTERM);
      KillGroup(pid, SIGCONT);    // a stopped process must run to see SIGTERM
      kill(supervisor, SIGCONT);  // and a stopped supervisor, to see it end
      kill_at = now + ctl.kill_grace;
      in_w.Reset();
    }
    if (result.stopped_by != StopReason::kNone && !killed && now >= kill_at) {
      KillGroup(pid, SIGKILL);
      kill(supervisor, SIGCONT);
      killed = true;
      supervisor_kill_at = now + kSupervisorGrace;
    }
    if (killed && !supervisor_killed && now >= supervisor_kill_at && !HasEnded(supervisor)) {
      // It does not end, however often it is woken: the step keeps it
      // stopped, or it is stuck. Killed, what it had below it comes to us.
      spdlog::warn(
          "the step supervisor {} of pid {} did not end {} after the step was killed; "
          "killing it",
          supervisor, pid, absl::FormatDuration(kSupervisorGrace));
      kill(supervisor, SIGKILL);
      supervisor_killed = true;
    }
    // Once a detach was asked, the next agent's lease is the one that counts.
    if (!detach_tried) TellFence(lifeline_w.get(), ctl, &fence_told);
    if (HasEnded(supervisor)) break;

    absl::Duration wake_at = absl::InfiniteDuration();
    if (result.stopped_by == StopReason::kNone) {
      wake_at = ctl.deadline;
    } else if (!killed) {
      wake_at = kill_at;
    } else if (!supervisor_killed) {
      wake_at = supervisor_kill_at;
    }
    const int timeout_ms = PollTimeoutMs(std::min(wake_at - now, max_wait));

    pollfd fds[6];
    nfds_t nfds = 0;
    auto add = [&](int fd, short events) -> pollfd* {
      if (fd < 0) return nullptr;
      fds[nfds] = pollfd{fd, events, 0};
      return &fds[nfds++];
    };
    // Once a detach is sent, the kept file holds the output read so far,
    // and what is still in the pipes is the supervisor's: reading on would
    // lose it.
    const pollfd* p_out = detach_sent ? nullptr : add(out_r.get(), POLLIN);
    const pollfd* p_err = detach_sent ? nullptr : add(err_r.get(), POLLIN);
    const pollfd* p_in = add(in_w.get(), POLLOUT);
    const pollfd* p_wake = add(ctl.wake_fd, POLLIN);
    const pollfd* p_line = detach_sent ? add(lifeline_w.get(), POLLIN) : nullptr;
    add(pidfd.get(), POLLIN);
    const int ready = poll(fds, nfds, timeout_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      spdlog::error("poll() failed while running pid {}: {}; killing it", pid, ErrnoText(errno));
      KillGroup(pid, SIGKILL);
      break;
    }
    if (p_out != nullptr && p_out->revents != 0) read_some(out_r, out);
    if (p_err != nullptr && p_err->revents != 0) read_some(err_r, err);
    if (p_in != nullptr && p_in->revents != 0) write_some();
    if (p_wake != nullptr && (p_wake->revents & POLLIN) != 0) ctl.ClearWake();
    if (p_line != nullptr && p_line->revents != 0) {
      const bool open = answers.Fill(lifeline_w.get());
      sv::FrameHeader h;
      std::string body;
      while (answers.Next(&h, &body)) {
        if (h.type == sv::kGone) gone = true;
        if (h.type == sv::kDetached) {
          // Kept: what is left in the output pipes is the supervisor's now.
          // The lifeline closes as we return, and it listens.
          result.detached = true;
          if (ctl.detached) ctl.detached();
          if (ctl.on_pid) ctl.on_pid(0);
          return result;
        }
      }
      if (!open) detach_sent = false;  // it ended with the step: collect that
    }
  }

  // The supervisor killed what the step left running before it ended, and
  // said so last on the lifeline; one that did not say so was killed from
  // outside (by the step, say), and what it had below it came to us.
  ReapSupervisor(supervisor, &result.wait_status);
  if (!gone) {
    answers.Fill(lifeline_w.get());
    sv::FrameHeader h;
    std::string body;
    while (answers.Next(&h, &body)) gone = gone || h.type == sv::kGone;
  }
  if (!gone) {
    if (const int n = KillOrphans(); n > 0) {
      spdlog::warn("pid {}: its step supervisor was killed; killed {} process(es) it left", pid, n);
    }
  }
  if (result.stopped_by == StopReason::kNone && WIFEXITED(result.wait_status) &&
      WEXITSTATUS(result.wait_status) == 128 + SIGKILL && FencePassed(fence_told)) {
    result.stopped_by = StopReason::kFenced;
  }
  if (ctl.on_pid) ctl.on_pid(0);
  in_w.Reset();

  // Whatever is still in the output pipes, until EOF or kDrainLimit.
  const absl::Duration drain_end = Now() + kDrainLimit;
  while (out_r.ok() || err_r.ok()) {
    const absl::Duration left = drain_end - Now();
    if (left <= absl::ZeroDuration()) break;  // held open by someone out of our reach
    pollfd fds[2];
    nfds_t nfds = 0;
    if (out_r.ok()) fds[nfds++] = pollfd{out_r.get(), POLLIN, 0};
    if (err_r.ok()) fds[nfds++] = pollfd{err_r.get(), POLLIN, 0};
    const int ready = poll(fds, nfds, PollTimeoutMs(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    for (nfds_t i = 0; i < nfds; ++i) {
      if (fds[i].revents == 0) continue;
      if (fds[i].fd == out_r.get()) {
        read_some(out_r, out);
      } else {
        read_some(err_r, err);
      }
    }
  }
  return result;
}

std::string NewSupervisorName() {
  uint64_t r = 0;
  if (getrandom(&r, sizeof(r), 0) != static_cast<ssize_t>(sizeof(r))) {
    r = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  }
  return absl::StrCat("taskgrid-step-", getpid(), "-", absl::Hex(r, absl::kZeroPad16));
}

int ConnectSupervisor(const std::string& name) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  const size_t len = std::min(name.size(), sizeof(addr.sun_path) - 2);
  memcpy(addr.sun_path + 1, name.data(), len);  // abstract: sun_path[0] is NUL
  const socklen_t addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + len);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

std::string NewSupervisorSecret() {
  std::string secret(sv::kSecretBytes, '\0');
  size_t got = 0;
  while (got < secret.size()) {
    const ssize_t n = getrandom(secret.data() + got, secret.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got < secret.size()) {
    // No getrandom(): /dev/urandom, which must then exist.
    const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      while (got < secret.size()) {
        const ssize_t n = read(fd, secret.data() + got, secret.size() - got);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
      close(fd);
    }
  }
  return secret;
}

bool ProveToSupervisor(int fd, const std::string& secret, absl::Duration within) {
  sv::Command c;
  memset(&c, 0, sizeof(c));
  c.type = sv::kSecret;
  memcpy(c.name, secret.data(), std::min(secret.size(), sv::kSecretBytes));
  if (!sv::SendAll(fd, &c, sizeof(c))) return false;
  const absl::Duration until = Now() + within;
  for (;;) {
    pollfd p = {fd, POLLIN, 0};
    const int ready = poll(&p, 1, PollTimeoutMs(until - Now()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    char byte;
    // Its first frame (kSkipped) is left for AttachChild; EOF: it closed
    // the connection, not taking the secret.
    return recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 1;
  }
}

ChildExit AttachChild(int sock_fd, const ChildControl& ctl, OutputTail* out, OutputTail* err) {
  Fd sock(sock_fd);
  ChildExit result;
  FrameReader frames;
  absl::Duration kill_at = absl::InfiniteDuration();
  bool killed = false;
  // Not our child: a pidfd of the process at the other end (SO_PEERCRED),
  // to wake it (a step may have stopped it) and, should it not end once
  // the step was killed, to kill it.
  Fd supervisor;
  {
    ucred cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.pid > 0) {
      supervisor.Reset(static_cast<int>(syscall(SYS_pidfd_open, cred.pid, 0)));
    }
  }
  auto signal_supervisor = [&supervisor](int sig) {
    if (supervisor.ok()) syscall(SYS_pidfd_send_signal, supervisor.get(), sig, nullptr, 0);
  };
  absl::Duration supervisor_kill_at = absl::InfiniteDuration();
  bool supervisor_killed = false;
  bool timed_out = false;  // the supervisor stopped the step at its deadline
  bool detach_sent = false;
  int64_t fence_told = 0;
  auto send_command = [&sock](sv::Command c) { return sv::SendAll(sock.get(), &c, sizeof(c)); };
  for (;;) {
    const absl::Duration now = Now();
    const StopReason due =
        result.stopped_by == StopReason::kNone && !detach_sent ? ctl.Due(now) : StopReason::kNone;
    DetachRequest request;
    memset(&request.command, 0, sizeof(request.command));
    if (!detach_sent && result.stopped_by == StopReason::kNone && ctl.detach &&
        ctl.detach(&request)) {
      detach_sent = SendDetach(sock.get(), request);
    } else if (due != StopReason::kNone) {
      result.stopped_by = due;
      sv::Command term;
      memset(&term, 0, sizeof(term));
      term.type = sv::kTerm;
      send_command(term);
      signal_supervisor(SIGCONT);
      kill_at = now + ctl.kill_grace;
    }
    if (result.stopped_by != StopReason::kNone && !killed && now >= kill_at) {
      sv::Command kill_cmd;
      memset(&kill_cmd, 0, sizeof(kill_cmd));
      kill_cmd.type = sv::kKill;
      send_command(kill_cmd);
      signal_supervisor(SIGCONT);
      killed = true;
      supervisor_kill_at = now + kSupervisorGrace;
    }
    if (killed && !supervisor_killed && now >= supervisor_kill_at) {
      spdlog::warn(
          "a kept step's supervisor did not end {} after it was told to kill the step; "
          "killing it",
          absl::FormatDuration(kSupervisorGrace));
      signal_supervisor(SIGKILL);
      supervisor_killed = true;
    }
    if (!detach_sent) TellFence(sock.get(), ctl, &fence_told);
    absl::Duration wake_at = absl::InfiniteDuration();
    if (result.stopped_by == StopReason::kNone) {
      wake_at = ctl.deadline;
    } else if (!killed) {
      wake_at = kill_at;
    } else if (!supervisor_killed) {
      wake_at = supervisor_kill_at;
    }
    absl::Duration max_wait = absl::InfiniteDuration();
    if (ctl.wake_fd < 0 && ctl.cancelled) max_wait = kFallbackPoll;
    pollfd fds[2] = {{sock.get(), POLLIN, 0}, {ctl.wake_fd, POLLIN, 0}};
    const int ready =
        poll(fds, ctl.wake_fd >= 0 ? 2 : 1, PollTimeoutMs(std::min(wake_at - now, max_wait)));
    if (ready < 0 && errno != EINTR) {
      result.start_error = absl::StrCat("cannot follow the kept step: poll: ", ErrnoText(errno));
      return result;
    }
    if (ready <= 0) continue;
    if (ctl.wake_fd >= 0 && (fds[1].revents & POLLIN) != 0) ctl.ClearWake();
    if (fds[0].revents == 0) continue;
    const bool open = frames.Fill(sock.get());
    sv::FrameHeader h;
    std::string body;
    while (frames.Next(&h, &body)) {
      switch (h.type) {
        case sv::kSkipped:
          if (body.size() == 2 * sizeof(int64_t)) {
            int64_t skipped[2];
            memcpy(skipped, body.data(), sizeof(skipped));
            out->Skip(skipped[0]);
            err->Skip(skipped[1]);
          }
          break;
        case sv::kStdout:
          out->Append(body);
          break;
        case sv::kStderr:
          err->Append(body);
          break;
        case sv::kTimedOut:
          timed_out = true;
          break;
        case sv::kExit:
          if (body.size() == sizeof(int)) memcpy(&result.wait_status, body.data(), sizeof(int));
          // Stopped at its own deadline while no agent was there: what we
          // would have stopped it for.
          if (timed_out && result.stopped_by == StopReason::kNone) {
            result.stopped_by = ctl.deadline_reason;
          }
          return result;
        case sv::kDetached:
          // The frames before this one came after the kept file was
          // written: it is written again with them.
          result.detached = true;
          if (ctl.detached) ctl.detached();
          return result;
        default:
          break;
      }
    }
    if (!open) {
      if (result.stopped_by == StopReason::kNone && FencePassed(fence_told)) {
        result.stopped_by = StopReason::kFenced;  // it killed the step's tree, and exited
        return result;
      }
      // Killed, by us: the step was being stopped.
      if (supervisor_killed) return result;
      result.start_error = "its step supervisor ended without saying how the step ended";
      return result;
    }
  }
}

}  // namespace taskgrid::agent::internal
