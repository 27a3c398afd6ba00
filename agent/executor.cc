#include "agent/executor.h"

#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/builtins.h"
#include "agent/process.h"
#include "common/clock.h"
#include "common/proto_time.h"
#include "spdlog/spdlog.h"

extern char** environ;

namespace taskgrid::agent {
namespace {

using internal::OutputTail;
using internal::StopReason;

// Used to look a program up when neither the agent nor the step sets PATH
// (glibc's confstr(_CS_PATH)).
constexpr char kDefaultPath[] = "/bin:/usr/bin";

absl::Duration Now() { return RealClock::Get()->Monotonic(); }

bool HasNul(const std::string& s) { return s.find('\0') != std::string::npos; }

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

}  // namespace

// How one step ended. SUCCEEDED: go on with the next step.
struct TaskRun::StepEnd {
  v1::Outcome outcome = v1::OUTCOME_SUCCEEDED;
  int exit_code = 0;
  std::string error;

  static StepEnd Failed(int exit_code, std::string error) {
    return StepEnd{v1::OUTCOME_FAILED, exit_code, std::move(error)};
  }
};

TaskRun::TaskRun(v1::Assignment assignment, ExecutorOptions opts)
    : assignment_(std::move(assignment)), opts_(std::move(opts)) {}

TaskRun::~TaskRun() = default;

const v1::Assignment& TaskRun::assignment() const { return assignment_; }

pid_t TaskRun::current_pid() const { return pid_.load(); }

bool TaskRun::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

void TaskRun::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return;
  cancelled_ = true;
  cv_.notify_all();
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
}

v1::TaskResult TaskRun::Run() {
  if (ran_.exchange(true)) {
    spdlog::critical("TaskRun::Run() called twice (task {} attempt {})", assignment_.task_id(),
                     assignment_.attempt());
    std::abort();
  }
  run_start_ = Now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Without it Cancel() is still seen, at the next poll period.
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) spdlog::warn("eventfd() failed; Cancel() will be noticed late");
  }

  OutputTail out(opts_.max_output_bytes);
  OutputTail err(opts_.max_output_bytes);
  const int n = assignment_.steps_size();
  StepEnd end = StepEnd::Failed(-1, "the assignment has no steps");
  int index = 0;
  for (; index < n; ++index) {
    end = RunStep(index, &out, &err);
    if (end.outcome != v1::OUTCOME_SUCCEEDED) break;
  }

  {
    std::lock_guard<std::mutex> lock(mu_);
    if (wake_fd_ >= 0) close(wake_fd_);
    wake_fd_ = -1;
  }
  v1::TaskResult result;
  result.set_outcome(end.outcome);
  result.set_exit_code(end.exit_code);
  result.set_step(std::max(0, std::min(index, n - 1)));
  result.set_stdout_tail(out.Take());
  result.set_stderr_tail(err.Take());
  result.set_error(end.error);
  spdlog::debug("task {} attempt {}: {} at step {} (exit code {}) {}", assignment_.task_id(),
                assignment_.attempt(), v1::Outcome_Name(result.outcome()), result.step(),
                result.exit_code(), result.error());
  return result;
}

absl::Duration TaskRun::StepDeadline(int index, bool* is_attempt) const {
  const absl::Duration step_timeout = FromProto(assignment_.steps(index).timeout());
  const absl::Duration attempt_timeout = FromProto(assignment_.attempt_timeout());
  const absl::Duration step_deadline =
      step_timeout > absl::ZeroDuration() ? Now() + step_timeout : absl::InfiniteDuration();
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
    default:
      return StepEnd::Failed(-1, absl::StrCat("step ", index, " has neither exec nor builtin"));
  }
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

  // The agent's environment, the step's overrides, then ours.
  std::map<std::string, std::string> vars;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) vars.emplace(std::string(*e, eq - *e), std::string(eq + 1));
  }
  for (const auto& [name, value] : exec.env()) vars[name] = value;
  auto path = vars.find("PATH");
  internal::ChildSpec spec;
  spec.search_path = path != vars.end() ? path->second : kDefaultPath;
  vars["TASKGRID_TASK_ID"] = assignment_.task_id();
  vars["TASKGRID_ATTEMPT"] = absl::StrCat(assignment_.attempt());
  vars["TASKGRID_QUEUE"] = assignment_.queue();
  vars["TASKGRID_STEP"] = absl::StrCat(index);
  spec.argv.assign(exec.argv().begin(), exec.argv().end());
  spec.env.reserve(vars.size());
  for (const auto& [name, value] : vars) spec.env.push_back(absl::StrCat(name, "=", value));
  spec.cwd = exec.cwd();
  spec.shell_path = opts_.shell_path;
  if (index == 0) spec.stdin_data = assignment_.payload();

  internal::ChildControl ctl;
  bool is_attempt = false;
  ctl.deadline = StepDeadline(index, &is_attempt);
  ctl.deadline_reason = is_attempt ? StopReason::kAttemptTimeout : StopReason::kStepTimeout;
  ctl.kill_grace = opts_.kill_grace;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ctl.wake_fd = wake_fd_;  // stays open until Run() returns
  }
  ctl.cancelled = [this] { return cancelled(); };
  ctl.on_pid = [this, index](pid_t pid) {
    pid_.store(pid);
    if (pid != 0) {
      spdlog::debug("task {} attempt {} step {}: started pid {}", assignment_.task_id(),
                    assignment_.attempt(), index, pid);
    }
  };

  const internal::ChildExit ex = internal::RunChild(spec, ctl, out, err);
  if (!ex.start_error.empty()) return StepEnd::Failed(-1, prefix + ex.start_error);
  switch (ex.stopped_by) {
    case StopReason::kNone:
      break;
    case StopReason::kCancelled:
      return StepEnd{v1::OUTCOME_CANCELLED, -1, "cancelled"};
    default:
      return StepEnd{v1::OUTCOME_TIMED_OUT, -1, StopError(ex.stopped_by, index, assignment_)};
  }
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
  switch (r.stopped_by) {
    case StopReason::kNone:
      break;
    case StopReason::kCancelled:
      return StepEnd{v1::OUTCOME_CANCELLED, -1, "cancelled"};
    default:
      return StepEnd{v1::OUTCOME_TIMED_OUT, -1, StopError(r.stopped_by, index, assignment_)};
  }
  if (!r.error.empty()) return StepEnd::Failed(r.exit_code, r.error);
  return StepEnd{};
}

}  // namespace taskgrid::agent
