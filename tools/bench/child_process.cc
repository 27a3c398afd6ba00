#include "tools/bench/child_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace taskgrid::bench {

namespace {

// Every child not yet reaped, and the temporary directories to remove on an
// interrupt. A pid is reaped only with mu held, so whoever holds mu may
// signal the pids in the set safely.
struct Registry {
  std::mutex mu;
  std::set<pid_t> pids;             // guarded by mu
  std::set<std::string> temp_dirs;  // guarded by mu
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: the interrupt thread may use it late
  return *r;
}

// The fields of /proc/<pid>/stat after "(comm)", split on spaces: [0] is
// the state (field 3), [1] ppid (field 4), [11] utime (14), [12] stime (15).
bool ReadStatFields(pid_t pid, std::vector<std::string>* fields) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  if (!in) return false;
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 > line.size()) return false;
  *fields = absl::StrSplit(line.substr(close + 2), ' ', absl::SkipEmpty());
  return fields->size() > 12;
}

// Direct children of this process that are not in `known`. Needs /proc.
std::vector<pid_t> UnknownChildren(const std::set<pid_t>& known) {
  std::vector<pid_t> out;
  const pid_t self = getpid();
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid) || known.count(pid) > 0) continue;
    std::vector<std::string> f;
    int ppid = 0;
    if (ReadStatFields(pid, &f) && absl::SimpleAtoi(f[1], &ppid) && ppid == self) {
      out.push_back(pid);
    }
  }
  closedir(dir);
  return out;
}

// With registry().mu held.
int KillOrphansLocked(absl::Duration timeout) {
  int ended = 0;
  const absl::Duration deadline = MonoNow() + timeout;
  while (MonoNow() < deadline) {
    std::vector<pid_t> orphans = UnknownChildren(registry().pids);
    if (orphans.empty()) break;
    for (pid_t pid : orphans) {
      // One that ended by itself (a step supervisor that killed its step
      // when its agent died) is only reaped, not counted.
      std::vector<std::string> f;
      if (ReadStatFields(pid, &f) && f[0] == "Z") continue;
      kill(pid, SIGKILL);
      ++ended;
    }
    for (pid_t pid : orphans) {
      while (MonoNow() < deadline) {
        const pid_t r = waitpid(pid, nullptr, WNOHANG);
        if (r == pid || (r < 0 && errno == ECHILD)) break;
        usleep(1000);
      }
    }
  }
  return ended;
}

void WriteStderr(const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = write(2, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

void InterruptLoop(sigset_t set) {
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  Registry& r = registry();
  r.mu.lock();  // never unlocked: the process ends below
  WriteStderr(absl::StrCat("taskgrid-bench: received signal ", sig, " (", strsignal(sig),
                           "): stopping the ", r.pids.size(), " process(es) it started\n"));
  for (pid_t pid : r.pids) {
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
  }
  const absl::Duration deadline = MonoNow() + absl::Seconds(10);
  for (pid_t pid : r.pids) {
    while (MonoNow() < deadline) {
      const pid_t w = waitpid(pid, nullptr, WNOHANG);
      if (w == pid || (w < 0 && errno == ECHILD)) break;
      usleep(1000);
    }
  }
  r.pids.clear();
  KillOrphansLocked(absl::Seconds(5));
  for (const std::string& dir : r.temp_dirs) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  _exit(128 + sig);
}

}  // namespace

absl::Duration MonoNow() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return absl::DurationFromTimespec(ts);
}

void InstallInterruptHandler() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A shell without job control starts background commands with SIGINT
  // ignored, and an ignored signal is discarded even while blocked: make
  // sure Ctrl-C and kill -INT reach sigwait. (SIGHUP keeps what nohup set.)
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  signal(SIGPIPE, SIG_IGN);
  prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  std::thread(InterruptLoop, set).detach();
}

void RegisterTempDir(const std::string& path) {
  std::lock_guard<std::mutex> lock(registry().mu);
  registry().temp_dirs.insert(path);
}

void ForgetTempDir(const std::string& path) {
  std::lock_guard<std::mutex> lock(registry().mu);
  registry().temp_dirs.erase(path);
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(
    const std::string& name, const std::vector<std::string>& argv, const std::string& log_path) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  if (access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat(name, ": ", argv[0], " is not an executable file: ", strerror(errno)));
  }
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open ", log_path, ": ", strerror(errno)));
  }
  // Everything the child needs is prepared before fork(): after it, only
  // async-signal-safe calls.
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const pid_t parent = getpid();

  std::unique_ptr<ChildProcess> child(new ChildProcess(name, log_path));
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    child->spawn_mono_ = MonoNow();
    const pid_t pid = fork();
    if (pid < 0) {
      const int err = errno;
      close(log_fd);
      return absl::InternalError(absl::StrCat("fork for ", name, ": ", strerror(err)));
    }
    if (pid == 0) {
      setsid();
      prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
      if (getppid() != parent) _exit(127);
      const int null_fd = open("/dev/null", O_RDONLY);
      if (null_fd >= 0) dup2(null_fd, 0);
      dup2(log_fd, 1);
      dup2(log_fd, 2);
      struct sigaction dfl = {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &dfl, nullptr);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      execv(cargv[0], cargv.data());
      static const char kMsg[] = "taskgrid-bench: execv failed\n";
      (void)!write(2, kMsg, sizeof(kMsg) - 1);
      _exit(127);
    }
    child->pid_ = pid;
    r.pids.insert(pid);
  }
  close(log_fd);
  return child;
}

