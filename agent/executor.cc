#include "agent/executor.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/builtins.h"
#include "agent/http_step.h"
#include "agent/proc_tree.h"
#include "agent/process.h"
#include "agent/step_supervisor.h"
#include "common/clock.h"
#include "common/ids.h"
#include "common/proto_time.h"
#include "spdlog/spdlog.h"

extern char** environ;

namespace taskgrid::agent {
namespace {

// The variables of the agent's environment a step does not inherit: the
// TASKGRID_ ones (the agent's and taskgridctl's settings, e.g.
// TASKGRID_TOKEN_FILE and TASKGRID_TLS_KEY; a step gets its own TASKGRID_
// variables from the agent) and systemd's CREDENTIALS_DIRECTORY, where the
// agent's certificate, key and token are. A step may still set any of them
// itself (ExecStep.env).
bool IsAgentsOwnVariable(absl::string_view name) {
  return absl::StartsWith(name, "TASKGRID_") || name == "CREDENTIALS_DIRECTORY";
}

using internal::OutputTail;
using internal::StopReason;

// Used to look a program up when neither the agent nor the step sets PATH
// (glibc's confstr(_CS_PATH)).
constexpr char kDefaultPath[] = "/bin:/usr/bin";

absl::Duration Now() { return RealClock::Get()->Monotonic(); }

bool HasNul(const std::string& s) { return s.find('\0') != std::string::npos; }

std::string ErrnoText(int err) { return std::generic_category().message(err); }

// A task id that can name a file in a directory of ours: a valid name
// (which "." and ".." are) that is not a directory reference.
bool IsFileName(const std::string& s) {
  return IsValidName(s, kMaxIdLength) && s != "." && s != "..";
}

// Writes `data` to a new file `path`; "" or why not.
std::string WriteNewFile(const std::string& path, const std::string& data) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return absl::StrCat("cannot create ", path, ": ", ErrnoText(errno));
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return absl::StrCat("cannot write ", path, ": ", ErrnoText(err));
    }
    done += static_cast<size_t>(n);
  }
  if (close(fd) != 0) return absl::StrCat("cannot write ", path, ": ", ErrnoText(errno));
  return "";
}

// Gives the owner full access to `p` and every directory below it, so that
// what a step left unwritable (chmod 000 on a subdirectory) can be removed.
void MakeRemovable(const std::filesystem::path& p) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(p, ec))) return;
  fs::permissions(p, fs::perms::owner_all, fs::perm_options::add, ec);
  fs::directory_iterator it(p, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) MakeRemovable(it->path());
}

// Removes `dir` and everything in it (symbolic links are removed, never
// followed).
void RemoveTree(const std::string& dir) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!ec) return;
  MakeRemovable(dir);
  std::filesystem::remove_all(dir, ec);
  if (ec) spdlog::warn("cannot remove the attempt directory {}: {}", dir, ec.message());
}

// Why step `index` was stopped from outside, readable (reason != kNone).
std::string StopError(StopReason reason, int index, const v1::Assignment& a) {
  switch (reason) {
    case StopReason::kStepTimeout:
      return absl::StrCat("step ", index, " timed out after ",
                          absl::FormatDuration(FromProto(a.steps(index).timeout())),
                          " (step timeout)");
    case StopReason::kAttemptTimeout:
      return absl::StrCat("attempt timed out after ",
                          absl::FormatDuration(FromProto(a.attempt_timeout())),
                          " (attempt timeout) in step ", index);
    default:
      return "cancelled";
  }
}

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// This boot's id: a kept attempt from another boot is stale (its
// supervisor died with the machine; CLOCK_MONOTONIC started again).
std::string BootId() {
  static const std::string id = [] {
    std::string s;
    const int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      char buf[64];
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n > 0) s.assign(buf, static_cast<size_t>(n));
      close(fd);
    }
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  }();
  return id;
}

// The absolute base of the attempt directories.
std::string BaseDir(const std::string& work_dir, std::error_code* ec) {
  return std::filesystem::absolute(work_dir.empty() ? DefaultWorkDir("") : work_dir, *ec)
      .lexically_normal()
      .string();
}

constexpr char kKeptDir[] = "kept";
// How long a kept step's supervisor may take to answer the next agent.
constexpr absl::Duration kProveWithin = absl::Seconds(2);

}  // namespace

std::string DefaultWorkDir(const std::string& agent_id) {
  const char* tmp = std::getenv("TMPDIR");
  std::string base = tmp != nullptr && tmp[0] == '/' ? tmp : "/tmp";
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  if (base == "/") base.clear();
  return agent_id.empty() ? base + "/taskgrid-agent" : base + "/taskgrid-agent-" + agent_id;
}

