// What taskgrid-agent and taskgrid-step-supervisor share: how the agent
// starts the supervisor of one step, and what the supervisor tells it.
//
// Every exec step runs under a supervisor process of its own (agent/
// step_supervisor_main.cc), the agent's child:
//
//   taskgrid-agent ── taskgrid-step-supervisor ── the step (its own group)
//                     (child subreaper)               └─ anything it starts,
//                                                        setsid or not
//
// The supervisor holds the read end of a "lifeline" pipe whose only write
// end is the agent's (close-on-exec, so no other process keeps it). When
// the agent process ends, however it ends (kill -9, OOM kill, crash), the
// kernel closes that end, the supervisor reads EOF at once and kills the
// step with every process it started: being a child subreaper, it becomes
// the parent of whatever the step left orphaned, so it finds them all by
// walking /proc from itself, including those that moved to a process group
// or session of their own. It does the same when the step's main process
// ends: a step never outlives itself. So a killed agent's steps are gone
// within milliseconds, long before the scheduler's reconnect grace lets
// another agent start the task again.
//
// The step itself gets PR_SET_PDEATHSIG(SIGKILL), so even a supervisor
// killed from outside takes the step's main process with it.
//
// Keeping steps through an agent restart (taskgrid-agent --keep_steps):
// the lifeline is a unix socket pair, not a pipe, so that the supervisor
// can answer. Before it exits, the agent writes a kDetach command on the
// lifeline with a deadline and waits for the kDetached frame. Then EOF does not kill the step: the
// supervisor reads the step's output itself (it holds read ends of the step's stdout and stderr
// pipes from the start, untouched while the agent reads them), keeping the
// last bytes, and listens on an abstract unix socket named in the command.
// The next agent (same user: SO_PEERCRED is checked) connects there and
// gets, as frames, what was skipped and kept, then the output as it comes,
// then the step's wait status; the socket is its lifeline from then on,
// with the same commands (kTerm and kKill to stop the step, kDetach for
// another restart). No agent by the deadline: the step's whole tree is
// killed, as if the agent had died then.
//
// An agent that is alive but does not run (SIGSTOP) keeps its lifeline
// open, so EOF cannot stop its steps. The agent therefore tells each
// supervisor its lease (kFence, moved on as the scheduler renews it); a
// supervisor whose fence passes kills the step's tree (and exits as
// killed); the agent, once it runs again, finds its fence passed.
#pragma once

#include <errno.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

namespace taskgrid::agent::supervisor {

// The supervisor's file name; it is looked for next to the agent's binary.
inline constexpr char kBinaryName[] = "taskgrid-step-supervisor";

// What goes through the report pipe (close-on-exec for the step): records of
// this shape, then EOF once the step's program was exec'd. kRunning comes
// first from the supervisor, `value` the step's pid (also its process group
// id); a record of any other stage means the program never ran, `value`
// being the errno. A record before kRunning comes from the agent's child,
// which could not start the supervisor.
enum Stage : int {
  kSetup = 1,
  kChdir = 2,
  kExec = 3,
  kSupervisor = 4,
  kRunning = 5,
  kConfineFailed = 6
};
struct Report {
  int stage;
  int value;
};

// argv of the supervisor:
//   taskgrid-step-supervisor LIFELINE_FD REPORT_FD STDOUT_FD STDERR_FD SHELL
//       CONFINE N CANDIDATE... -- ARGV...
// STDOUT_FD and STDERR_FD are read ends of the pipes that are the step's
// fds 1 and 2. CANDIDATEs are where ARGV[0] may be, in PATH order (N of
// them); SHELL runs one that execve() refuses as not executable
// (ENOEXEC), as execvp() does. CONFINE is kConfine or kNoConfine: whether
// the step runs in a Landlock domain of its own (agent/landlock.h). The
// environment, working directory and fds 0-2 are the step's.
inline constexpr int kArgLifeline = 1;
inline constexpr int kArgReport = 2;
inline constexpr int kArgStdout = 3;
inline constexpr int kArgStderr = 4;
inline constexpr int kArgShell = 5;
inline constexpr int kArgConfine = 6;
inline constexpr int kArgCount = 7;
inline constexpr char kConfine[] = "confine";
inline constexpr char kNoConfine[] = "-";

// Commands from the agent, on the lifeline (whole records: 64 bytes).
enum CommandType : int32_t {
  // Keep the step when the lifeline ends: listen on `name` until
  // `deadline_ns` (CLOCK_MONOTONIC), keeping the last `tail_bytes` of each
  // output stream meanwhile.
  kDetach = 1,
  kTerm = 2,  // SIGTERM (and SIGCONT) to the step's group
  kKill = 3,  // SIGKILL to the step's group
  // The agent's lease: unless a later kFence moves it, the step's whole
  // tree is killed at `deadline_ns` (CLOCK_MONOTONIC), as if the agent had
  // died then. It stops the steps of an agent that cannot (frozen by
  // SIGSTOP, or starved) before the scheduler gives their tasks to another
  // agent; a running agent stops them itself first. Not while a kDetach
  // holds the step: its own deadline rules. 0: no fence.
  kFence = 4,
  // The first kSecretBytes of `name`. From the agent that started the
  // supervisor (before a kDetach): what a later agent must send, as the
  // first command on a connection to the socket, to be let in; without it
  // (or with another) the connection is closed and the socket listens on.
  kSecret = 5,
  // The step's own deadline (its step or attempt timeout, CLOCK_MONOTONIC
  // ns in `deadline_ns`; 0: none) and the kill grace (ns, in `tail_bytes`):
  // while no agent is attached the supervisor stops the step itself then
  // (SIGTERM, SIGKILL after the grace), as the agent would have, and tells
  // the next agent so (kTimedOut). A stop it began runs to its end.
  kStopAt = 6,
};
inline constexpr size_t kSecretBytes = 32;
struct Command {
  int32_t type;
  int32_t reserved;
  int64_t deadline_ns;
  int64_t tail_bytes;
  char name[40];  // NUL-terminated; the abstract socket's name, no leading NUL
};
static_assert(sizeof(Command) == 64, "one record, written at once");

// Frames to a re-attached agent: a header, then `len` bytes.
enum FrameType : int32_t {
  kSkipped = 1,  // two int64: stdout and stderr bytes not kept while detached
  kStdout = 2,
  kStderr = 3,
  kExit = 4,  // int32: the step's wait status; the last frame
  // The answer to kDetach (no bytes): the step is kept when the lifeline
  // ends. A lifeline that ends without it (the supervisor exited with the
  // step's status first) means the step ended before it could be kept.
  kDetached = 5,
  // No bytes, before kExit: the step was stopped at its kStopAt deadline.
  kTimedOut = 6,
  // No bytes, the last frame to the agent that started it (on the
  // lifeline): the step and everything below the supervisor are gone, and
  // it exits now. A supervisor that exits without it was killed from
  // outside, and what it had below it came to the agent (a subreaper).
  kGone = 7,
};
struct FrameHeader {
  int32_t type;
  int32_t len;
};

// Writes all of `data` to the socket `fd` (blocking, no SIGPIPE); false
// when the other end is gone. What both sides send with.
inline bool SendAll(int fd, const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    const ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace taskgrid::agent::supervisor
