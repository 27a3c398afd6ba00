// Slots: the attempts an agent holds, and the rules for taking more.
//
// An attempt is either running (a TaskRun in `slots` of the agent's
// capacity) or a chain link waiting for its predecessor (no slot, no
// message). Admit() decides each entry of an Assign; Finish() says what
// follows the end of a run: its Result or Release, and the chain link
// after it started in the slots it freed, released (draining) or dropped
// with the links after it (the predecessor did not succeed).
//
// Bookkeeping over TaskRun objects: nothing here runs a task, reads a
// clock or writes a message (each decision comes back as the messages to
// send), so its rules are tested without threads or a stream. Not
// thread-safe: the agent holds its mutex around every call.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/executor.h"
#include "taskgrid/v1/agent_service.pb.h"

namespace taskgrid::agent {

// Why the agent itself stopped a running attempt, which decides what its
// end is reported as.
enum class StopCause {
  kNone,  // not stopped (or by the scheduler's Cancel): a Result
  // No contact with the scheduler (self-fencing): a Release with the note,
  // which the scheduler does not count as an attempt (it was the
  // scheduler's outage, not the task, that stopped it).
  kFenced,
  kReleased,  // the drain ran out of time: a Release with the note
};

v1::AgentMessage AcceptMsg(const v1::Assignment& a);
v1::AgentMessage RejectMsg(const v1::Assignment& a, v1::RejectCode code, std::string reason);
v1::AgentMessage ReleaseMsg(const std::string& task_id, int32_t attempt, std::string reason);

class Slots {
 public:
  // Makes the TaskRun of an assignment (not started).
  using MakeRun = std::function<std::shared_ptr<TaskRun>(v1::Assignment)>;

  Slots(int32_t capacity, MakeRun make_run) : capacity_(capacity), make_run_(std::move(make_run)) {}

  // Decides every entry of one Assign, in order: appends Accept or Reject
  // to `replies` (nothing for a link that waits, or one dropped because
  // its predecessor is not held here) and the runs to start now to
  // `starts`. A repeat of an attempt held here is accepted again (running)
  // or stays silent (waiting). `draining`: every new entry is refused.
  void Admit(const v1::Assign& assign, bool draining, std::vector<v1::AgentMessage>* replies,
             std::vector<std::shared_ptr<TaskRun>>* starts);

  // What follows the end of `run` with `result`.
  struct Ended {
    v1::AgentMessage report;  // the Result, or the Release of a run released by a drain
    // About the link after it: its Accept (then `next` runs it) or, when
    // draining, its Release. Unset when there is none.
    v1::AgentMessage link;
    std::shared_ptr<TaskRun> next;
    std::vector<std::string> dropped;  // links dropped silently, in chain order
  };
  Ended Finish(const std::shared_ptr<TaskRun>& run, v1::TaskResult result, bool draining);

  // A run kept for the next agent (TaskRun::detached()): no longer held
  // here, no message; the links waiting for it are dropped (their ids
  // returned): the scheduler ends their attempts itself.
  std::vector<std::string> Kept(const std::shared_ptr<TaskRun>& run);
  // A run an earlier agent kept, running here again (not started).
  void Adopt(std::shared_ptr<TaskRun> run);
  // Every running attempt: for a restart that keeps them.
  std::vector<std::shared_ptr<TaskRun>> Runs() const;

  // The scheduler's Cancel: cancels the running attempt (its links are
  // dropped when it ends), or drops the waiting link and the links after
  // it. Returns the ids dropped; an attempt not held here changes nothing.
  std::vector<std::string> Cancel(const std::string& task_id, int32_t attempt);
  // Cancels every running attempt not stopped by the agent already, as
  // `cause` with `note`, and drops every waiting link (their ids in
  // `dropped`). Returns how many runs it stopped.
  int StopAll(StopCause cause, const std::string& note, std::vector<std::string>* dropped);

  // The run of (task_id, attempt) while it runs here, else null.
  std::shared_ptr<TaskRun> RunOf(const std::string& task_id, int32_t attempt) const;
  // Running and waiting attempts, as listed in Hello and Heartbeat.
  void ListHeld(google::protobuf::RepeatedPtrField<v1::AttemptRef>* out) const;
  // Some run is still going that the agent did not stop itself.
  bool AnyUnstopped() const;

  int running() const { return static_cast<int>(running_.size()); }
  int waiting() const { return static_cast<int>(waiting_.size()); }
  int32_t used() const { return used_; }

 private:
  struct Running {
    std::shared_ptr<TaskRun> run;
    int32_t slots = 1;
    StopCause cause = StopCause::kNone;
    std::string note;
  };

  // One entry of an Assign (see Admit). `earlier`: the ids of the entries
  // before it in this Assign, true for those held here.
  void AdmitOne(const v1::Assignment& a, bool draining, std::map<std::string, bool>* earlier,
                std::vector<v1::AgentMessage>* replies,
                std::vector<std::shared_ptr<TaskRun>>* starts);
  // Why a chain link cannot wait for `pred` here, or empty when it can.
  std::string LinkRefusal(const v1::Assignment& a, bool draining, bool busy,
                          v1::RejectCode* code) const;
  std::shared_ptr<TaskRun> Start(v1::Assignment a);
  // Drops the link waiting for `pred` and every link after it.
  std::vector<std::string> DropChain(std::string pred);
  // The waiting link with this task id, or waiting_.end().
  std::map<std::string, v1::Assignment>::const_iterator FindWaiting(
      const std::string& task_id) const;

  const int32_t capacity_;
  const MakeRun make_run_;
  std::map<std::string, Running> running_;  // by task id
  // Chain links waiting for their predecessor, by the predecessor's task
  // id (run_after); at most one per predecessor.
  std::map<std::string, v1::Assignment> waiting_;
  int32_t used_ = 0;  // slots taken by running_
};

}  // namespace taskgrid::agent
