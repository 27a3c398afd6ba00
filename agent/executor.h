// TaskRun: one attempt of one task on the agent. Runs the assignment's steps
// in order (each exec step a real process in a process group of its own,
// each builtin in-process, each http step an HTTP request the agent makes
// itself: agent/http_step.h) and turns what happened into a TaskResult.
//
// gRPC-free: the agent session creates a TaskRun per Assign entry, calls
// Run() on a thread of its own and sends the result back; Cancel() comes
// from the session's thread when the scheduler cancels the attempt.
//
// The attempt's directory: Run() makes a fresh directory under
// ExecutorOptions::work_dir (`<task id>.<attempt>.XXXXXX`, mode 0700) holding
// `inputs/` (TASKGRID_INPUTS_DIR: one file per Assignment.inputs entry,
// named by the task id), `work/` (TASKGRID_WORK_DIR: the scratch directory
// every exec step without a cwd of its own runs in, and that a relative cwd
// starts from; the steps of an attempt share it) and the path
// TASKGRID_OUTPUT names (not created in advance). After the last step it
// reads that file into TaskResult.output and removes the whole directory,
// whatever the steps left in it.
//
// Process hygiene, per exec step:
//   - the child is the leader of a new process group; stop = SIGTERM (plus
//     SIGCONT) to the whole group, SIGKILL after kill_grace;
//   - it runs under a taskgrid-step-supervisor (agent/step_supervisor.h), a
//     child subreaper: when the step's main process ends, whatever it left
//     running is killed with SIGKILL, in its group or not (setsid, daemons):
//     a step never outlives itself; and when the agent process ends, however
//     it ends, the whole tree is killed at once: a step never outlives its
//     agent;
//   - the child gets default signal dispositions, an empty signal mask and
//     only fds 0, 1, 2; its exit status is always collected (no zombies).
//
// Keeping steps through an agent restart: Detach() hands the running exec
// step to its supervisor (agent/step_supervisor.h) and writes what the next
// agent needs to go on (a KeptAttempt) to <work_dir>/kept/; Run() then
// returns at once with detached() true, leaving the attempt's directory.
// The next agent reads the file (ReadKeptAttempts) and makes a TaskRun from
// it that takes the step back and goes on with the steps after it, to the
// same Result the first would have given. A run that is between two steps
// is kept the same way, to go on with the next step; one in a builtin or
// http step, or still writing the step's stdin, is not kept.
//
// The calling process must not change its environment (setenv, putenv)
// while any TaskRun runs: each exec step reads `environ`.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "agent/live_output.h"
#include "taskgrid/v1/agent_service.pb.h"
#include "taskgrid/v1/task.pb.h"