std::string FindStepSupervisor() {
  static const std::string found = [] {
    std::vector<std::string> places;
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) places.push_back((self.parent_path() / supervisor::kBinaryName).string());
#ifdef TASKGRID_BUILD_BIN_DIR
    places.push_back(std::string(TASKGRID_BUILD_BIN_DIR) + "/" + supervisor::kBinaryName);
#endif
    for (const std::string& place : places) {
      if (access(place.c_str(), X_OK) == 0) return place;
    }
    return std::string();
  }();
  return found;
}

// How one step ended. SUCCEEDED: go on with the next step.
struct TaskRun::StepEnd {
  v1::Outcome outcome = v1::OUTCOME_SUCCEEDED;
  int exit_code = 0;
  std::string error;
  // Another attempt cannot help (TaskResult.permanent).
  bool permanent = false;

  static StepEnd Failed(int exit_code, std::string error) {
    return StepEnd{v1::OUTCOME_FAILED, exit_code, std::move(error)};
  }
};

namespace {
bool AllInstant(const v1::Assignment& a) {
  return std::all_of(a.steps().begin(), a.steps().end(), [](const v1::Step& s) {
    return s.has_builtin() && internal::IsInstantBuiltin(s.builtin());
  });
}
}  // namespace

TaskRun::TaskRun(v1::Assignment assignment, ExecutorOptions opts)
    : assignment_(std::move(assignment)),
      opts_(std::move(opts)),
      instant_(AllInstant(assignment_)),
      live_(instant_ || opts_.live_output_bytes <= 0
                ? nullptr
                : std::make_shared<LiveOutput>(static_cast<size_t>(opts_.live_output_bytes))) {}

TaskRun::TaskRun(KeptRun kept, ExecutorOptions opts)
    : assignment_(kept.kept.assignment()),
      opts_(std::move(opts)),
      instant_(false),
      live_(opts_.live_output_bytes <= 0
                ? nullptr
                : std::make_shared<LiveOutput>(static_cast<size_t>(opts_.live_output_bytes))),
      kept_(std::move(kept.kept)),
      kept_fd_(kept.supervisor_fd) {}

TaskRun::~TaskRun() {
  if (kept_fd_ >= 0) close(kept_fd_);  // Run() never took it
}

void TaskRun::Detach(int64_t hold_until_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  if (detach_until_ns_ != 0 || hold_until_ns <= 0) return;
  detach_until_ns_ = hold_until_ns;
  WakeLocked();
}

bool TaskRun::WriteKept(int index, const std::string& name, const internal::DetachRequest* detach,
                        absl::Duration step_start, const OutputTail& out, const OutputTail& err,
                        int64_t* hold_until_ns) {
  int64_t hold;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hold = detach_until_ns_;
  }
  if (hold == 0 || attempt_dir_.empty()) return false;
  const std::string base = std::filesystem::path(attempt_dir_).parent_path().string();
  const std::string dir = base + "/" + kKeptDir;
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    spdlog::error("cannot keep {} attempt {}: cannot create {}: {}", assignment_.task_id(),
                  assignment_.attempt(), dir, ErrnoText(errno));
    return false;
  }
  v1::KeptAttempt k;
  *k.mutable_assignment() = assignment_;
  k.set_step(index);
  k.set_supervisor(name);
  k.set_attempt_dir(attempt_dir_);
  const absl::Duration now = Now();
  *k.mutable_attempt_elapsed() = ToProto(now - run_start_);
  *k.mutable_step_elapsed() = ToProto(name.empty() ? absl::ZeroDuration() : now - step_start);
  k.set_stdout_tail(out.Peek());
  k.set_stdout_cut_bytes(out.cut());
  k.set_stderr_tail(err.Peek());
  k.set_stderr_cut_bytes(err.cut());
  k.set_hold_until_monotonic_ns(hold);
  k.set_boot_id(BootId());
  if (detach != nullptr) {
    k.set_secret(detach->secret);
    k.set_supervisor_pid(detach->supervisor);
    proc::Stat st;
    if (detach->supervisor > 0 && proc::ReadStat(detach->supervisor, &st)) {
      k.set_supervisor_start_ticks(static_cast<int64_t>(st.start_ticks));
    }
  }
  const std::string file = dir + "/" + std::filesystem::path(attempt_dir_).filename().string();
  const std::string tmp = file + ".tmp";
  unlink(tmp.c_str());
  if (std::string error = WriteNewFile(tmp, k.SerializeAsString()); !error.empty()) {
    spdlog::error("cannot keep {} attempt {}: {}", assignment_.task_id(), assignment_.attempt(),
                  error);
    unlink(tmp.c_str());
    return false;
  }
  if (rename(tmp.c_str(), file.c_str()) != 0) {
    spdlog::error("cannot keep {} attempt {}: cannot rename {}: {}", assignment_.task_id(),
                  assignment_.attempt(), tmp, ErrnoText(errno));
    unlink(tmp.c_str());
    return false;
  }
  kept_file_ = file;
  *hold_until_ns = hold;
  return true;
}

