// The mechanism under TaskRun's exec steps: run one child process in a
// process group of its own, under a taskgrid-step-supervisor
// (agent/step_supervisor.h) that kills it with everything it started when
// this process ends, feed its stdin, keep the tails of its stdout and
// stderr, and stop it on cancel or at a deadline. Internal to the executor.
//
// Thread contract: RunChild() blocks its calling thread; several may run at
// once on different threads. OutputTail is not thread-safe.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agent/live_output.h"
#include "agent/step_supervisor.h"

namespace taskgrid::agent::internal {

// Keeps the last `cap` bytes of everything appended, in at most 2 * cap
// bytes of memory (trims in place, so a long stream does not reallocate),
// and hands every byte to a LiveOutput too when given one.
class OutputTail {
 public:
  explicit OutputTail(int64_t cap, LiveOutput* live = nullptr,
                      LiveOutput::Stream stream = LiveOutput::kStdout);
  void Append(const char* data, size_t n);
  void Append(absl::string_view s) { Append(s.data(), s.size()); }
  // The last `cap` bytes; leaves the tail empty.
  std::string Take();
  // The last `cap` bytes, kept.
  std::string Peek() const;
  // `n` bytes written after what was appended so far are lost (kept by no
  // one): they count as cut, and the bytes kept before them go.
  void Skip(int64_t n);
  // Bytes appended that Take() will not return.
  int64_t cut() const { return static_cast<int64_t>(appended_ - std::min(cap_, buf_.size())); }

 private:
  size_t cap_;
  LiveOutput* const live_;  // borrowed; may be null
  const LiveOutput::Stream stream_;
  uint64_t appended_ = 0;
  std::string buf_;
};

// Why a step was stopped from outside.
// kFenced: the step's supervisor killed it when the agent's lease passed
// (supervisor::kFence), the agent not having run to stop it itself.
enum class StopReason { kNone, kCancelled, kStepTimeout, kAttemptTimeout, kFenced };

// What to run. Every string is free of NUL bytes (the caller checks).
struct ChildSpec {
  // argv[0] is the program: a path if it has a '/', else looked up in
  // `search_path` (the PATH the step sees).
  std::vector<std::string> argv;
  std::vector<std::string> env;  // "NAME=value"
  std::string cwd;               // empty: the agent's own
  std::string search_path;
  std::string shell_path;        // runs scripts that execve() calls ENOEXEC
  std::string supervisor;        // the taskgrid-step-supervisor binary
  absl::string_view stdin_data;  // empty: stdin is a pipe closed at once
  // Run the step in a Landlock domain of its own (agent/landlock.h).
  bool confine = false;
};

// When a step that waits is stopped from outside: what a child process and
// an HTTP request (http_step.h) share. Borrowed while the step runs.
struct StopControl {
  // Monotonic time (RealClock::Monotonic) at which the step is stopped for
  // `deadline_reason`; absl::InfiniteDuration() for none.
  absl::Duration deadline = absl::InfiniteDuration();
  StopReason deadline_reason = StopReason::kStepTimeout;
  // An eventfd (or -1) that is made readable whenever cancelled() may have
  // turned true; the step reads it empty when it wakes on it.
  int wake_fd = -1;
  std::function<bool()> cancelled;