namespace taskgrid::agent {

namespace internal {
class OutputTail;
struct StopControl;
struct ChildControl;
struct ChildExit;
struct DetachRequest;
enum class StopReason;
}  // namespace internal

struct ExecutorOptions {
  // Cap of each of stdout_tail / stderr_tail: the LAST bytes are kept.
  // Memory held per stream is at most twice this, whatever a step writes.
  int64_t max_output_bytes = 64 << 10;
  // SIGTERM -> SIGKILL of a step's process group on cancel or timeout.
  absl::Duration kill_grace = absl::Seconds(2);
  // Runs a program that execve() rejects as not executable (ENOEXEC: a
  // script without "#!"), like execvp() does.
  std::string shell_path = "/bin/sh";
  // Base of the per-attempt directories; created (0700) when missing, and it
  // must belong to this process's user. Empty: DefaultWorkDir("").
  std::string work_dir;
  // The newest bytes of each stream kept for live output (LiveOutput),
  // whatever max_output_bytes says; 0: none kept.
  int64_t live_output_bytes = 64 << 10;
  // The taskgrid-step-supervisor binary every exec step runs under. Empty:
  // FindStepSupervisor(); an exec step fails to start when there is none.
  std::string step_supervisor;
  // The agent's lease on CLOCK_MONOTONIC (ns; 0: none), which each exec
  // step's supervisor is told (supervisor::kFence) and kills the step at
  // unless it moves on. The agent changes it, then Wake()s the runs. Null:
  // no fence.
  std::shared_ptr<const std::atomic<int64_t>> fence_ns;
  // Run each exec step in a Landlock domain of its own (agent/landlock.h):
  // it cannot signal or connect to any process outside it. The agent sets
  // it when the kernel has Landlock's scopes and --confine_steps is on.
  bool confine_steps = false;
};

// The taskgrid-step-supervisor next to this process's own binary, else the
// one this build made; empty when neither is an executable file.
std::string FindStepSupervisor();

// The most TaskResult.output may hold: a larger $TASKGRID_OUTPUT file fails
// the attempt.
inline constexpr int64_t kMaxOutputFileBytes = 1 << 20;

// $TMPDIR (or /tmp) + "/taskgrid-agent-<agent_id>" ("/taskgrid-agent" for an
// empty id).
std::string DefaultWorkDir(const std::string& agent_id);

// An attempt a restarted agent takes back (see Detach()): what the agent
// before it left, and the socket to its step's supervisor (-1: go on with
// kept.step(), not started).
struct KeptRun {
  taskgrid::v1::KeptAttempt kept;
  int supervisor_fd = -1;
};

// The attempts kept in `work_dir` by an agent before this one. Each file is
// read and removed; one that is stale (its hold passed, another boot) or
// whose supervisor does not answer is dropped, its attempt directory
// removed, and says why in `dropped`.
std::vector<KeptRun> ReadKeptAttempts(const std::string& work_dir,
                                      std::vector<std::string>* dropped);

// The Results and Releases an agent exits with unacknowledged, kept in
// `work_dir` (kept/results, written whole and renamed into place) for the
// next agent with the same id. Writing an empty set removes the file.
// Returns "" or why it could not be written.
std::string WriteKeptResults(const std::string& work_dir, const taskgrid::v1::KeptResults& kept);
// Reads and removes them; a file of another agent id, or one that does not
// parse, is dropped and says why in `error`.
taskgrid::v1::KeptResults ReadKeptResults(const std::string& work_dir, const std::string& agent_id,
                                          std::string* error);

// One attempt of one task: runs the steps of `assignment` in order.
//
// Thread contract: Run() is called once, on a thread of its own, and blocks
// until the attempt ends. Cancel(), current_pid() and assignment() may be
// called from any other thread, any time (before, during or after Run()), but
// not after the TaskRun is destroyed, which must wait until Run() returned.
// Several TaskRuns may run at once on different threads.
//
// The result: OUTCOME_SUCCEEDED when every step exited 0 (an http step: got
// a success status); otherwise the attempt stops at the first step that did
// not, and `step` is its index (the last step's on success). exit_code is the
// step's exit code (an http step's: the HTTP status), -1 when it was killed,
// timed out, was cancelled, could not start or got no response. `permanent`
// is set when an http step got a status that another attempt cannot change
// (neither a success nor 5xx nor 429). Timeouts of zero (or negative) mean
// no limit; the attempt timeout counts from Run()'s start.
// `output` is set when a step wrote the $TASKGRID_OUTPUT file (a regular file
// of at most kMaxOutputFileBytes; anything else fails an attempt that
// otherwise succeeded). An attempt whose directory or input files cannot be
// made fails at step 0 with exit code -1 before any step runs.
class TaskRun {
 public:
  TaskRun(taskgrid::v1::Assignment assignment, ExecutorOptions opts);
  // Goes on with an attempt an earlier agent kept (see Detach()).
  TaskRun(KeptRun kept, ExecutorOptions opts);
  ~TaskRun();
  TaskRun(const TaskRun&) = delete;
  TaskRun& operator=(const TaskRun&) = delete;

  taskgrid::v1::TaskResult Run();
  // Stops the attempt: kills the running step's whole process group
  // (SIGTERM, then SIGKILL after kill_grace), interrupts a builtin sleep or
  // an HTTP request at once; Run() then returns OUTCOME_CANCELLED.
  // Idempotent. Before Run(), Run() starts nothing; after Run() returned, it
  // has no effect.
  void Cancel();
  // Keeps the attempt for the next agent until `hold_until_ns`
  // (CLOCK_MONOTONIC): see above. Comes before a Cancel() for the runs it
  // cannot keep; Run() returns as soon as it has kept it or ended.
  void Detach(int64_t hold_until_ns);
  // Run() returned because the attempt was kept (its result is not one).
  bool detached() const { return detached_.load(); }
  // Wakes the running exec step to tell its supervisor the agent's lease
  // again (ExecutorOptions::fence_ns changed).
  void Wake();
  // Run() returned because the step's supervisor killed it when the
  // agent's lease passed (supervisor::kFence): OUTCOME_CANCELLED, but the
  // agent did not stop it; it let its lease pass without running.
  bool fenced() const { return fenced_.load(); }
  // The pid of the step process running now (also its process group id), or
  // 0. For tests and logs.
  pid_t current_pid() const;
  const taskgrid::v1::Assignment& assignment() const;
  // Every step is a builtin that never waits (internal::IsInstantBuiltin):
  // Run() returns at once, with no process, directory or file.
  bool instant() const { return instant_; }
  // What the steps write, as they write it; null for an instant run or
  // without ExecutorOptions::live_output_bytes.
  const std::shared_ptr<LiveOutput>& live_output() const { return live_; }