void TaskRun::RemoveKept() {
  if (kept_file_.empty()) return;
  unlink(kept_file_.c_str());
  kept_file_.clear();
}

void TaskRun::SetDetach(int index, OutputTail* out, OutputTail* err, internal::ChildControl* ctl) {
  // What the supervisor was told, for the kept file written again when
  // its answer comes.
  auto told = std::make_shared<internal::DetachRequest>();
  const absl::Duration deadline = ctl->deadline;
  ctl->detach = [this, index, out, err, told, deadline](internal::DetachRequest* r) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (detach_until_ns_ == 0) return false;
    }
    const std::string name = internal::NewSupervisorName();
    r->secret = internal::NewSupervisorSecret();
    // Held to the step's own deadline while no agent is there.
    r->stop_at_ns = deadline == absl::InfiniteDuration() ? 0 : absl::ToInt64Nanoseconds(deadline);
    r->grace_ns = absl::ToInt64Nanoseconds(opts_.kill_grace);
    if (r->supervisor == 0) r->supervisor = kept_.has_value() ? kept_->supervisor_pid() : 0;
    int64_t hold = 0;
    if (!WriteKept(index, name, r, step_start_, *out, *err, &hold)) return false;
    r->command.deadline_ns = hold;
    r->command.tail_bytes = opts_.max_output_bytes;
    snprintf(r->command.name, sizeof(r->command.name), "%s", name.c_str());
    *told = *r;
    return true;
  };
  // The output read between the first write and the supervisor's answer
  // goes in too (a kept step taken back had frames in flight).
  ctl->detached = [this, index, out, err, told] {
    int64_t hold = 0;
    WriteKept(index, told->command.name, told.get(), step_start_, *out, *err, &hold);
  };
}

namespace {
constexpr char kKeptResults[] = "results";

// The whole of a regular file (not followed if a link), or nullopt.
std::optional<std::string> ReadWhole(const std::string& file) {
  const int fd = open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string data;
  char buf[64 << 10];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) data.append(buf, static_cast<size_t>(n));
  close(fd);
  return data;
}

// Writes `data` to `dir`/`name` through a temporary file renamed into
// place, so a reader finds the old file or the whole new one.
std::string WriteReplacing(const std::string& dir, const std::string& name,
                           const std::string& data) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::StrCat("cannot create ", dir, ": ", ErrnoText(errno));
  }
  const std::string file = dir + "/" + name;
  const std::string tmp = file + ".tmp";
  unlink(tmp.c_str());
  if (std::string error = WriteNewFile(tmp, data); !error.empty()) {
    unlink(tmp.c_str());
    return error;
  }
  if (rename(tmp.c_str(), file.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return absl::StrCat("cannot rename ", tmp, ": ", ErrnoText(err));
  }
  return "";
}
}  // namespace

std::string WriteKeptResults(const std::string& work_dir, const v1::KeptResults& kept) {
  std::error_code ec;
  const std::string dir = BaseDir(work_dir, &ec) + "/" + kKeptDir;
  if (ec) return absl::StrCat("cannot use the work directory ", work_dir, ": ", ec.message());
  if (kept.messages_size() == 0) {
    unlink((dir + "/" + kKeptResults).c_str());
    return "";
  }
  return WriteReplacing(dir, kKeptResults, kept.SerializeAsString());
}

v1::KeptResults ReadKeptResults(const std::string& work_dir, const std::string& agent_id,
                                std::string* error) {
  v1::KeptResults kept;
  std::error_code ec;
  const std::string file = BaseDir(work_dir, &ec) + "/" + kKeptDir + "/" + kKeptResults;
  if (ec) return kept;
  const std::optional<std::string> data = ReadWhole(file);
  if (!data.has_value()) return kept;
  unlink(file.c_str());
  if (!kept.ParseFromString(*data)) {
    *error = absl::StrCat(file, " cannot be read: the results kept in it are lost");
    return v1::KeptResults();
  }
  if (kept.agent_id() != agent_id) {
    *error = absl::StrCat(file, " holds the results of agent ", kept.agent_id(),
                          ", not of this agent (", agent_id, "): dropped");
    return v1::KeptResults();
  }
  return kept;
}