  // What stops the step at monotonic time `now`: kCancelled, else
  // deadline_reason once the deadline passed, else kNone.
  StopReason Due(absl::Duration now) const;
  // Reads wake_fd empty, after a wait woke on it.
  void ClearWake() const;
};

// How long poll() may wait for `d` (rounded up to a millisecond; -1 for an
// infinite `d`, at most an hour otherwise).
int PollTimeoutMs(absl::Duration d);

// What a detach tells the supervisor (agent/step_supervisor.h): kSecret,
// kStopAt, then kDetach.
struct DetachRequest {
  supervisor::Command command;  // kDetach: the hold's deadline, the tail size, the name
  std::string secret;           // supervisor::kSecretBytes bytes
  int64_t stop_at_ns = 0;       // the step's own deadline (CLOCK_MONOTONIC); 0: none
  int64_t grace_ns = 0;         // the kill grace after it
  pid_t supervisor = 0;         // given: the supervisor's pid
};

// When and how to stop the child. Borrowed for the duration of RunChild().
struct ChildControl : StopControl {
  absl::Duration kill_grace = absl::Seconds(2);
  // Told the child's pid (its process group's id) once it runs, and 0 once
  // it and its supervisor were reaped.
  std::function<void(pid_t)> on_pid;
  // Asked whenever the step's wait wakes (wake_fd is how to wake it): true
  // hands the step to its supervisor to keep when this process goes
  // (agent/step_supervisor.h), with `*request`'s secret, deadlines, tail
  // size and name (NewSupervisorName()). Null: never. Asked only once the step's
  // stdin is written in full; until then a stop for the same wake goes
  // ahead. ChildExit::detached says whether the supervisor took it (it
  // does not when the step ended first).
  std::function<bool(DetachRequest* request)> detach;
  // Called when the supervisor took the step (kDetached), before the run
  // returns: what was read of the output since `detach` was asked (a
  // re-attached step's frames still in flight) goes into what is kept.
  std::function<void()> detached;
  // The agent's lease (CLOCK_MONOTONIC ns; 0: none), told to the
  // supervisor (kFence) when the step starts and whenever it changed by a
  // wake. Null: no fence.
  const std::atomic<int64_t>* fence_ns = nullptr;
};

struct ChildExit {
  // Non-empty when the program never ran, e.g. "cannot run /no/such: No
  // such file or directory". Then the rest is meaningless.
  std::string start_error;
  // Set when ChildControl stopped the child (whatever its status says).
  StopReason stopped_by = StopReason::kNone;
  int wait_status = 0;  // from waitpid()
  // The step runs on, its supervisor keeping it for the next agent, which
  // connects to the name the detach gave (an abstract unix socket) to take
  // it back (AttachChild). Then wait_status is meaningless.
  bool detached = false;
};

// Runs `spec` to its end (or until `ctl` stops it), appending its output to
// `out` and `err`. Always reaps the child; its supervisor kills whatever the
// child started (in its group or not) once the child itself ended, and all
// of it at once if this process dies. While it runs, SIGPIPE is
// blocked in the calling thread (a child that does not read its stdin is
// not an error), the child gets default signal dispositions and an empty mask.
ChildExit RunChild(const ChildSpec& spec, const ChildControl& ctl, OutputTail* out,
                   OutputTail* err);

// A name for a supervisor to listen on that no other one uses
// ("taskgrid-step-<pid>-<64 random bits>", under 40 bytes).
std::string NewSupervisorName();
// supervisor::kSecretBytes random bytes.
std::string NewSupervisorSecret();

// Kills every child of this process that is not a live step supervisor,
// with everything below it, and reaps them, in rounds until none is left.
// Does nothing unless this process is a child subreaper (taskgrid-agent
// makes itself one): then what a step leaves when its supervisor is killed
// from outside comes to us, and RunChild calls this once such a supervisor
// is reaped. Returns how many processes it killed.
int KillOrphans();

// Connects to the supervisor that keeps a detached step (the name its
// detach gave) as this process's user; the socket (close-on-exec), or
// -1 with errno set.
int ConnectSupervisor(const std::string& name);
// Sends `secret` on `fd` (a connection to a supervisor) and waits up to
// `within` for its first frame (not read). False when it does not answer:
// it is frozen, or it did not take the secret.
bool ProveToSupervisor(int fd, const std::string& secret, absl::Duration within);

// Takes a detached step back through `sock` (from ConnectSupervisor, owned
// from now on) and follows it to its end as RunChild does: what it writes
// while detached and after, stops (through its supervisor), and a detach
// again. ctl.on_pid is not called.
ChildExit AttachChild(int sock, const ChildControl& ctl, OutputTail* out, OutputTail* err);

}  // namespace taskgrid::agent::internal