 private:
  struct StepEnd;  // defined in executor.cc

  // Makes attempt_dir_ and writes the input files into it.
  StepEnd PrepareAttemptDir();
  // Reads the $TASKGRID_OUTPUT file into `result` (a failure: OUTCOME_FAILED
  // when the attempt had succeeded).
  void CollectOutput(taskgrid::v1::TaskResult* result) const;
  StepEnd RunStep(int index, internal::OutputTail* out, internal::OutputTail* err);
  StepEnd RunExecStep(int index, internal::OutputTail* out, internal::OutputTail* err);
  StepEnd RunBuiltinStep(int index, internal::OutputTail* out);
  StepEnd RunHttpStep(int index, internal::OutputTail* out);
  // Fills in when step `index` is stopped: its deadline and Cancel().
  // `step_elapsed`: how much of its time it used already.
  void SetStops(int index, internal::StopControl* ctl,
                absl::Duration step_elapsed = absl::ZeroDuration()) const;
  // Step `index` of a kept attempt, running under the supervisor on
  // kept_fd_.
  StepEnd AttachExecStep(int index, internal::OutputTail* out, internal::OutputTail* err);
  // How an exec step's process ended, as the step's end.
  StepEnd ExitEnd(int index, const internal::ChildExit& ex);
  // What Detach() asked, for the step `index` that started at monotonic
  // `step_start` (its supervisor listening on `name`; empty: not started):
  // writes the kept file; false when there was no detach or it could not
  // be written.
  // `detach`: what the supervisor was told (its pid, the secret), or null.
  bool WriteKept(int index, const std::string& name, const internal::DetachRequest* detach,
                 absl::Duration step_start, const internal::OutputTail& out,
                 const internal::OutputTail& err, int64_t* hold_until_ns);
  void RemoveKept();
  // The detach callback of exec step `index`.
  void SetDetach(int index, internal::OutputTail* out, internal::OutputTail* err,
                 internal::ChildControl* ctl);
  // The end of step `index` stopped from outside for `reason` (not kNone).
  StepEnd Stopped(internal::StopReason reason, int index) const;
  // For step `index` starting now: the earlier of its own and the attempt's
  // deadline (monotonic time, InfiniteDuration for none), and whether it is
  // the attempt's.
  absl::Duration StepDeadline(int index, bool* is_attempt,
                              absl::Duration step_elapsed = absl::ZeroDuration()) const;
  bool cancelled() const;
  // Makes a step waiting on wake_fd_ look again (if one runs). Needs mu_.
  void WakeLocked();

  const taskgrid::v1::Assignment assignment_;
  const ExecutorOptions opts_;
  const bool instant_;
  const std::shared_ptr<LiveOutput> live_;
  absl::Duration run_start_;  // monotonic; Run()'s thread only
  std::string attempt_dir_;   // Run()'s thread only; empty when not made
  std::atomic<bool> ran_{false};
  std::atomic<pid_t> pid_{0};
  std::atomic<bool> detached_{false};
  std::atomic<bool> fenced_{false};
  // A kept attempt taken back: where it was, and its supervisor's socket.
  std::optional<taskgrid::v1::KeptAttempt> kept_;
  int kept_fd_ = -1;
  std::string kept_file_;      // Run()'s thread only: the kept file written
  absl::Duration step_start_;  // Run()'s thread only: the running step's

  mutable std::mutex mu_;
  std::condition_variable cv_;   // notified by Cancel(): wakes a builtin sleep
  bool cancelled_ = false;       // guarded by mu_
  int64_t detach_until_ns_ = 0;  // guarded by mu_; 0: no Detach()
  int wake_fd_ = -1;             // guarded by mu_; an eventfd, open only inside Run()
};

}  // namespace taskgrid::agent