std::vector<KeptRun> ReadKeptAttempts(const std::string& work_dir,
                                      std::vector<std::string>* dropped) {
  std::vector<KeptRun> found;
  std::error_code ec;
  const std::string base = BaseDir(work_dir, &ec);
  if (ec) return found;
  const std::string dir = base + "/" + kKeptDir;
  std::vector<std::string> files;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    // The kept results are ReadKeptResults'.
    if (name == kKeptResults || name == absl::StrCat(kKeptResults, ".tmp")) continue;
    files.push_back(it->path().string());
  }
  std::sort(files.begin(), files.end());
  for (const std::string& file : files) {
    const std::string data = ReadWhole(file).value_or("");
    unlink(file.c_str());
    if (absl::EndsWith(file, ".tmp")) continue;  // never finished
    KeptRun run;
    std::string why;
    const std::string dir_prefix = base + "/";
    if (!run.kept.ParseFromString(data)) {
      why = absl::StrCat(file, " cannot be read");
    } else if (!absl::StartsWith(run.kept.attempt_dir(), dir_prefix) ||
               run.kept.attempt_dir().find("/..") != std::string::npos) {
      why = absl::StrCat(file, " names an attempt directory outside ", base);
      run.kept.clear_attempt_dir();
    } else if (run.kept.boot_id() != BootId()) {
      why = "it was kept before the machine restarted";
    } else if (MonotonicNs() >= run.kept.hold_until_monotonic_ns()) {
      why = "it was kept for less time than the agent took to come back";
    } else if (!run.kept.supervisor().empty()) {
      run.supervisor_fd = internal::ConnectSupervisor(run.kept.supervisor());
      if (run.supervisor_fd < 0) {
        why = absl::StrCat("its step supervisor does not answer (", ErrnoText(errno), ")");
      } else if (!run.kept.secret().empty() &&
                 !internal::ProveToSupervisor(run.supervisor_fd, run.kept.secret(), kProveWithin)) {
        why = absl::StrCat("its step supervisor did not let this agent in within ",
                           absl::FormatDuration(kProveWithin));
        close(run.supervisor_fd);
        run.supervisor_fd = -1;
      }
    }
    if (why.empty()) {
      found.push_back(std::move(run));
      continue;
    }
    // Not taken back, it must not run on beside the task's next attempt:
    // its supervisor, if it is still the one that was kept, is killed with
    // everything below it.
    if (run.kept.supervisor_pid() > 0 && run.kept.boot_id() == BootId() &&
        proc::KillTree(run.kept.supervisor_pid(),
                       static_cast<uint64_t>(run.kept.supervisor_start_ticks()))) {
      absl::StrAppend(&why, "; killed it with its step");
    }
    if (!run.kept.attempt_dir().empty()) RemoveTree(run.kept.attempt_dir());
    dropped->push_back(absl::StrCat(run.kept.assignment().task_id(), " attempt ",
                                    run.kept.assignment().attempt(), ": ", why));
  }
  return found;
}

const v1::Assignment& TaskRun::assignment() const { return assignment_; }

pid_t TaskRun::current_pid() const { return pid_.load(); }

bool TaskRun::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

void TaskRun::WakeLocked() {
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
}

void TaskRun::Wake() {
  std::lock_guard<std::mutex> lock(mu_);
  WakeLocked();
}

void TaskRun::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return;
  cancelled_ = true;
  cv_.notify_all();
  WakeLocked();
}

