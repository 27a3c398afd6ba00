// The processes taskgrid-bench starts (scheduler, agents, simulated-agent
// children), and the guarantee that every one of them is killed and reaped
// on every way out: normal return, error, SIGINT/SIGTERM/SIGHUP to the bench,
// or the bench itself dying (PR_SET_PDEATHSIG in each child).
//
// Every child runs in a session of its own with stdin /dev/null and stdout +
// stderr appended to a log file. The bench is a child subreaper
// (PR_SET_CHILD_SUBREAPER), so processes an agent started (task steps) are
// re-parented to the bench when the agent is killed; KillOrphans() ends
// those.
//
// Thread contract: ChildProcess objects are used by one thread (the bench's
// main thread), except that the interrupt thread may kill and reap every
// registered child at any time, after which it exits the process. The
// registry serializes the two: a pid is reaped only under its lock, so the
// interrupt thread never signals a recycled pid.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace taskgrid::bench {

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (call first thing
// in main(), before any thread exists, so every thread inherits the mask)
// and starts the thread that waits for them: it kills and reaps every
// registered child and orphan, removes the registered temporary
// directories, and exits with 128 + the signal. Also makes the process a
// child subreaper.
void InstallInterruptHandler();

// A directory removed by the interrupt thread (and by nobody else: its
// owner removes it on a normal exit and calls ForgetTempDir first).
void RegisterTempDir(const std::string& path);
void ForgetTempDir(const std::string& path);

class ChildProcess {
 public:
  // Starts argv[0] (a path) with argv. `name` is for messages.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const std::string& name,
                                                             const std::vector<std::string>& argv,
                                                             const std::string& log_path);
  // Kill(): SIGKILL to the child's process group, then reaps it.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  // CLOCK_MONOTONIC right before fork().
  absl::Duration spawn_mono() const { return spawn_mono_; }

  // Reaps the child if it exited; true while it runs.
  bool Alive();
  // The raw wait status once reaped (Alive() returned false), else -1.
  int wait_status() const { return wait_status_; }
  // e.g. "exited with code 1" or "killed by signal 9".
  std::string ExitDescription() const;

  // Sends `sig` to the child (not its group); no-op once reaped.
  void Signal(int sig);
  // Sends `sig`, waits up to `timeout` for the exit; on timeout SIGKILLs and
  // returns DeadlineExceeded (the child is reaped either way).
  absl::Status Stop(int sig, absl::Duration timeout);
  // SIGKILL to the process group and the child, then reaps it (bounded).
  void Kill();

  // The last `bytes` of the log file.
  std::string LogTail(size_t bytes) const;

 private:
  ChildProcess(std::string name, std::string log_path)
      : name_(std::move(name)), log_path_(std::move(log_path)) {}
  // Waits (bounded) for the exit after a SIGKILL.
  void ReapAfterKill();

  const std::string name_;
  const std::string log_path_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  int wait_status_ = -1;
  absl::Duration spawn_mono_;
};

// SIGKILLs and reaps every process re-parented to the bench (its direct
// children that are not registered ChildProcesses), repeatedly until none is
// left or `timeout` passed. Returns how many were still running (those that
// had ended by themselves, e.g. the step supervisors of a killed agent, are
// reaped and not counted).
int KillOrphans(absl::Duration timeout = absl::Seconds(10));

// CLOCK_MONOTONIC since an arbitrary start, for intervals.
absl::Duration MonoNow();

// From /proc/<pid>/status: VmRSS and VmHWM (peak) in KiB.
absl::StatusOr<int64_t> ReadRssKiB(pid_t pid);
absl::StatusOr<int64_t> ReadPeakRssKiB(pid_t pid);
// From /proc/<pid>/stat: utime + stime, in seconds.
absl::StatusOr<double> ReadCpuSeconds(pid_t pid);

// The directory holding this executable (/proc/self/exe).
// The last `bytes` of the file at `path` ("" when it cannot be read).
std::string FileTail(const std::string& path, size_t bytes);

std::string SelfDir();
std::string SelfExe();

}  // namespace taskgrid::bench