ChildProcess::~ChildProcess() { Kill(); }

bool ChildProcess::Alive() {
  if (reaped_ || pid_ <= 0) return false;
  std::lock_guard<std::mutex> lock(registry().mu);
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == 0) return true;
  reaped_ = true;
  wait_status_ = r == pid_ ? status : -1;
  registry().pids.erase(pid_);
  return false;
}

std::string ChildProcess::ExitDescription() const {
  if (!reaped_) return "still running";
  if (wait_status_ < 0) return "gone (not reaped here)";
  if (WIFEXITED(wait_status_)) return absl::StrCat("exited with code ", WEXITSTATUS(wait_status_));
  if (WIFSIGNALED(wait_status_)) {
    return absl::StrCat("killed by signal ", WTERMSIG(wait_status_), " (",
                        strsignal(WTERMSIG(wait_status_)), ")");
  }
  return absl::StrCat("wait status ", wait_status_);
}

void ChildProcess::Signal(int sig) {
  if (!Alive()) return;
  std::lock_guard<std::mutex> lock(registry().mu);
  if (registry().pids.count(pid_) > 0) kill(pid_, sig);
}

absl::Status ChildProcess::Stop(int sig, absl::Duration timeout) {
  Signal(sig);
  const absl::Duration deadline = MonoNow() + timeout;
  while (Alive()) {
    if (MonoNow() > deadline) {
      Kill();
      return absl::DeadlineExceededError(absl::StrCat(
          name_, " (pid ", pid_, ") did not exit within ", absl::FormatDuration(timeout),
          " of signal ", sig, "; killed it. Log: ", log_path_));
    }
    usleep(2000);
  }
  return absl::OkStatus();
}

void ChildProcess::Kill() {
  if (pid_ <= 0 || reaped_) return;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    if (registry().pids.count(pid_) > 0) {
      kill(-pid_, SIGKILL);
      kill(pid_, SIGKILL);
    }
  }
  ReapAfterKill();
}

void ChildProcess::ReapAfterKill() {
  const absl::Duration deadline = MonoNow() + absl::Seconds(10);
  while (Alive()) {
    if (MonoNow() > deadline) {
      WriteStderr(absl::StrCat("taskgrid-bench: ", name_, " (pid ", pid_,
                               ") was not reaped 10 s after SIGKILL\n"));
      return;
    }
    usleep(1000);
  }
}

std::string FileTail(const std::string& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = size > static_cast<std::streamoff>(bytes) ? size - bytes : 0;
  in.seekg(from);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string ChildProcess::LogTail(size_t bytes) const { return FileTail(log_path_, bytes); }

int KillOrphans(absl::Duration timeout) {
  std::lock_guard<std::mutex> lock(registry().mu);
  return KillOrphansLocked(timeout);
}

namespace {

absl::StatusOr<int64_t> ReadStatusKiB(pid_t pid, absl::string_view key) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  if (!in) return absl::NotFoundError(absl::StrCat("no /proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v(line);
    if (!absl::ConsumePrefix(&v, key) || !absl::ConsumePrefix(&v, ":")) continue;
    v = absl::StripAsciiWhitespace(v);
    absl::ConsumeSuffix(&v, "kB");
    int64_t kib = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &kib)) return kib;
  }
  return absl::NotFoundError(absl::StrCat(key, " not in /proc/", pid, "/status"));
}

}  // namespace

absl::StatusOr<int64_t> ReadRssKiB(pid_t pid) { return ReadStatusKiB(pid, "VmRSS"); }
absl::StatusOr<int64_t> ReadPeakRssKiB(pid_t pid) { return ReadStatusKiB(pid, "VmHWM"); }

absl::StatusOr<double> ReadCpuSeconds(pid_t pid) {
  std::vector<std::string> f;
  int64_t utime = 0, stime = 0;
  if (!ReadStatFields(pid, &f) || !absl::SimpleAtoi(f[11], &utime) ||
      !absl::SimpleAtoi(f[12], &stime)) {
    return absl::NotFoundError(absl::StrCat("cannot read /proc/", pid, "/stat"));
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::string SelfExe() {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

std::string SelfDir() { return std::filesystem::path(SelfExe()).parent_path().string(); }

}  // namespace taskgrid::bench