v1::TaskResult TaskRun::Run() {
  if (ran_.exchange(true)) {
    spdlog::critical("TaskRun::Run() called twice (task {} attempt {})", assignment_.task_id(),
                     assignment_.attempt());
    std::abort();
  }
  run_start_ = Now();
  // Builtins and HTTP requests neither read inputs nor write the output
  // file, and builtins wait on cv_ rather than poll(): a task of builtins
  // only gets no directory and no eventfd (five syscalls fewer per noop).
  const bool has_exec = std::any_of(assignment_.steps().begin(), assignment_.steps().end(),
                                    [](const v1::Step& s) { return s.has_exec(); });
  const bool has_http = std::any_of(assignment_.steps().begin(), assignment_.steps().end(),
                                    [](const v1::Step& s) { return s.has_http(); });
  if (has_exec || has_http || kept_.has_value()) {
    std::lock_guard<std::mutex> lock(mu_);
    // Without it Cancel() is still seen, at the next poll period.
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) spdlog::warn("eventfd() failed; Cancel() will be noticed late");
  }

  OutputTail out(opts_.max_output_bytes, live_.get(), LiveOutput::kStdout);
  OutputTail err(opts_.max_output_bytes, live_.get(), LiveOutput::kStderr);
  const int n = assignment_.steps_size();
  StepEnd end = StepEnd::Failed(-1, "the assignment has no steps");
  int index = 0;
  StepEnd prepared;
  if (kept_.has_value()) {
    // Where the agent before this one left it.
    run_start_ -= FromProto(kept_->attempt_elapsed());
    attempt_dir_ = kept_->attempt_dir();
    // An agent before this version made no scratch directory.
    if (!attempt_dir_.empty()) mkdir((attempt_dir_ + "/work").c_str(), 0700);
    out.Skip(kept_->stdout_cut_bytes());
    out.Append(kept_->stdout_tail());
    err.Skip(kept_->stderr_cut_bytes());
    err.Append(kept_->stderr_tail());
    index = kept_->step();
  } else if (!cancelled() && has_exec) {
    // Cancelled before it began: the first step reports it, nothing is made.
    prepared = PrepareAttemptDir();
  }
  if (prepared.outcome != v1::OUTCOME_SUCCEEDED) {
    end = prepared;
  } else {
    for (; index < n; ++index) {
      const bool attach = kept_fd_ >= 0 && kept_.has_value() && index == kept_->step();
      int64_t hold = 0;
      // Kept between two steps: the next agent starts this one.
      if (!attach && WriteKept(index, "", nullptr, Now(), out, err, &hold)) {
        detached_.store(true);
        break;
      }
      end = attach ? AttachExecStep(index, &out, &err) : RunStep(index, &out, &err);
      if (detached_.load() || end.outcome != v1::OUTCOME_SUCCEEDED) break;
    }
  }

  {
    std::lock_guard<std::mutex> lock(mu_);
    if (wake_fd_ >= 0) close(wake_fd_);
    wake_fd_ = -1;
  }
  if (detached_.load()) {
    spdlog::info("{} attempt {}: kept at step {} for the next agent", assignment_.task_id(),
                 assignment_.attempt(), index);
    return v1::TaskResult();
  }
  v1::TaskResult result;
  result.set_outcome(end.outcome);
  result.set_exit_code(end.exit_code);
  result.set_step(std::max(0, std::min(index, n - 1)));
  result.set_stdout_cut_bytes(out.cut());
  result.set_stderr_cut_bytes(err.cut());
  result.set_stdout_tail(out.Take());
  result.set_stderr_tail(err.Take());
  result.set_error(end.error);
  result.set_permanent(end.permanent);
  if (!attempt_dir_.empty()) {
    CollectOutput(&result);
    RemoveTree(attempt_dir_);
    attempt_dir_.clear();
  }
  spdlog::debug("task {} attempt {}: {} at step {} (exit code {}) {}", assignment_.task_id(),
                assignment_.attempt(), v1::Outcome_Name(result.outcome()), result.step(),
                result.exit_code(), result.error());
  return result;
}

