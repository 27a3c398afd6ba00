// TaskRun against real processes: /bin/sh, sleep, cat, head. Every run that
// could hang on a broken executor goes through RunBounded(), which kills the
// step's process group and fails the test instead.
#include "agent/executor.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/landlock.h"
#include "agent/process.h"
#include "agent/step_supervisor.h"
#include "common/clock.h"
#include "common/proto_time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/assignment.h"

namespace taskgrid::agent {
namespace {

using ::taskgrid::testing::Assignment;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// --- Building assignments ---

v1::Step Exec(std::vector<std::string> argv) {
  v1::Step step;
  step.mutable_exec();
  for (std::string& a : argv) step.mutable_exec()->add_argv(std::move(a));
  return step;
}

v1::Step Sh(const std::string& script) { return Exec({"/bin/sh", "-c", script}); }

v1::Step Builtin(const std::string& name, std::vector<std::string> args = {}) {
  v1::Step step;
  step.mutable_builtin()->set_name(name);
  for (std::string& a : args) step.mutable_builtin()->add_args(std::move(a));
  return step;
}

v1::Step WithTimeout(v1::Step step, absl::Duration timeout) {
  *step.mutable_timeout() = ToProto(timeout);
  return step;
}

ExecutorOptions Options() {
  ExecutorOptions opts;
  opts.kill_grace = absl::Milliseconds(300);
  return opts;
}

// --- Running them ---

struct Bounded {
  v1::TaskResult result;
  bool finished_in_time = false;
  absl::Duration elapsed;
};

// Runs `run` on a thread of its own and `during` on this one meanwhile. Past
// `limit`, kills the step's process group until Run() returns.
Bounded RunBounded(TaskRun& run, absl::Duration limit = absl::Seconds(5),
                   const std::function<void(TaskRun&)>& during = nullptr) {
  Bounded b;
  std::atomic<bool> done{false};
  const absl::Time start = absl::Now();
  std::thread runner([&] {
    b.result = run.Run();
    b.elapsed = absl::Now() - start;
    done = true;
  });
  if (during) during(run);
  while (!done && absl::Now() - start < limit) absl::SleepFor(absl::Milliseconds(5));
  b.finished_in_time = done;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!done) {
    const pid_t pid = run.current_pid();
    if (pid > 0) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
    }
    run.Cancel();
    if (absl::Now() > give_up) {
      std::fprintf(stderr, "TaskRun::Run() does not return even when killed; aborting\n");
      std::abort();
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  runner.join();
  return b;
}

v1::TaskResult RunTask(v1::Assignment a, ExecutorOptions opts = Options()) {
  TaskRun run(std::move(a), std::move(opts));
  Bounded b = RunBounded(run);
  EXPECT_TRUE(b.finished_in_time) << "Run() hung; had to kill the step";
  return b.result;
}

bool WaitFor(const std::function<bool()>& pred, absl::Duration limit = absl::Seconds(3)) {
  const absl::Time end = absl::Now() + limit;
  while (absl::Now() < end) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return pred();
}

// --- Looking at processes and fds ---

struct ProcInfo {
  pid_t pid;
  char state;
  pid_t pgrp;
  std::string comm;
};

// Every live (non-zombie) process in process group `pgid`.
std::vector<ProcInfo> GroupMembers(pid_t pgid) {
  std::vector<ProcInfo> members;
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return members;
  while (dirent* e = readdir(dir)) {
    int pid;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t open = stat.find('(');
    const size_t close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    ProcInfo info{pid, '?', 0, stat.substr(open + 1, close - open - 1)};
    int ppid;
    if (std::sscanf(stat.c_str() + close + 1, " %c %d %d", &info.state, &ppid, &info.pgrp) != 3) {
      continue;
    }
    if (info.pgrp == pgid && info.state != 'Z') members.push_back(info);
  }
  closedir(dir);
  return members;
}

int CountSleeps(pid_t pgid) {
  int n = 0;
  for (const ProcInfo& p : GroupMembers(pgid)) n += p.comm == "sleep";
  return n;
}

int CountOpenFds() {
  int n = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (dirent* e = readdir(dir)) n += e->d_name[0] != '.';
  closedir(dir);
  return n;
}

bool IsGone(pid_t pid) { return kill(pid, 0) == -1 && errno == ESRCH; }

// The init of this machine does not reap orphans, so a killed grandchild
// would linger as a zombie (and kill(pid, 0) succeed on it). While this
// lives, orphans of our descendants come to us; ReapOrphan() collects them.
class ScopedSubreaper {
 public:
  ScopedSubreaper() { EXPECT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0); }
  ~ScopedSubreaper() { prctl(PR_SET_CHILD_SUBREAPER, 0); }
};

// Waits (bounded) for `pid` to end and reaps it if it became our child. On
// timeout, kills it so that it cannot outlive the test, and returns false.
bool ReapOrphan(pid_t pid) {
  const absl::Time end = absl::Now() + absl::Seconds(2);
  while (absl::Now() < end) {
    int status;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD && IsGone(pid))) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return false;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/executor_test.XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(absl::StrCat("rm -rf '", path_, "'").c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void WriteFile(const std::string& path, const std::string& content, mode_t mode) {
  std::ofstream(path) << content;
  chmod(path.c_str(), mode);
}

// The entries of directory `dir` ("." and ".." left out), or {"<missing>"}.
std::vector<std::string> Entries(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> names;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  if (ec) return {"<missing>"};
  return names;
}

// --- Exec steps ---

TEST(TaskRun, RunsExecStepAndCapturesOutput) {
  const v1::TaskResult r = RunTask(Assignment({Sh("echo out; echo err >&2")}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(r.exit_code(), 0);
  EXPECT_EQ(r.step(), 0);
  EXPECT_EQ(r.stdout_tail(), "out\n");
  EXPECT_EQ(r.stderr_tail(), "err\n");
  EXPECT_EQ(r.error(), "");
}

TEST(TaskRun, LooksUpProgramInPath) {
  const v1::TaskResult r = RunTask(Assignment({Exec({"echo", "hi", "there"})}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.stdout_tail(), "hi there\n");
}

TEST(TaskRun, UsesTheStepsPathAndRunsScriptsWithoutShebang) {
  TempDir dir;
  WriteFile(dir.path() + "/tg-hello", "echo \"hello from script $1\"\n", 0755);
  v1::Step step = Exec({"tg-hello", "x"});
  (*step.mutable_exec()->mutable_env())["PATH"] = dir.path() + ":/usr/bin:/bin";
  const v1::TaskResult r = RunTask(Assignment({step}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.stdout_tail(), "hello from script x\n");
}

// A step inherits the agent's environment except the agent's own
// settings and credentials (TASKGRID_*, CREDENTIALS_DIRECTORY), which it
// may still set itself.
TEST(TaskRun, PassesEnvironment) {
  setenv("TG_TEST_INHERITED", "agent", 1);
  setenv("TASKGRID_TEST_OVERRIDDEN", "agent", 1);
  setenv("TASKGRID_TOKEN_FILE", "/agent/secret.token", 1);
  setenv("CREDENTIALS_DIRECTORY", "/run/credentials/agent", 1);
  v1::Step step =
      Sh("echo \"$TG_TEST_INHERITED $TASKGRID_TEST_OVERRIDDEN $FOO $TASKGRID_TASK_ID "
         "$TASKGRID_ATTEMPT $TASKGRID_QUEUE $TASKGRID_STEP "
         "[${TASKGRID_TOKEN_FILE-unset} ${CREDENTIALS_DIRECTORY-unset}]\"");
  (*step.mutable_exec()->mutable_env())["TASKGRID_TEST_OVERRIDDEN"] = "step";
  (*step.mutable_exec()->mutable_env())["FOO"] = "bar baz";
  v1::Assignment a = Assignment({Builtin("noop"), step});
  a.set_task_id("task-42");
  a.set_attempt(3);
  a.set_queue("gpu");
  const v1::TaskResult r = RunTask(a);
  unsetenv("TG_TEST_INHERITED");
  unsetenv("TASKGRID_TEST_OVERRIDDEN");
  unsetenv("TASKGRID_TOKEN_FILE");
  unsetenv("CREDENTIALS_DIRECTORY");
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.stdout_tail(), "agent step bar baz task-42 3 gpu 1 [unset unset]\n");
}

TEST(TaskRun, RunsInWorkingDirectory) {
  TempDir dir;
  char real[PATH_MAX];
  ASSERT_NE(realpath(dir.path().c_str(), real), nullptr);
  v1::Step step = Exec({"/bin/sh", "-c", "pwd -P"});
  step.mutable_exec()->set_cwd(dir.path());
  const v1::TaskResult r = RunTask(Assignment({step}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.stdout_tail(), std::string(real) + "\n");
}

TEST(TaskRun, MissingWorkingDirectoryFailsClearly) {
  v1::Step step = Sh("echo should not run");
  step.mutable_exec()->set_cwd("/no/such/dir");
  const v1::TaskResult r = RunTask(Assignment({step}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.exit_code(), -1);
  EXPECT_EQ(r.error(),
            "step 0: cannot change directory to /no/such/dir: No such file or directory");
  EXPECT_EQ(r.stdout_tail(), "");
}

TEST(TaskRun, ReportsProgramThatCannotStart) {
  v1::TaskResult r = RunTask(Assignment({Exec({"/no/such"})}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.exit_code(), -1);
  EXPECT_EQ(r.error(), "step 0: cannot run /no/such: No such file or directory");

  r = RunTask(Assignment({Builtin("noop"), Exec({"taskgrid-no-such-program", "arg"})}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.exit_code(), -1);
  EXPECT_EQ(r.step(), 1);
  EXPECT_EQ(r.error(), "step 1: cannot run taskgrid-no-such-program: No such file or directory");

  TempDir dir;
  WriteFile(dir.path() + "/not-executable", "echo hi\n", 0644);
  r = RunTask(Assignment({Exec({dir.path() + "/not-executable"})}));
  EXPECT_EQ(r.exit_code(), -1);
  EXPECT_THAT(r.error(), EndsWith("not-executable: Permission denied"));
}

TEST(TaskRun, ExitCode127IsAnExitCodeNotAStartFailure) {
  const v1::TaskResult r = RunTask(Assignment({Sh("exit 127")}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.exit_code(), 127);
  EXPECT_EQ(r.error(), "step 0 exited with code 127");
}

TEST(TaskRun, StopsAtFirstFailingStep) {
  const v1::TaskResult r =
      RunTask(Assignment({Sh("echo a"), Sh("echo b >&2; exit 3"), Sh("echo c")}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.exit_code(), 3);
  EXPECT_EQ(r.step(), 1);
  EXPECT_EQ(r.stdout_tail(), "a\n");
  EXPECT_EQ(r.stderr_tail(), "b\n");
  EXPECT_EQ(r.error(), "step 1 exited with code 3");
}

TEST(TaskRun, ReportsLastStepOnSuccess) {
  const v1::TaskResult r = RunTask(Assignment({Sh("echo a"), Builtin("noop"), Sh("echo c")}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(r.step(), 2);
  EXPECT_EQ(r.stdout_tail(), "a\nc\n");
}

TEST(TaskRun, ReportsKillingSignal) {
  const v1::TaskResult r = RunTask(Assignment({Builtin("noop"), Sh("kill -9 $$")}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.exit_code(), -1);
  EXPECT_EQ(r.step(), 1);
  EXPECT_EQ(r.error(), "step 1 killed by signal 9");
}

// --- stdin and output ---

TEST(TaskRun, PayloadIsTheFirstStepsStdinOnly) {
  const v1::TaskResult r =
      RunTask(Assignment({Exec({"cat"}), Exec({"cat"}), Exec({"cat"})}, "hello payload"));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.stdout_tail(), "hello payload");
}

TEST(TaskRun, StreamsLargePayloadWithoutDeadlock) {
  // cat writes back while we still write: a writer that does not read
  // meanwhile blocks on a full pipe forever.
  std::string payload(1 << 20, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>('a' + i * 7 % 26);
  ExecutorOptions opts = Options();
  opts.max_output_bytes = 2 << 20;
  const v1::TaskResult r = RunTask(Assignment({Exec({"cat"})}, payload), opts);
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_TRUE(r.stdout_tail() == payload) << "stdout has " << r.stdout_tail().size() << " bytes";
}

TEST(TaskRun, IgnoresStdinTheStepDoesNotRead) {
  // Writing the rest of the payload then fails with EPIPE (and raises
  // SIGPIPE): neither may end the agent or fail the step.
  const std::string payload(1 << 20, 'x');
  v1::TaskResult r = RunTask(Assignment({Sh("exec 0<&-; sleep 0.1; echo done")}, payload));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.stdout_tail(), "done\n");
  r = RunTask(Assignment({Exec({"true"})}, payload));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
}

TEST(TaskRun, KeepsOnlyTheLastOutputBytesOverAllSteps) {
  ExecutorOptions opts = Options();
  opts.max_output_bytes = 10;
  const v1::TaskResult r = RunTask(
      Assignment({Sh("echo hello; echo e1 >&2"), Builtin("echo", {"world"}), Sh("echo e2 >&2")}),
      opts);
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.stdout_tail(), "llo\nworld\n");
  EXPECT_EQ(r.stderr_tail(), "e1\ne2\n");
  EXPECT_EQ(r.stdout_cut_bytes(), 2) << "\"he\" of hello went";
  EXPECT_EQ(r.stderr_cut_bytes(), 0);
}

TEST(TaskRun, HugeOutputUsesBoundedMemory) {
  rusage before;
  getrusage(RUSAGE_SELF, &before);
  // A cap that is no multiple of the pipe reads, so that bytes are trimmed.
  ExecutorOptions opts = Options();
  opts.max_output_bytes = 1000000;
  const v1::TaskResult r =
      RunTask(Assignment({Sh("head -c 100000000 /dev/zero; printf END")}), opts);
  rusage after;
  getrusage(RUSAGE_SELF, &after);
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.stdout_tail().size(), 1000000u);
  EXPECT_THAT(r.stdout_tail(), EndsWith(std::string(10, '\0') + "END"));
  // ru_maxrss is in KiB: 100 MB kept in memory would show.
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 40 << 10);
}

// --- Timeouts ---

TEST(TaskRun, StepTimeoutKillsTheStep) {
  v1::Assignment a =
      Assignment({WithTimeout(Sh("echo started; exec sleep 600"), absl::Milliseconds(200))});
  TaskRun timed(a, Options());
  pid_t pid = 0;
  const Bounded b = RunBounded(timed, absl::Seconds(5), [&](TaskRun& r) {
    WaitFor([&] { return (pid = r.current_pid()) != 0; });
  });
  ASSERT_TRUE(b.finished_in_time);
  EXPECT_EQ(b.result.outcome(), v1::OUTCOME_TIMED_OUT);
  EXPECT_EQ(b.result.exit_code(), -1);
  EXPECT_EQ(b.result.step(), 0);
  EXPECT_EQ(b.result.error(), "step 0 timed out after 200ms (step timeout)");
  EXPECT_EQ(b.result.stdout_tail(), "started\n");
  EXPECT_GE(b.elapsed, absl::Milliseconds(200));
  EXPECT_LT(b.elapsed, absl::Seconds(2));
  ASSERT_NE(pid, 0);
  EXPECT_TRUE(IsGone(pid));
  EXPECT_TRUE(IsGone(-pid));
}

TEST(TaskRun, AttemptTimeoutCoversAllSteps) {
  v1::Assignment a = Assignment({Builtin("sleep", {"0.2"}), Exec({"sleep", "600"})});
  *a.mutable_attempt_timeout() = ToProto(absl::Milliseconds(400));
  TaskRun run(a, Options());
  const Bounded b = RunBounded(run);
  ASSERT_TRUE(b.finished_in_time);
  EXPECT_EQ(b.result.outcome(), v1::OUTCOME_TIMED_OUT);
  EXPECT_EQ(b.result.exit_code(), -1);
  EXPECT_EQ(b.result.step(), 1);
  EXPECT_EQ(b.result.error(), "attempt timed out after 400ms (attempt timeout) in step 1");
  EXPECT_GE(b.elapsed, absl::Milliseconds(400));
  EXPECT_LT(b.elapsed, absl::Seconds(2));
}

TEST(TaskRun, EscalatesToSigkillWhenSigtermIsIgnored) {
  // sh and its sleep both ignore SIGTERM; only SIGKILL, kill_grace after the
  // deadline, ends them.
  v1::Assignment a = Assignment(
      {WithTimeout(Sh("trap '' TERM; sleep 600; echo survived"), absl::Milliseconds(200))});
  ExecutorOptions opts = Options();
  opts.kill_grace = absl::Milliseconds(300);
  ScopedSubreaper subreaper;
  TaskRun run(a, opts);
  pid_t pid = 0;
  std::vector<ProcInfo> members;
  const Bounded b = RunBounded(run, absl::Seconds(5), [&](TaskRun& r) {
    WaitFor([&] { return (pid = r.current_pid()) != 0 && CountSleeps(pid) == 1; });
    members = GroupMembers(pid);
  });
  ASSERT_TRUE(b.finished_in_time);
  EXPECT_EQ(b.result.outcome(), v1::OUTCOME_TIMED_OUT);
  EXPECT_EQ(b.result.exit_code(), -1);
  EXPECT_EQ(b.result.stdout_tail(), "");
  EXPECT_GE(b.elapsed, absl::Milliseconds(500));
  EXPECT_LT(b.elapsed, absl::Seconds(3));
  ASSERT_NE(pid, 0);
  ASSERT_EQ(members.size(), 2u);  // sh and sleep
  for (const ProcInfo& m : members) {
    EXPECT_TRUE(ReapOrphan(m.pid)) << m.comm << " " << m.pid << " survived";
  }
  EXPECT_TRUE(IsGone(-pid));
}

// --- Cancel ---

TEST(TaskRun, KillsProcessGroupOnCancel) {
  ScopedSubreaper subreaper;
  TaskRun run(Assignment({Sh("sleep 600 & sleep 600")}), ExecutorOptions());
  pid_t pid = 0;
  std::vector<ProcInfo> members;
  const Bounded b = RunBounded(run, absl::Seconds(5), [&](TaskRun& r) {
    ASSERT_TRUE(WaitFor([&] { return (pid = r.current_pid()) != 0 && CountSleeps(pid) == 2; }));
    EXPECT_EQ(getpgid(pid), pid);  // the step leads a group of its own
    members = GroupMembers(pid);
    r.Cancel();
  });
  ASSERT_TRUE(b.finished_in_time);
  EXPECT_EQ(b.result.outcome(), v1::OUTCOME_CANCELLED);
  EXPECT_EQ(b.result.exit_code(), -1);
  EXPECT_EQ(b.result.error(), "cancelled");
  EXPECT_LT(b.elapsed, absl::Seconds(2));  // SIGTERM did it: no kill_grace wait
  EXPECT_EQ(run.current_pid(), 0);
  ASSERT_GE(members.size(), 2u);
  for (const ProcInfo& m : members) {
    EXPECT_TRUE(ReapOrphan(m.pid)) << m.comm << " " << m.pid << " survived";
    EXPECT_TRUE(IsGone(m.pid)) << m.comm << " " << m.pid;
  }
  EXPECT_TRUE(IsGone(-pid));
}

TEST(TaskRun, KillsWhatTheStepLeftBehind) {
  // The background sleep also holds stdout open: waiting for EOF alone would
  // wait for it.
  ScopedSubreaper subreaper;
  const absl::Time start = absl::Now();
  const v1::TaskResult r = RunTask(Assignment({Sh("sleep 600 & echo $!")}));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  pid_t orphan = 0;
  ASSERT_TRUE(absl::SimpleAtoi(r.stdout_tail(), &orphan)) << r.stdout_tail();
  EXPECT_TRUE(ReapOrphan(orphan));
  EXPECT_TRUE(IsGone(orphan));
}

TEST(TaskRun, KillsWhatTheStepLeftBehindInANewSession) {
  // setsid takes the sleep out of the step's process group and session; the
  // step's supervisor still finds it (it is the subreaper of the step).
  const absl::Time start = absl::Now();
  const v1::TaskResult r = RunTask(Assignment({Sh("setsid sleep 600 >/dev/null & echo $!")}));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  pid_t orphan = 0;
  ASSERT_TRUE(absl::SimpleAtoi(r.stdout_tail(), &orphan)) << r.stdout_tail();
  EXPECT_TRUE(WaitFor([&] { return IsGone(orphan); })) << "pid " << orphan << " survived";
  if (!IsGone(orphan)) kill(orphan, SIGKILL);
}

TEST(TaskRun, ReportsTheStepsOwnExitStatusThroughItsSupervisor) {
  const v1::TaskResult code = RunTask(Assignment({Sh("exit 7")}));
  EXPECT_EQ(code.exit_code(), 7);
  EXPECT_EQ(code.error(), "step 0 exited with code 7");
  const v1::TaskResult signalled = RunTask(Assignment({Sh("kill -USR1 $$")}));
  EXPECT_EQ(signalled.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(signalled.error(), absl::StrCat("step 0 killed by signal ", SIGUSR1));
}

TEST(TaskRun, AMissingSupervisorFailsTheStepWithoutRunningIt) {
  TempDir dir;
  const std::string marker = dir.path() + "/marker";
  ExecutorOptions opts = Options();
  opts.step_supervisor = dir.path() + "/no-such-supervisor";
  const v1::TaskResult r = RunTask(Assignment({Sh("touch '" + marker + "'")}), opts);
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.error(), absl::StrCat("step 0: cannot start the step supervisor ", dir.path(),
                                    "/no-such-supervisor: No such file or directory"));
  EXPECT_NE(access(marker.c_str(), F_OK), 0);
}

// The supervisor on its own, as the agent starts it: when the lifeline's
// write end closes (the agent process died), the step and everything it
// started, in a new session too, are killed at once.
TEST(StepSupervisor, KillsTheWholeStepWhenItsAgentGoes) {
  const std::string supervisor = FindStepSupervisor();
  ASSERT_FALSE(supervisor.empty());
  TempDir dir;
  const std::string gc_file = dir.path() + "/gc";
  int lifeline[2], report[2], output[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, lifeline), 0);
  ASSERT_EQ(pipe2(report, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(output, O_CLOEXEC), 0);
  const std::string script = "setsid sleep 600 >/dev/null & echo $! > '" + gc_file + "'; sleep 600";
  std::vector<std::string> args = {supervisor,
                                   absl::StrCat(lifeline[0]),
                                   absl::StrCat(report[1]),
                                   absl::StrCat(output[0]),
                                   absl::StrCat(output[0]),
                                   "/bin/sh",
                                   supervisor::kNoConfine,
                                   "1",
                                   "/bin/sh",
                                   "--",
                                   "sh",
                                   "-c",
                                   script};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ScopedSubreaper subreaper;
  const pid_t pid = fork();
  if (pid == 0) {
    fcntl(lifeline[0], F_SETFD, 0);
    fcntl(report[1], F_SETFD, 0);
    fcntl(output[0], F_SETFD, 0);
    execv(argv[0], argv.data());
    _exit(127);
  }
  ASSERT_GT(pid, 0);
  close(lifeline[0]);
  close(report[1]);
  close(output[0]);
  close(output[1]);
  int rec[2] = {0, 0};  // supervisor::Report: the kRunning record, the step's pid
  ASSERT_EQ(read(report[0], rec, sizeof(rec)), static_cast<ssize_t>(sizeof(rec)));
  close(report[0]);
  const pid_t step = rec[1];
  pid_t gc = 0;
  ASSERT_TRUE(WaitFor([&] {
    std::ifstream in(gc_file);
    return static_cast<bool>(in >> gc) && gc > 0;
  }));
  EXPECT_EQ(getpgid(step), step);
  // $! is written before the background process has called setsid().
  EXPECT_TRUE(WaitFor([&] { return getsid(gc) != getsid(step); }))
      << "the grandchild did not leave the step's session";
  EXPECT_FALSE(IsGone(step));
  EXPECT_FALSE(IsGone(gc));

  close(lifeline[1]);  // what the kernel does when the agent dies
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGKILL) << status;
  EXPECT_TRUE(IsGone(step)) << "the step survived its agent";
  EXPECT_TRUE(IsGone(gc)) << "the step's grandchild in a new session survived its agent";
  for (pid_t p : {step, gc}) {
    if (!IsGone(p)) kill(p, SIGKILL);
  }
}

// --- Keeping steps through an agent restart ---

ExecutorOptions InDir(const std::string& work_dir);  // below

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

void Touch(const std::string& path) { std::ofstream(path) << ""; }

pid_t ReadPid(const std::string& path) {
  pid_t pid = 0;
  std::ifstream in(path);
  in >> pid;
  return pid;
}

// Shell that waits (bounded: 60 s) for `file` to exist.
std::string AwaitFile(const std::string& file) {
  return "i=0; while [ ! -e '" + file + "' ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; ";
}

int64_t MonotonicNsIn(absl::Duration d) {
  return absl::ToInt64Nanoseconds(RealClock::Get()->Monotonic() + d);
}

// Runs `run` until it has started the step that writes `pid_file`, then
// detaches it for `hold`; expects Run() to return at once, kept.
void RunAndDetach(TaskRun& run, const std::string& pid_file, absl::Duration hold) {
  const Bounded b = RunBounded(run, absl::Seconds(20), [&](TaskRun& r) {
    ASSERT_TRUE(WaitFor([&] { return ReadPid(pid_file) > 0; }, absl::Seconds(10)));
    r.Detach(MonotonicNsIn(hold));
  });
  ASSERT_TRUE(b.finished_in_time);
  EXPECT_TRUE(run.detached());
}

TEST(KeptRun, TheNextAgentTakesTheStepBackWithAllItsOutput) {
  TempDir dir, work;
  const std::string d = dir.path();
  // Writes before the detach, while no agent is there, and after the next
  // one came; then a second step and the output file.
  const std::string script = "echo before; echo $$ > '" + d + "/pid'; " + AwaitFile(d + "/go") +
                             "echo during; echo oops >&2; touch '" + d + "/wrote'; " +
                             AwaitFile(d + "/go2") +
                             "echo after; echo result > \"$TASKGRID_OUTPUT\"";
  v1::Assignment a = Assignment({Sh(script), Sh("echo second step")});
  a.set_task_id("kept-task");
  TaskRun first(a, InDir(work.path()));
  RunAndDetach(first, d + "/pid", absl::Seconds(60));
  const pid_t step = ReadPid(d + "/pid");
  EXPECT_FALSE(IsGone(step)) << "the step went with the run that kept it";
  EXPECT_THAT(Entries(work.path() + "/kept"), ::testing::SizeIs(1));

  Touch(d + "/go");
  ASSERT_TRUE(WaitFor([&] { return Exists(d + "/wrote"); }, absl::Seconds(10)));
  std::vector<std::string> dropped;
  std::vector<KeptRun> kept = ReadKeptAttempts(work.path(), &dropped);
  EXPECT_THAT(dropped, IsEmpty());
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].kept.step(), 0);
  EXPECT_GE(kept[0].supervisor_fd, 0);
  EXPECT_THAT(Entries(work.path() + "/kept"), IsEmpty()) << "read once, then removed";

  TaskRun second(std::move(kept[0]), InDir(work.path()));
  const Bounded b = RunBounded(second, absl::Seconds(20), [&](TaskRun&) { Touch(d + "/go2"); });
  ASSERT_TRUE(b.finished_in_time);
  EXPECT_FALSE(second.detached());
  EXPECT_EQ(b.result.outcome(), v1::OUTCOME_SUCCEEDED) << b.result.error();
  EXPECT_EQ(b.result.stdout_tail(), "before\nduring\nafter\nsecond step\n");
  EXPECT_EQ(b.result.stderr_tail(), "oops\n");
  EXPECT_EQ(b.result.output(), "result\n");
  EXPECT_EQ(b.result.step(), 1);
  EXPECT_THAT(Entries(work.path()), ::testing::ElementsAre("kept")) << "the attempt dir is gone";
  EXPECT_TRUE(WaitFor([&] { return IsGone(step); }));
}

TEST(KeptRun, AStepThatEndsWhileKeptIsCollectedAndCanBeKeptAgain) {
  TempDir dir, work;
  const std::string d = dir.path();
  const std::string script =
      "echo one; echo $$ > '" + d + "/pid'; " + AwaitFile(d + "/go") + "echo two; exit 3";
  TaskRun first(Assignment({Sh(script)}), InDir(work.path()));
  RunAndDetach(first, d + "/pid", absl::Seconds(60));
  std::vector<std::string> dropped;
  std::vector<KeptRun> kept = ReadKeptAttempts(work.path(), &dropped);
  ASSERT_EQ(kept.size(), 1u);

  // Taken back, then kept again (a second restart) before it ends.
  TaskRun second(std::move(kept[0]), InDir(work.path()));
  const Bounded b2 = RunBounded(second, absl::Seconds(20),
                                [&](TaskRun& r) { r.Detach(MonotonicNsIn(absl::Seconds(60))); });
  ASSERT_TRUE(b2.finished_in_time);
  ASSERT_TRUE(second.detached());

  // It ends with no agent there: its status waits for the next one.
  const pid_t step = ReadPid(d + "/pid");
  Touch(d + "/go");
  ASSERT_TRUE(WaitFor([&] { return IsGone(step); }, absl::Seconds(10)));
  kept = ReadKeptAttempts(work.path(), &dropped);
  EXPECT_THAT(dropped, IsEmpty());
  ASSERT_EQ(kept.size(), 1u);
  TaskRun third(std::move(kept[0]), InDir(work.path()));
  const Bounded b3 = RunBounded(third);
  ASSERT_TRUE(b3.finished_in_time);
  EXPECT_EQ(b3.result.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(b3.result.exit_code(), 3);
  EXPECT_EQ(b3.result.stdout_tail(), "one\ntwo\n");
}

TEST(KeptRun, NoAgentByTheDeadlineKillsTheWholeStep) {
  TempDir dir, work;
  const std::string d = dir.path();
  const std::string script = "setsid sh -c 'echo $$ > \"$0/gc\"; exec sleep 600' '" + d +
                             "' & echo $$ > '" + d + "/pid'; sleep 600";
  TaskRun run(Assignment({Sh(script)}), InDir(work.path()));
  RunAndDetach(run, d + "/pid", absl::Milliseconds(500));
  const pid_t step = ReadPid(d + "/pid");
  ASSERT_TRUE(WaitFor([&] { return ReadPid(d + "/gc") > 0; }));
  const pid_t gc = ReadPid(d + "/gc");
  EXPECT_TRUE(WaitFor([&] { return IsGone(step) && IsGone(gc); }, absl::Seconds(10)))
      << "the step and its grandchild in a new session outlived the hold";
  for (pid_t p : {step, gc}) {
    if (!IsGone(p)) kill(p, SIGKILL);
  }
  std::vector<std::string> dropped;
  EXPECT_THAT(ReadKeptAttempts(work.path(), &dropped), IsEmpty());
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_THAT(dropped[0], HasSubstr("kept for less time than the agent took"));
  EXPECT_THAT(Entries(work.path()), ::testing::ElementsAre("kept")) << "its directory went too";
}

// --- Steps that attack their supervisor, and kept steps held to their
// deadlines and to the agent that kept them ---

// A step that kills its own supervisor (confinement off: what a kernel
// without Landlock's scopes allows) leaves what it started in a new session
// to this process, a subreaper as taskgrid-agent is: it is killed before
// Run() returns.
TEST(TaskRun, WhatAStepThatKilledItsSupervisorLeftIsKilledBeforeTheRunEnds) {
  ScopedSubreaper subreaper;
  TempDir dir;
  const std::string d = dir.path();
  for (const std::string& start :
       {std::string("setsid sh -c 'echo $$ > \"$0/gc\"; exec sleep 600' '") + d + "' &",
        // a double fork: the grandchild's parent is gone at once
        std::string("sh -c 'setsid sh -c \"echo \\$\\$ > $0/gc; exec sleep 600\" &' '") + d +
            "';"}) {
    SCOPED_TRACE(start);
    unlink((d + "/gc").c_str());
    const std::string script = start + " i=0; while [ ! -s '" + d +
                               "/gc' ] && [ $i -lt 200 ]; do sleep 0.01; i=$((i+1)); done; "
                               "kill -9 $PPID; sleep 5";
    TaskRun run(Assignment({Sh(script)}), Options());
    const Bounded b = RunBounded(run, absl::Seconds(10));
    ASSERT_TRUE(b.finished_in_time);
    EXPECT_EQ(b.result.outcome(), v1::OUTCOME_FAILED);
    EXPECT_THAT(b.result.error(), HasSubstr("killed by signal 9"));
    const pid_t gc = ReadPid(d + "/gc");
    ASSERT_GT(gc, 0);
    EXPECT_TRUE(IsGone(gc)) << "pid " << gc << " outlived its attempt";
    if (!IsGone(gc)) kill(gc, SIGKILL);
  }
}

// With Landlock's scopes (Linux 6.12+) the step cannot signal its
// supervisor at all: the kill fails, and the step runs to its own end.
TEST(TaskRun, AConfinedStepCannotSignalItsSupervisorOrTheAgent) {
  if (!landlock::ScopesAvailable()) {
    GTEST_SKIP() << "this kernel has no Landlock scopes (ABI " << landlock::Abi() << ")";
  }
  ExecutorOptions opts = Options();
  opts.confine_steps = true;
  const v1::TaskResult r = RunTask(
      Assignment({Sh(absl::StrCat("kill -STOP $PPID 2>/dev/null; echo $?; kill -0 ", getpid(),
                                  " 2>/dev/null; echo $?; sh -c 'kill -0 $$'; echo $?"))}),
      opts);
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  // Its supervisor and this process are out of reach; its own are not.
  EXPECT_EQ(r.stdout_tail(), "1\n1\n0\n");
}

// A step that stops its supervisor (SIGSTOP) cannot keep its attempt:
// the stop wakes the supervisor, and one that still does not end after the
// kill grace is killed, what it left with it.
TEST(TaskRun, CancelAndTimeoutsEndAStepThatStoppedItsSupervisor) {
  ScopedSubreaper subreaper;
  TempDir dir;
  const std::string d = dir.path();
  // Stops its supervisor again and again, ignoring SIGTERM.
  const std::string script = "trap '' TERM; echo $$ > '" + d +
                             "/pid'; setsid sh -c 'echo $$ > \"$0/gc\"; exec sleep 600' '" + d +
                             "' & while :; do kill -STOP $PPID; sleep 0.05; done";
  {
    TaskRun run(Assignment({Sh(script)}), Options());
    const Bounded b = RunBounded(run, absl::Seconds(15), [&](TaskRun& r) {
      ASSERT_TRUE(WaitFor([&] { return ReadPid(d + "/gc") > 0; }, absl::Seconds(5)));
      r.Cancel();
    });
    ASSERT_TRUE(b.finished_in_time);
    EXPECT_EQ(b.result.outcome(), v1::OUTCOME_CANCELLED);
    for (const char* f : {"/pid", "/gc"}) {
      const pid_t p = ReadPid(d + f);
      EXPECT_TRUE(WaitFor([&] { return IsGone(p); })) << f << " " << p << " survived";
      if (!IsGone(p)) kill(p, SIGKILL);
    }
  }
  unlink((d + "/gc").c_str());
  {
    TaskRun run(Assignment({WithTimeout(Sh(script), absl::Milliseconds(500))}), Options());
    const Bounded b = RunBounded(run, absl::Seconds(15));
    ASSERT_TRUE(b.finished_in_time);
    EXPECT_EQ(b.result.outcome(), v1::OUTCOME_TIMED_OUT);
    const pid_t gc = ReadPid(d + "/gc");
    EXPECT_TRUE(WaitFor([&] { return IsGone(gc); })) << gc << " survived";
    if (!IsGone(gc)) kill(gc, SIGKILL);
  }
}

// The kept file of the one attempt kept in `work`.
v1::KeptAttempt KeptFile(const std::string& work) {
  v1::KeptAttempt k;
  for (const std::string& name : Entries(work + "/kept")) {
    std::ifstream in(work + "/kept/" + name, std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(k.ParseFromString(data)) << name;
  }
  return k;
}

// While no agent is there, a kept step is held to its own deadline: its
// supervisor stops it at its attempt timeout, not at the hold's end, and
// the next agent reads that it timed out.
TEST(KeptRun, AKeptStepIsStoppedAtItsAttemptTimeoutWithNoAgentThere) {
  TempDir dir, work;
  const std::string d = dir.path();
  v1::Assignment a = Assignment({Sh("trap 'echo term; exit 1' TERM; echo $$ > '" + d + "/pid'; " +
                                    "while :; do sleep 0.05; done")});
  *a.mutable_attempt_timeout() = ToProto(absl::Seconds(1));
  TaskRun first(a, InDir(work.path()));
  RunAndDetach(first, d + "/pid", absl::Seconds(60));
  const pid_t step = ReadPid(d + "/pid");
  const absl::Time detached = absl::Now();
  EXPECT_TRUE(WaitFor([&] { return IsGone(step); }, absl::Seconds(10)))
      << "the kept step ran past its attempt timeout";
  EXPECT_LT(absl::Now() - detached, absl::Seconds(5));
  std::vector<std::string> dropped;
  std::vector<KeptRun> kept = ReadKeptAttempts(work.path(), &dropped);
  ASSERT_EQ(kept.size(), 1u) << (dropped.empty() ? "" : dropped[0]);
  TaskRun second(std::move(kept[0]), InDir(work.path()));
  const Bounded b = RunBounded(second);
  ASSERT_TRUE(b.finished_in_time);
  EXPECT_EQ(b.result.outcome(), v1::OUTCOME_TIMED_OUT) << b.result.error();
  EXPECT_THAT(b.result.error(), HasSubstr("attempt timeout"));
  EXPECT_THAT(b.result.stdout_tail(), HasSubstr("term"));
}

// Only the agent that holds the kept file's secret gets a kept step back:
// another process of the same user that connects first reads nothing and
// keeps nobody out.
TEST(KeptRun, OnlyTheSecretTakesAKeptStepBack) {
  TempDir dir, work;
  const std::string d = dir.path();
  const std::string script =
      "echo secret-output; echo $$ > '" + d + "/pid'; " + AwaitFile(d + "/go") + "echo end";
  TaskRun first(Assignment({Sh(script)}), InDir(work.path()));
  RunAndDetach(first, d + "/pid", absl::Seconds(60));
  const v1::KeptAttempt k = KeptFile(work.path());
  ASSERT_FALSE(k.supervisor().empty());
  EXPECT_EQ(k.secret().size(), supervisor::kSecretBytes);

  // One squatter sends a wrong record; another just waits.
  const int wrong = internal::ConnectSupervisor(k.supervisor());
  ASSERT_GE(wrong, 0);
  supervisor::Command bogus;
  memset(&bogus, 0, sizeof(bogus));
  bogus.type = supervisor::kSecret;
  ASSERT_TRUE(supervisor::SendAll(wrong, &bogus, sizeof(bogus)));
  const int silent = internal::ConnectSupervisor(k.supervisor());
  ASSERT_GE(silent, 0);
  char buf[256];
  EXPECT_EQ(recv(wrong, buf, sizeof(buf), 0), 0) << "a wrong secret was answered";
  close(wrong);

  std::vector<std::string> dropped;
  std::vector<KeptRun> kept = ReadKeptAttempts(work.path(), &dropped);
  ASSERT_EQ(kept.size(), 1u) << (dropped.empty() ? "" : dropped[0]);
  TaskRun second(std::move(kept[0]), InDir(work.path()));
  const Bounded b = RunBounded(second, absl::Seconds(10), [&](TaskRun&) { Touch(d + "/go"); });
  ASSERT_TRUE(b.finished_in_time);
  EXPECT_EQ(b.result.outcome(), v1::OUTCOME_SUCCEEDED) << b.result.error();
  EXPECT_EQ(b.result.stdout_tail(), "secret-output\nend\n");
  // The silent one was never let in: closed, nothing read.
  pollfd p = {silent, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1);
  EXPECT_EQ(recv(silent, buf, sizeof(buf), 0), 0);
  close(silent);
}

// A kept step its supervisor cannot hand back (here: stopped) is killed by
// the next agent, with what it started, before its task may move.
TEST(KeptRun, AKeptStepThatIsNotTakenBackIsKilled) {
  TempDir dir, work;
  const std::string d = dir.path();
  const std::string script = "setsid sh -c 'echo $$ > \"$0/gc\"; exec sleep 600' '" + d +
                             "' & echo $$ > '" + d + "/pid'; sleep 600";
  TaskRun first(Assignment({Sh(script)}), InDir(work.path()));
  RunAndDetach(first, d + "/pid", absl::Seconds(60));
  ASSERT_TRUE(WaitFor([&] { return ReadPid(d + "/gc") > 0; }));
  const v1::KeptAttempt k = KeptFile(work.path());
  ASSERT_GT(k.supervisor_pid(), 0);
  ASSERT_EQ(kill(k.supervisor_pid(), SIGSTOP), 0);
  std::vector<std::string> dropped;
  EXPECT_THAT(ReadKeptAttempts(work.path(), &dropped), IsEmpty());
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_THAT(dropped[0], HasSubstr("did not let this agent in"));
  EXPECT_THAT(dropped[0], HasSubstr("killed it"));
  for (pid_t p : {ReadPid(d + "/pid"), ReadPid(d + "/gc"), pid_t(k.supervisor_pid())}) {
    EXPECT_TRUE(WaitFor([&] { return IsGone(p) || ReapOrphan(p); }, absl::Seconds(5)))
        << p << " survived";
    if (!IsGone(p)) kill(p, SIGKILL);
  }
}

// --- The agent's lease, told to the supervisors (supervisor::kFence) ---

TEST(StepSupervisor, ALeaseThatPassesStopsTheWholeStepAsFenced) {
  // What stops the steps of an agent that does not run (SIGSTOP): the run
  // here is the agent, and it never moves the lease on.
  TempDir dir;
  const std::string d = dir.path();
  const std::string script = "setsid sh -c 'echo $$ > \"$0/gc\"; exec sleep 600' '" + d +
                             "' & echo $$ > '" + d + "/pid'; sleep 600";
  ExecutorOptions opts = Options();
  auto fence = std::make_shared<std::atomic<int64_t>>(MonotonicNsIn(absl::Milliseconds(700)));
  opts.fence_ns = fence;
  TaskRun run(Assignment({Sh(script)}), opts);
  const Bounded b = RunBounded(run, absl::Seconds(30));
  ASSERT_TRUE(b.finished_in_time);
  EXPECT_EQ(b.result.outcome(), v1::OUTCOME_CANCELLED) << b.result.error();
  EXPECT_THAT(b.result.error(), HasSubstr("stopped by its supervisor"));
  EXPECT_TRUE(run.fenced());
  const pid_t step = ReadPid(d + "/pid"), gc = ReadPid(d + "/gc");
  ASSERT_GT(step, 0);
  ASSERT_GT(gc, 0);
  EXPECT_TRUE(WaitFor([&] { return IsGone(step) && IsGone(gc); }))
      << "the step or its grandchild in a new session outlived the lease";
  for (pid_t p : {step, gc}) {
    if (!IsGone(p)) kill(p, SIGKILL);
  }
}

TEST(StepSupervisor, ALeaseMovedOnKeepsTheStepRunning) {
  // The lease is moved on (and the run woken to tell it) until the step
  // has outlived the first one by far; then the step ends on its own.
  TempDir dir;
  const std::string d = dir.path();
  const std::string script = "echo $$ > '" + d + "/pid'; " + AwaitFile(d + "/go") + "echo done";
  ExecutorOptions opts = Options();
  auto fence = std::make_shared<std::atomic<int64_t>>(MonotonicNsIn(absl::Seconds(2)));
  opts.fence_ns = fence;
  TaskRun run(Assignment({Sh(script)}), opts);
  const Bounded b = RunBounded(run, absl::Seconds(30), [&](TaskRun& r) {
    ASSERT_TRUE(WaitFor([&] { return ReadPid(d + "/pid") > 0; }));
    const int64_t first = fence->load();
    // Past the first lease by a second, moving it on each time.
    while (RealClock::Get()->Monotonic() < absl::Nanoseconds(first) + absl::Seconds(1)) {
      fence->store(MonotonicNsIn(absl::Seconds(3)));
      r.Wake();
      ASSERT_FALSE(WaitFor([&] { return IsGone(ReadPid(d + "/pid")); }, absl::Milliseconds(100)))
          << "the step died with its lease moved on";
    }
    Touch(d + "/go");
  });
  ASSERT_TRUE(b.finished_in_time);
  EXPECT_EQ(b.result.outcome(), v1::OUTCOME_SUCCEEDED) << b.result.error();
  EXPECT_EQ(b.result.stdout_tail(), "done\n");
  EXPECT_FALSE(run.fenced());
}

TEST(KeptRun, AKeptStepOutlivesTheLeaseOfTheAgentThatKeptIt) {
  // The first agent's lease passes while the step is kept: the hold rules
  // then, and the next agent's lease after it.
  TempDir dir, work;
  const std::string d = dir.path();
  const std::string script = "echo $$ > '" + d + "/pid'; " + AwaitFile(d + "/go") + "echo kept";
  ExecutorOptions first_opts = InDir(work.path());
  auto first_fence = std::make_shared<std::atomic<int64_t>>(MonotonicNsIn(absl::Seconds(1)));
  first_opts.fence_ns = first_fence;
  TaskRun first(Assignment({Sh(script)}), first_opts);
  RunAndDetach(first, d + "/pid", absl::Seconds(60));
  const pid_t step = ReadPid(d + "/pid");
  const absl::Duration passed = absl::Nanoseconds(first_fence->load()) + absl::Milliseconds(300);
  ASSERT_FALSE(WaitFor([&] { return IsGone(step); }, passed - RealClock::Get()->Monotonic()))
      << "the kept step died at the lease of the agent that kept it";

  std::vector<std::string> dropped;
  std::vector<KeptRun> kept = ReadKeptAttempts(work.path(), &dropped);
  ASSERT_EQ(kept.size(), 1u);
  ExecutorOptions second_opts = InDir(work.path());
  second_opts.fence_ns = std::make_shared<std::atomic<int64_t>>(MonotonicNsIn(absl::Seconds(60)));
  TaskRun second(std::move(kept[0]), second_opts);
  const Bounded b = RunBounded(second, absl::Seconds(20), [&](TaskRun&) { Touch(d + "/go"); });
  ASSERT_TRUE(b.finished_in_time);
  EXPECT_EQ(b.result.outcome(), v1::OUTCOME_SUCCEEDED) << b.result.error();
  EXPECT_EQ(b.result.stdout_tail(), "kept\n");
}

TEST(StepSupervisor, RefusesToRunByHand) {
  const std::string supervisor = FindStepSupervisor();
  ASSERT_FALSE(supervisor.empty());
  const int rc = std::system((supervisor + " 2>/dev/null").c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 125) << rc;
}

TEST(TaskRun, CancelBeforeRunStartsNothing) {
  TempDir dir;
  const std::string marker = dir.path() + "/marker";
  TaskRun run(Assignment({Sh("touch '" + marker + "'")}), Options());
  run.Cancel();
  const Bounded b = RunBounded(run);
  ASSERT_TRUE(b.finished_in_time);
  EXPECT_EQ(b.result.outcome(), v1::OUTCOME_CANCELLED);
  EXPECT_EQ(b.result.exit_code(), -1);
  EXPECT_EQ(b.result.step(), 0);
  EXPECT_EQ(b.result.error(), "cancelled");
  EXPECT_NE(access(marker.c_str(), F_OK), 0);
}

TEST(TaskRun, CancelInterruptsBuiltinSleepAtOnce) {
  TaskRun run(Assignment({Builtin("noop"), Builtin("sleep", {"600"}), Sh("echo never")}),
              Options());
  const Bounded b = RunBounded(run, absl::Seconds(5), [](TaskRun& r) {
    absl::SleepFor(absl::Milliseconds(100));
    r.Cancel();
    r.Cancel();  // idempotent
  });
  ASSERT_TRUE(b.finished_in_time);
  EXPECT_EQ(b.result.outcome(), v1::OUTCOME_CANCELLED);
  EXPECT_EQ(b.result.step(), 1);
  EXPECT_EQ(b.result.error(), "cancelled");
  EXPECT_EQ(b.result.stdout_tail(), "");
  EXPECT_LT(b.elapsed, absl::Seconds(1));
  run.Cancel();  // after Run(): harmless
}

TEST(TaskRun, CancelAfterRunChangesNothing) {
  TaskRun run(Assignment({Sh("echo ok")}), Options());
  const Bounded b = RunBounded(run);
  run.Cancel();
  run.Cancel();
  EXPECT_EQ(b.result.outcome(), v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(run.current_pid(), 0);
  EXPECT_EQ(run.assignment().task_id(), "task-1");
}

// --- Builtins ---

TEST(TaskRun, BuiltinSleepSleepsAndRespectsStepTimeout) {
  TaskRun run(Assignment({Builtin("sleep", {"0.15"})}), Options());
  Bounded b = RunBounded(run);
  EXPECT_EQ(b.result.outcome(), v1::OUTCOME_SUCCEEDED) << b.result.error();
  EXPECT_GE(b.elapsed, absl::Milliseconds(150));

  TaskRun timed(Assignment({WithTimeout(Builtin("sleep", {"600"}), absl::Milliseconds(200))}),
                Options());
  b = RunBounded(timed);
  ASSERT_TRUE(b.finished_in_time);
  EXPECT_EQ(b.result.outcome(), v1::OUTCOME_TIMED_OUT);
  EXPECT_EQ(b.result.exit_code(), -1);
  EXPECT_EQ(b.result.error(), "step 0 timed out after 200ms (step timeout)");
  EXPECT_GE(b.elapsed, absl::Milliseconds(200));
  EXPECT_LT(b.elapsed, absl::Seconds(1));
}

TEST(TaskRun, BuiltinSleepRespectsAttemptTimeout) {
  v1::Assignment a = Assignment({Builtin("sleep", {"0.1"}), Builtin("sleep", {"600"})});
  *a.mutable_attempt_timeout() = ToProto(absl::Milliseconds(300));
  TaskRun run(a, Options());
  const Bounded b = RunBounded(run);
  ASSERT_TRUE(b.finished_in_time);
  EXPECT_EQ(b.result.outcome(), v1::OUTCOME_TIMED_OUT);
  EXPECT_EQ(b.result.step(), 1);
  EXPECT_EQ(b.result.error(), "attempt timed out after 300ms (attempt timeout) in step 1");
  EXPECT_LT(b.elapsed, absl::Seconds(1));
}

TEST(TaskRun, BuiltinNoopSucceeds) {
  const v1::TaskResult r = RunTask(Assignment({Builtin("noop")}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(r.exit_code(), 0);
  EXPECT_EQ(r.step(), 0);
}

TEST(TaskRun, BuiltinFailFailsWithItsCode) {
  v1::TaskResult r = RunTask(Assignment({Builtin("noop"), Builtin("fail"), Builtin("noop")}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_EQ(r.step(), 1);
  EXPECT_EQ(r.error(), "builtin fail");
  r = RunTask(Assignment({Builtin("fail", {"7"})}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.exit_code(), 7);
}

TEST(TaskRun, BuiltinEchoWritesItsWordsOrThePayload) {
  const std::string payload("raw\0bytes", 9);
  const v1::TaskResult r = RunTask(
      Assignment({Builtin("echo"), Builtin("echo", {"a", "b c"}), Builtin("echo")}, payload));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.stdout_tail(), payload + "a b c\n");  // the last echo: empty stdin
}

TEST(TaskRun, UnknownBuiltinFails) {
  const v1::TaskResult r = RunTask(Assignment({Builtin("frobnicate")}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.exit_code(), -1);
  EXPECT_EQ(r.error(), "step 0: unknown builtin 'frobnicate'");
}

TEST(TaskRun, RejectsBadBuiltinArguments) {
  v1::TaskResult r = RunTask(Assignment({Builtin("sleep", {"abc"})}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.exit_code(), -1);
  EXPECT_EQ(r.error(), "step 0: builtin sleep: 'abc' is not a number of seconds in [0, 604800]");
  r = RunTask(Assignment({Builtin("sleep", {"-1"})}));
  EXPECT_THAT(r.error(), HasSubstr("'-1' is not a number of seconds"));
  r = RunTask(Assignment({Builtin("fail", {"x"})}));
  EXPECT_EQ(r.exit_code(), -1);
  EXPECT_EQ(r.error(), "step 0: builtin fail: 'x' is not an exit code in [1, 255]");
  // The same rules as the scheduler's, from the same place.
  r = RunTask(Assignment({Builtin("noop", {"x"})}));
  EXPECT_EQ(r.error(), "step 0: builtin noop: must be empty for noop");
}

TEST(TaskRun, RejectsMalformedSteps) {
  v1::TaskResult r = RunTask(Assignment({}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.exit_code(), -1);
  EXPECT_EQ(r.error(), "the assignment has no steps");

  r = RunTask(Assignment({Builtin("noop"), v1::Step()}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.step(), 1);
  EXPECT_EQ(r.error(), "step 1 has no exec, builtin or http");

  r = RunTask(Assignment({Exec({})}));
  EXPECT_EQ(r.exit_code(), -1);
  EXPECT_EQ(r.error(), "step 0: no program to run (empty argv)");

  v1::Step bad_env = Sh("true");
  (*bad_env.mutable_exec()->mutable_env())["A=B"] = "c";
  r = RunTask(Assignment({bad_env}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_THAT(r.error(), HasSubstr("'A=B'"));

  r = RunTask(Assignment({Exec({"echo", std::string("a\0b", 3)})}));
  EXPECT_EQ(r.error(), "step 0: argv[1] contains a NUL byte");
}

// --- The attempt's directory: inputs and output ---

ExecutorOptions InDir(const std::string& work_dir) {
  ExecutorOptions opts = Options();
  opts.work_dir = work_dir;
  return opts;
}

TEST(TaskRun, WritesInputsAsFilesInTheInputsDir) {
  TempDir tmp;
  v1::Assignment a =
      Assignment({Sh("cat \"$TASKGRID_INPUTS_DIR/parent\"; ls -A \"$TASKGRID_INPUTS_DIR\"")});
  const std::string bytes("a\0b\xff\n", 5);
  (*a.mutable_inputs())["parent"] = bytes;
  (*a.mutable_inputs())["other.1:x"] = "";
  const v1::TaskResult r = RunTask(a, InDir(tmp.path()));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.stdout_tail(), bytes + "other.1:x\nparent\n");
}

TEST(TaskRun, InputsDirExistsWithoutInputs) {
  TempDir tmp;
  const v1::TaskResult r = RunTask(
      Assignment({Sh("test -d \"$TASKGRID_INPUTS_DIR\" && ls -A \"$TASKGRID_INPUTS_DIR\"")}),
      InDir(tmp.path()));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.stdout_tail(), "");
}

// A step without a cwd runs in the attempt's scratch directory, never in the
// agent's own: the steps of the attempt share it, a relative cwd starts from
// it, and it goes with the attempt.
TEST(TaskRun, StepsWithoutCwdRunInTheAttemptsScratchDirectory) {
  TempDir tmp;
  const std::string work = tmp.path() + "/agent-work";
  char agent_cwd[PATH_MAX];
  ASSERT_NE(getcwd(agent_cwd, sizeof(agent_cwd)), nullptr);
  // Prints `what` when the step runs in $TASKGRID_WORK_DIR/`sub`.
  const auto in = [](const std::string& sub, const std::string& what) {
    return "[ \"$(pwd -P)\" = \"$(cd \"$TASKGRID_WORK_DIR" + sub + "\" && pwd -P)\" ] && echo " +
           what + "; ";
  };
  v1::Step in_sub = Sh(in("/sub", "sub") + "cat ../left");
  in_sub.mutable_exec()->set_cwd("sub");
  const v1::TaskResult r = RunTask(
      Assignment({Sh(in("", "here") + "echo \"$TASKGRID_WORK_DIR\"; echo kept > left; mkdir sub"),
                  Sh("cat left; " + in("", "here")), in_sub}),
      InDir(work));
  ASSERT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  const std::vector<std::string> lines = absl::StrSplit(r.stdout_tail(), '\n');
  ASSERT_EQ(lines.size(), 7u) << r.stdout_tail();
  EXPECT_EQ(lines[0], "here");
  EXPECT_THAT(lines[1], ::testing::StartsWith(work + "/task-1.1."));
  EXPECT_THAT(lines[1], ::testing::EndsWith("/work"));
  EXPECT_EQ(lines[2], "kept") << "the next step runs in the same directory";
  EXPECT_EQ(lines[3], "here");
  EXPECT_EQ(lines[4], "sub") << "a relative cwd starts from the scratch directory";
  EXPECT_EQ(lines[5], "kept");
  EXPECT_FALSE(std::filesystem::exists(std::string(agent_cwd) + "/left"));
  EXPECT_THAT(Entries(work), IsEmpty()) << "the scratch directory is left";
}

TEST(TaskRun, InputThatCannotBeAFileNameFailsBeforeAnyStep) {
  for (const std::string name : {".", "..", "a/b", "", "../escape"}) {
    SCOPED_TRACE(name);
    TempDir tmp;
    const std::string marker = tmp.path() + "/ran";
    v1::Assignment a = Assignment({Sh("touch '" + marker + "'")});
    (*a.mutable_inputs())[name] = "x";
    const v1::TaskResult r = RunTask(a, InDir(tmp.path() + "/work"));
    EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
    EXPECT_EQ(r.step(), 0);
    EXPECT_EQ(r.exit_code(), -1);
    EXPECT_THAT(r.error(), HasSubstr("is not a task id that can name a file"));
    EXPECT_FALSE(std::filesystem::exists(marker)) << "a step ran";
    EXPECT_THAT(Entries(tmp.path() + "/work"), IsEmpty()) << "the attempt directory is left";
    EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/escape"));
  }
}

TEST(TaskRun, OutputFileSetsTheOutput) {
  TempDir tmp;
  const v1::TaskResult r = RunTask(
      Assignment({Sh("test ! -e \"$TASKGRID_OUTPUT\" && printf 'one' > \"$TASKGRID_OUTPUT\""),
                  Builtin("echo", {"stdout"}), Sh("printf ' two\\0' >> \"$TASKGRID_OUTPUT\"")}),
      InDir(tmp.path()));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  ASSERT_TRUE(r.has_output());
  EXPECT_EQ(r.output(), std::string("one two\0", 8));
  EXPECT_EQ(r.stdout_tail(), "stdout\n");
}

TEST(TaskRun, OutputIsUnsetWithoutTheFile) {
  TempDir tmp;
  // The file is not made in advance.
  v1::TaskResult r =
      RunTask(Assignment({Sh("test ! -e \"$TASKGRID_OUTPUT\" && echo out")}), InDir(tmp.path()));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_FALSE(r.has_output());
  EXPECT_EQ(r.stdout_tail(), "out\n");
  r = RunTask(Assignment({Builtin("echo", {"builtin"})}), InDir(tmp.path()));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_FALSE(r.has_output());
}

TEST(TaskRun, EmptyOutputFileIsAnEmptyOutput) {
  TempDir tmp;
  const v1::TaskResult r =
      RunTask(Assignment({Sh(": > \"$TASKGRID_OUTPUT\"; echo out")}), InDir(tmp.path()));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  ASSERT_TRUE(r.has_output());
  EXPECT_EQ(r.output(), "");
}

TEST(TaskRun, OutputOfExactlyTheLimitIsKept) {
  TempDir tmp;
  const v1::TaskResult r = RunTask(
      Assignment(
          {Sh(absl::StrCat("head -c ", kMaxOutputFileBytes, " /dev/zero > \"$TASKGRID_OUTPUT\""))}),
      InDir(tmp.path()));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  ASSERT_TRUE(r.has_output());
  EXPECT_EQ(r.output().size(), static_cast<size_t>(kMaxOutputFileBytes));
}

TEST(TaskRun, OutputOverTheLimitFailsTheAttempt) {
  TempDir tmp;
  const v1::TaskResult r =
      RunTask(Assignment({Sh("echo fine"), Sh("head -c 1048577 /dev/zero > \"$TASKGRID_OUTPUT\"")}),
              InDir(tmp.path()));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.step(), 1);
  EXPECT_EQ(r.error(),
            "the output file ($TASKGRID_OUTPUT) is 1048577 bytes, over the limit of 1048576 "
            "bytes (1 MiB)");
  EXPECT_FALSE(r.has_output());
  EXPECT_EQ(r.stdout_tail(), "fine\n");
}

TEST(TaskRun, OutputThatIsNotARegularFileFailsTheAttempt) {
  TempDir tmp;
  // A FIFO nobody writes to: reading it must not block.
  for (const std::string make : {"mkfifo", "mkdir"}) {
    SCOPED_TRACE(make);
    const v1::TaskResult r =
        RunTask(Assignment({Sh(make + " \"$TASKGRID_OUTPUT\"")}), InDir(tmp.path()));
    EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
    EXPECT_EQ(r.error(), "the output file ($TASKGRID_OUTPUT) is not a regular file");
    EXPECT_FALSE(r.has_output());
  }
}

TEST(TaskRun, FailedAttemptKeepsItsErrorAndItsOutput) {
  TempDir tmp;
  v1::TaskResult r =
      RunTask(Assignment({Sh("echo partial > \"$TASKGRID_OUTPUT\"; exit 3")}), InDir(tmp.path()));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.exit_code(), 3);
  EXPECT_EQ(r.error(), "step 0 exited with code 3");
  EXPECT_EQ(r.output(), "partial\n");
  // Too large: still the step's error, and no output.
  r = RunTask(Assignment({Sh("head -c 1048577 /dev/zero > \"$TASKGRID_OUTPUT\"; exit 3")}),
              InDir(tmp.path()));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.error(), "step 0 exited with code 3");
  EXPECT_FALSE(r.has_output());
}

TEST(TaskRun, AttemptDirectoryIsRemovedHoweverTheAttemptEnds) {
  TempDir tmp;
  const std::string work = tmp.path() + "/work";  // made by the first attempt
  // Prints its inputs dir, fills the attempt's directory with things that are
  // hard to remove, then ends as `end` says.
  const std::string ready = tmp.path() + "/ready";
  const std::string fill =
      "echo \"$TASKGRID_INPUTS_DIR\"; stat -c %a \"$TASKGRID_INPUTS_DIR/..\"; "
      "echo out > \"$TASKGRID_OUTPUT\"; d=\"$TASKGRID_INPUTS_DIR/../junk\"; "
      "mkdir -p \"$d/deep\"; touch \"$d/deep/f\"; ln -s / \"$d/root\"; chmod 000 \"$d\"; "
      "touch '" +
      ready + "'; ";
  for (const std::string end : {"exit 0", "exit 1", "sleep 600"}) {
    SCOPED_TRACE(end);
    std::filesystem::remove(ready);
    v1::Assignment a = Assignment({Sh(fill + end)});
    (*a.mutable_inputs())["parent"] = "x";
    TaskRun run(a, InDir(work));
    const bool cancel = end == "sleep 600";
    const Bounded b = RunBounded(run, absl::Seconds(5), [&](TaskRun& r) {
      if (!cancel) return;
      EXPECT_TRUE(WaitFor([&] { return std::filesystem::exists(ready); }));
      r.Cancel();
    });
    ASSERT_TRUE(b.finished_in_time);
    const std::string& out = b.result.stdout_tail();
    const std::string prefix = work + "/task-1.1.";
    ASSERT_EQ(out.rfind(prefix, 0), 0u) << out;
    EXPECT_THAT(out, HasSubstr("/inputs\n700\n"));
    EXPECT_TRUE(std::filesystem::is_directory(work));
    EXPECT_THAT(Entries(work), IsEmpty()) << "the attempt directory is left";
    EXPECT_EQ(b.result.outcome(), cancel            ? v1::OUTCOME_CANCELLED
                                  : end == "exit 0" ? v1::OUTCOME_SUCCEEDED
                                                    : v1::OUTCOME_FAILED);
    EXPECT_TRUE(std::filesystem::exists("/bin/sh")) << "followed the symbolic link";
  }
}

TEST(TaskRun, RelativeWorkDirGivesStepsAbsolutePaths) {
  TempDir tmp;
  v1::Step step = Sh("cat \"$TASKGRID_INPUTS_DIR/parent\"; echo \"$TASKGRID_OUTPUT\"");
  step.mutable_exec()->set_cwd("/");
  v1::Assignment a = Assignment({step});
  (*a.mutable_inputs())["parent"] = "in\n";
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  ASSERT_EQ(chdir(tmp.path().c_str()), 0);
  const v1::TaskResult r = RunTask(a, InDir("work"));
  ASSERT_EQ(chdir(cwd), 0);
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_THAT(r.stdout_tail(), ::testing::StartsWith("in\n" + tmp.path() + "/work/task-1.1."));
  EXPECT_THAT(Entries(tmp.path() + "/work"), IsEmpty());
}

TEST(TaskRun, WorkDirThatIsNotADirectoryFailsClearly) {
  TempDir tmp;
  WriteFile(tmp.path() + "/file", "", 0644);
  const v1::TaskResult r = RunTask(Assignment({Sh("echo ran")}), InDir(tmp.path() + "/file"));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.exit_code(), -1);
  EXPECT_EQ(r.error(), "the work directory " + tmp.path() + "/file is not a directory");
  EXPECT_EQ(r.stdout_tail(), "");
}

TEST(TaskRun, WorkDirOfAnotherUserFailsClearly) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a directory away";
  TempDir tmp;
  const std::string work = tmp.path() + "/work";
  ASSERT_EQ(mkdir(work.c_str(), 0777), 0);
  ASSERT_EQ(chown(work.c_str(), 65534, 65534), 0);
  const v1::TaskResult r = RunTask(Assignment({Sh("echo ran")}), InDir(work));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_THAT(r.error(), HasSubstr("belongs to uid 65534"));
  EXPECT_EQ(r.stdout_tail(), "");
  EXPECT_THAT(Entries(work), IsEmpty());
}

TEST(TaskRun, CancelBeforeRunMakesNoDirectory) {
  TempDir tmp;
  TaskRun run(Assignment({Sh("echo ran")}), InDir(tmp.path() + "/work"));
  run.Cancel();
  const v1::TaskResult r = run.Run();
  EXPECT_EQ(r.outcome(), v1::OUTCOME_CANCELLED);
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/work"));
}

TEST(TaskRun, BuiltinsOnlyMakeNoDirectory) {
  // They cannot read inputs or write the output file; the directory would
  // only cost syscalls on every noop.
  TempDir tmp;
  TaskRun run(Assignment({Builtin("noop")}), InDir(tmp.path() + "/work"));
  EXPECT_EQ(run.Run().outcome(), v1::OUTCOME_SUCCEEDED);
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/work"));
}

TEST(TaskRun, DefaultWorkDirIsUnderTmpdirAndNamedAfterTheAgent) {
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old != nullptr ? old : "";
  setenv("TMPDIR", "/var/tmp/", 1);  // no TaskRun runs now
  EXPECT_EQ(DefaultWorkDir("a1"), "/var/tmp/taskgrid-agent-a1");
  EXPECT_EQ(DefaultWorkDir(""), "/var/tmp/taskgrid-agent");
  unsetenv("TMPDIR");
  EXPECT_EQ(DefaultWorkDir("a1"), "/tmp/taskgrid-agent-a1");
  if (old != nullptr) setenv("TMPDIR", saved.c_str(), 1);
}

// --- Hygiene ---

TEST(TaskRun, ChildGetsOnlyStdioFds) {
  const int fd = fcntl(open("/dev/null", O_RDONLY | O_CLOEXEC), F_DUPFD, 100);  // no CLOEXEC
  ASSERT_GE(fd, 100);
  const v1::TaskResult r = RunTask(Assignment({Sh(
      absl::StrCat("if [ -e /proc/self/fd/", fd, " ]; then echo leaked; else echo closed; fi"))}));
  close(fd);
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.stdout_tail(), "closed\n");
}

TEST(TaskRun, ChildStartsWithDefaultSignalsAndEmptyMask) {
  // The agent may ignore SIGPIPE and block signals in its threads; the step
  // must see neither.
  struct sigaction ignore = {}, old_action;
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &old_action);
  sigset_t block, old_mask;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGINT);
  pthread_sigmask(SIG_BLOCK, &block, &old_mask);

  v1::Assignment a = Assignment({Exec({"grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"})});
  TaskRun run(a, Options());
  const v1::TaskResult r = run.Run();  // on this thread, so it has the mask
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  sigaction(SIGPIPE, &old_action, nullptr);

  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.stdout_tail(), "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");
}

TEST(TaskRun, LeaksNoFds) {
  const int before = CountOpenFds();
  for (int i = 0; i < 50; ++i) {
    v1::Step step;
    switch (i % 5) {
      case 0:
        step = Exec({"cat"});
        break;
      case 1:
        step = Sh("echo out; echo err >&2; exit 2");
        break;
      case 2:
        step = Exec({"/no/such"});
        break;
      case 3:
        step = WithTimeout(Exec({"sleep", "600"}), absl::Milliseconds(20));
        break;
      default:
        step = Builtin("echo", {"hi"});
        break;
    }
    const v1::TaskResult r = RunTask(Assignment({step}, "payload"));
    EXPECT_NE(r.outcome(), v1::OUTCOME_UNSPECIFIED);
  }
  EXPECT_EQ(CountOpenFds(), before);
}

TEST(TaskRun, LeavesNoZombies) {
  RunTask(Assignment({Sh("exit 1")}));
  RunTask(Assignment({WithTimeout(Sh("sleep 600"), absl::Milliseconds(20))}));
  RunTask(Assignment({Exec({"/no/such"})}));
  v1::Step step = Sh("true");
  step.mutable_exec()->set_cwd("/no/such/dir");
  RunTask(Assignment({step}));
  // Every earlier test has ended: this process must have no child at all.
  int status;
  EXPECT_EQ(waitpid(-1, &status, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST(TaskRun, RunsConcurrently) {
  constexpr int kRuns = 8;
  std::vector<std::unique_ptr<TaskRun>> runs;
  for (int i = 0; i < kRuns - 1; ++i) {
    v1::Assignment a = Assignment({Sh("cat; echo \"$TASKGRID_TASK_ID\" >&2"),
                                   Builtin("sleep", {"0.1"}), Sh("echo step$TASKGRID_STEP")},
                                  absl::StrCat("payload-", i, "\n"));
    a.set_task_id(absl::StrCat("task-", i));
    runs.push_back(std::make_unique<TaskRun>(a, Options()));
  }
  runs.push_back(std::make_unique<TaskRun>(Assignment({Exec({"sleep", "600"})}), Options()));

  std::vector<v1::TaskResult> results(kRuns);
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int i = 0; i < kRuns; ++i) {
    threads.emplace_back([&, i] {
      results[i] = runs[i]->Run();
      ++done;
    });
  }
  TaskRun& last = *runs.back();
  EXPECT_TRUE(WaitFor([&] { return last.current_pid() != 0; }));
  last.Cancel();
  EXPECT_TRUE(WaitFor([&] { return done == kRuns; }, absl::Seconds(5)));
  while (done < kRuns) {  // broken: unblock the runs so that the test ends
    for (auto& run : runs) {
      run->Cancel();
      if (run->current_pid() > 0) kill(-run->current_pid(), SIGKILL);
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));

  for (int i = 0; i < kRuns - 1; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(results[i].outcome(), v1::OUTCOME_SUCCEEDED) << results[i].error();
    EXPECT_EQ(results[i].stdout_tail(), absl::StrCat("payload-", i, "\nstep2\n"));
    EXPECT_EQ(results[i].stderr_tail(), absl::StrCat("task-", i, "\n"));
  }
  EXPECT_EQ(results.back().outcome(), v1::OUTCOME_CANCELLED);
}

}  // namespace
}  // namespace taskgrid::agent
