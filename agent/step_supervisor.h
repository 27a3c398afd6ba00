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
#pragma once

namespace taskgrid::agent::supervisor {

// The supervisor's file name; it is looked for next to the agent's binary.
inline constexpr char kBinaryName[] = "taskgrid-step-supervisor";

// What goes through the report pipe (close-on-exec for the step): records of
// this shape, then EOF once the step's program was exec'd. kRunning comes
// first from the supervisor, `value` the step's pid (also its process group
// id); a record of any other stage means the program never ran, `value`
// being the errno. A record before kRunning comes from the agent's child,
// which could not start the supervisor.
enum Stage : int { kSetup = 1, kChdir = 2, kExec = 3, kSupervisor = 4, kRunning = 5 };
struct Report {
  int stage;
  int value;
};

// argv of the supervisor:
//   taskgrid-step-supervisor LIFELINE_FD REPORT_FD SHELL N CANDIDATE... -- ARGV...
// CANDIDATEs are where ARGV[0] may be, in PATH order (N of them); SHELL runs
// one that execve() refuses as not executable (ENOEXEC), as execvp() does.
// The environment, working directory and fds 0-2 are the step's.
inline constexpr int kArgLifeline = 1;
inline constexpr int kArgReport = 2;
inline constexpr int kArgShell = 3;
inline constexpr int kArgCount = 4;

}  // namespace taskgrid::agent::supervisor