TaskRun::StepEnd TaskRun::PrepareAttemptDir() {
  const auto failed = [](std::string error) { return StepEnd::Failed(-1, std::move(error)); };
  std::error_code ec;
  // Absolute: a step with a cwd of its own still finds its files.
  const std::string base =
      std::filesystem::absolute(opts_.work_dir.empty() ? DefaultWorkDir("") : opts_.work_dir, ec)
          .lexically_normal()
          .string();
  if (ec)
    return failed(
        absl::StrCat("cannot use the work directory ", opts_.work_dir, ": ", ec.message()));
  std::filesystem::create_directories(std::filesystem::path(base).parent_path(), ec);
  if (mkdir(base.c_str(), 0700) != 0 && errno != EEXIST) {
    return failed(absl::StrCat("cannot create the work directory ", base, ": ", ErrnoText(errno)));
  }
  // Under a shared /tmp someone else may have made it first: the attempt's
  // files (inputs, output) must not live in a directory another user can
  // rearrange.
  struct stat st;
  if (stat(base.c_str(), &st) != 0) {
    return failed(absl::StrCat("cannot use the work directory ", base, ": ", ErrnoText(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return failed(absl::StrCat("the work directory ", base, " is not a directory"));
  }
  if (st.st_uid != geteuid()) {
    return failed(absl::StrCat("the work directory ", base, " belongs to uid ", st.st_uid,
                               ", not to this agent's uid ", geteuid()));
  }
  const std::string& id = assignment_.task_id();
  std::string dir =
      absl::StrCat(base, "/", IsFileName(id) ? id : "task", ".", assignment_.attempt(), ".XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return failed(
        absl::StrCat("cannot create the attempt directory under ", base, ": ", ErrnoText(errno)));
  }
  attempt_dir_ = dir;
  for (const char* sub : {"/inputs", "/work"}) {
    const std::string path = dir + sub;
    if (mkdir(path.c_str(), 0700) != 0) {
      return failed(absl::StrCat("cannot create ", path, ": ", ErrnoText(errno)));
    }
  }
  const std::string inputs = dir + "/inputs";
  for (const auto& [name, data] : assignment_.inputs()) {
    if (!IsFileName(name)) {
      return failed(absl::StrCat("input \"", absl::CHexEscape(name),
                                 "\" is not a task id that can name a file"));
    }
    if (std::string error = WriteNewFile(inputs + "/" + name, data); !error.empty()) {
      return failed("input " + name + ": " + error);
    }
  }
  return StepEnd{};
}

void TaskRun::CollectOutput(v1::TaskResult* result) const {
  const std::string path = attempt_dir_ + "/output";
  // O_NONBLOCK: opening a FIFO a step left there must not hang the agent.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) return;  // no step wrote one
  std::string error;
  std::string data;
  struct stat st;
  if (fd < 0) {
    error = absl::StrCat("cannot open the output file: ", ErrnoText(errno));
  } else if (fstat(fd, &st) != 0) {
    error = absl::StrCat("cannot read the output file: ", ErrnoText(errno));
  } else if (!S_ISREG(st.st_mode)) {
    error = "the output file ($TASKGRID_OUTPUT) is not a regular file";
  } else if (st.st_size > kMaxOutputFileBytes) {
    error = absl::StrCat("the output file ($TASKGRID_OUTPUT) is ", st.st_size,
                         " bytes, over the limit of ", kMaxOutputFileBytes, " bytes (1 MiB)");
  } else {
    // Read to the end, not to st_size: a step may have left a writer behind.
    char buf[64 << 10];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        error = absl::StrCat("cannot read the output file: ", ErrnoText(errno));
        break;
      }
      if (n == 0) break;
      data.append(buf, static_cast<size_t>(n));
      if (data.size() > static_cast<size_t>(kMaxOutputFileBytes)) {
        error = absl::StrCat("the output file ($TASKGRID_OUTPUT) grew past the limit of ",
                             kMaxOutputFileBytes, " bytes (1 MiB) while it was read");
        break;
      }
    }
  }
  if (fd >= 0) close(fd);
  if (error.empty()) {
    result->set_output(std::move(data));
    return;
  }
  // A failed attempt keeps the error that failed it.
  if (result->outcome() == v1::OUTCOME_SUCCEEDED) {
    result->set_outcome(v1::OUTCOME_FAILED);
    result->set_error(error);
  } else {
    spdlog::info("task {} attempt {}: {}", assignment_.task_id(), assignment_.attempt(), error);
  }
}

absl::Duration TaskRun::StepDeadline(int index, bool* is_attempt,
                                     absl::Duration step_elapsed) const {
  const absl::Duration step_timeout = FromProto(assignment_.steps(index).timeout());
  const absl::Duration attempt_timeout = FromProto(assignment_.attempt_timeout());
  const absl::Duration step_deadline = step_timeout > absl::ZeroDuration()
                                           ? Now() - step_elapsed + step_timeout
                                           : absl::InfiniteDuration();
  const absl::Duration attempt_deadline = attempt_timeout > absl::ZeroDuration()
                                              ? run_start_ + attempt_timeout
                                              : absl::InfiniteDuration();
  *is_attempt = attempt_deadline < step_deadline;
  return std::min(step_deadline, attempt_deadline);
}

TaskRun::StepEnd TaskRun::RunStep(int index, OutputTail* out, OutputTail* err) {
  if (cancelled()) return StepEnd{v1::OUTCOME_CANCELLED, -1, "cancelled"};
  const absl::Duration attempt_timeout = FromProto(assignment_.attempt_timeout());
  if (attempt_timeout > absl::ZeroDuration() && Now() >= run_start_ + attempt_timeout) {
    return StepEnd{v1::OUTCOME_TIMED_OUT, -1,
                   StopError(StopReason::kAttemptTimeout, index, assignment_)};
  }
  const v1::Step& step = assignment_.steps(index);
  switch (step.kind_case()) {
    case v1::Step::kExec:
      return RunExecStep(index, out, err);
    case v1::Step::kBuiltin:
      return RunBuiltinStep(index, out);
    case v1::Step::kHttp:
      return RunHttpStep(index, out);
    default:
      return StepEnd::Failed(-1, absl::StrCat("step ", index, " has no exec, builtin or http"));
  }
}

void TaskRun::SetStops(int index, internal::StopControl* ctl, absl::Duration step_elapsed) const {
  bool is_attempt = false;
  ctl->deadline = StepDeadline(index, &is_attempt, step_elapsed);
  ctl->deadline_reason = is_attempt ? StopReason::kAttemptTimeout : StopReason::kStepTimeout;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ctl->wake_fd = wake_fd_;  // stays open until Run() returns
  }
  ctl->cancelled = [this] { return cancelled(); };
}

TaskRun::StepEnd TaskRun::Stopped(StopReason reason, int index) const {
  if (reason == StopReason::kCancelled) return StepEnd{v1::OUTCOME_CANCELLED, -1, "cancelled"};
  if (reason == StopReason::kFenced) {
    return StepEnd{v1::OUTCOME_CANCELLED, -1,
                   absl::StrCat("step ", index,
                                " was stopped by its supervisor: the agent let its lease with the "
                                "scheduler pass without running (frozen?)")};
  }
  return StepEnd{v1::OUTCOME_TIMED_OUT, -1, StopError(reason, index, assignment_)};
}

TaskRun::StepEnd TaskRun::RunExecStep(int index, OutputTail* out, OutputTail* err) {
  const v1::ExecStep& exec = assignment_.steps(index).exec();
  const std::string prefix = absl::StrCat("step ", index, ": ");
  if (exec.argv().empty() || exec.argv(0).empty()) {
    return StepEnd::Failed(-1, prefix + "no program to run (empty argv)");
  }
  for (int i = 0; i < exec.argv_size(); ++i) {
    if (HasNul(exec.argv(i))) {
      return StepEnd::Failed(-1, absl::StrCat(prefix, "argv[", i, "] contains a NUL byte"));
    }
  }
  for (const auto& [name, value] : exec.env()) {
    if (name.empty() || name.find('=') != std::string::npos || HasNul(name) || HasNul(value)) {
      return StepEnd::Failed(
          -1, prefix + "invalid environment variable name or value for '" + name + "'");
    }
  }
  if (HasNul(exec.cwd())) return StepEnd::Failed(-1, prefix + "cwd contains a NUL byte");

  // The agent's environment without its own settings and credentials,
  // the step's overrides, then ours.
  std::map<std::string, std::string> vars;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr) continue;
    std::string name(*e, eq - *e);
    if (!IsAgentsOwnVariable(name)) vars.emplace(std::move(name), std::string(eq + 1));
  }
  for (const auto& [name, value] : exec.env()) vars[name] = value;
  auto path = vars.find("PATH");
  internal::ChildSpec spec;
  spec.search_path = path != vars.end() ? path->second : kDefaultPath;
  vars["TASKGRID_TASK_ID"] = assignment_.task_id();
  vars["TASKGRID_ATTEMPT"] = absl::StrCat(assignment_.attempt());
  vars["TASKGRID_QUEUE"] = assignment_.queue();
  vars["TASKGRID_STEP"] = absl::StrCat(index);
  vars["TASKGRID_INPUTS_DIR"] = attempt_dir_ + "/inputs";
  vars["TASKGRID_OUTPUT"] = attempt_dir_ + "/output";
  vars["TASKGRID_WORK_DIR"] = attempt_dir_ + "/work";
  spec.argv.assign(exec.argv().begin(), exec.argv().end());
  spec.env.reserve(vars.size());
  for (const auto& [name, value] : vars) spec.env.push_back(absl::StrCat(name, "=", value));
  // No cwd: the attempt's scratch directory, which every step of the
  // attempt shares and which goes with the attempt; a relative one is taken
  // from there too, never from wherever the agent was started.
  if (absl::StartsWith(exec.cwd(), "/") || attempt_dir_.empty()) {
    spec.cwd = exec.cwd();
  } else {
    spec.cwd = absl::StrCat(attempt_dir_, "/work", exec.cwd().empty() ? "" : "/", exec.cwd());
  }
  spec.shell_path = opts_.shell_path;
  spec.supervisor = opts_.step_supervisor.empty() ? FindStepSupervisor() : opts_.step_supervisor;
  spec.confine = opts_.confine_steps;
  if (index == 0) spec.stdin_data = assignment_.payload();

  internal::ChildControl ctl;
  SetStops(index, &ctl);
  ctl.kill_grace = opts_.kill_grace;
  ctl.fence_ns = opts_.fence_ns.get();
  ctl.on_pid = [this, index](pid_t pid) {
    pid_.store(pid);
    if (pid != 0) {
      spdlog::debug("task {} attempt {} step {}: started pid {}", assignment_.task_id(),
                    assignment_.attempt(), index, pid);
    }
  };

  step_start_ = Now();
  SetDetach(index, out, err, &ctl);
  const internal::ChildExit ex = internal::RunChild(spec, ctl, out, err);
  return ExitEnd(index, ex);
}

TaskRun::StepEnd TaskRun::AttachExecStep(int index, OutputTail* out, OutputTail* err) {
  internal::ChildControl ctl;
  const absl::Duration step_elapsed = FromProto(kept_->step_elapsed());
  step_start_ = Now() - step_elapsed;
  SetStops(index, &ctl, step_elapsed);
  ctl.kill_grace = opts_.kill_grace;
  ctl.fence_ns = opts_.fence_ns.get();
  SetDetach(index, out, err, &ctl);
  const int fd = std::exchange(kept_fd_, -1);
  const internal::ChildExit ex = internal::AttachChild(fd, ctl, out, err);
  return ExitEnd(index, ex);
}

TaskRun::StepEnd TaskRun::ExitEnd(int index, const internal::ChildExit& ex) {
  const std::string prefix = absl::StrCat("step ", index, ": ");
  if (ex.detached) {
    detached_.store(true);
    return StepEnd{};
  }
  RemoveKept();  // a detach the step's end overtook
  if (!ex.start_error.empty()) return StepEnd::Failed(-1, prefix + ex.start_error);
  if (ex.stopped_by == StopReason::kFenced) fenced_.store(true);
  if (ex.stopped_by != StopReason::kNone) return Stopped(ex.stopped_by, index);
  if (WIFEXITED(ex.wait_status)) {
    const int code = WEXITSTATUS(ex.wait_status);
    if (code == 0) return StepEnd{};
    return StepEnd::Failed(code, absl::StrCat("step ", index, " exited with code ", code));
  }
  if (WIFSIGNALED(ex.wait_status)) {
    return StepEnd::Failed(
        -1, absl::StrCat("step ", index, " killed by signal ", WTERMSIG(ex.wait_status)));
  }
  return StepEnd::Failed(-1,
                         absl::StrCat("step ", index, " ended with wait status ", ex.wait_status));
}

TaskRun::StepEnd TaskRun::RunBuiltinStep(int index, OutputTail* out) {
  bool is_attempt = false;
  const absl::Duration deadline = StepDeadline(index, &is_attempt);
  const StopReason deadline_reason =
      is_attempt ? StopReason::kAttemptTimeout : StopReason::kStepTimeout;
  // Interruptible by Cancel() (cv_) and cut at the step's deadline.
  const internal::SleepFn sleep = [&](absl::Duration d) {
    const absl::Duration until = Now() + d;
    const absl::Duration wake_at = std::min(until, deadline);
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (cancelled_) return StopReason::kCancelled;
      const absl::Duration now = Now();
      if (now >= wake_at) return deadline <= until ? deadline_reason : StopReason::kNone;
      // Bounded, so that the chrono conversion cannot overflow.
      const absl::Duration wait = std::min(wake_at - now, absl::Hours(1));
      cv_.wait_for(lock, absl::ToChronoNanoseconds(wait));
    }
  };

  const internal::BuiltinResult r = internal::RunBuiltin(
      assignment_.steps(index).builtin(), index,
      index == 0 ? absl::string_view(assignment_.payload()) : absl::string_view(), sleep);
  out->Append(r.output);
  if (r.stopped_by != StopReason::kNone) return Stopped(r.stopped_by, index);
  if (!r.error.empty()) return StepEnd::Failed(r.exit_code, r.error);
  return StepEnd{};
}

TaskRun::StepEnd TaskRun::RunHttpStep(int index, OutputTail* out) {
  const v1::HttpStep& step = assignment_.steps(index).http();
  internal::StopControl ctl;
  SetStops(index, &ctl);
  const internal::HttpEnd end =
      internal::RunHttp(step, index, internal::MakeHttpBody(step, assignment_), ctl, out);
  if (end.stopped_by != StopReason::kNone) return Stopped(end.stopped_by, index);
  return StepEnd{end.outcome, end.exit_code, end.error, end.permanent};
}

}  // namespace taskgrid::agent
