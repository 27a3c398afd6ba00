// Outbox: what the agent writes on its stream to the scheduler, in order.
//
// Any thread may Write(). The thread that finds no write in progress
// writes everything queued until nothing is left, as one AgentBatch (of at
// most kMaxBatchBytes, common/batching.h) when the scheduler reads batches:
// results of tasks that end while a write is in flight go together.
//
// gRPC-free: the stream is a Writer function that Attach() installs when a
// stream is up and Detach() removes when it ends. Between the two every
// Write() is dropped and returns false: what must survive a reconnect (the
// unacknowledged results) is resent by the agent after the next Welcome.
//
// Thread-safe.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include "taskgrid/v1/agent_service.pb.h"

namespace taskgrid::agent {

class Outbox {
 public:
  // Writes one message on the stream; false when the stream is broken.
  using Writer = std::function<bool(const v1::AgentMessage&)>;

  // A stream is up: later writes go to `writer`, one message at a time
  // until SetBatches(true).
  void Attach(Writer writer);
  // The stream's Welcome says whether the scheduler reads AgentBatch.
  void SetBatches(bool batches);
  // The stream ended: drops what is queued and waits for a write in flight.
  void Detach();

  // Queues `msgs` (in order, after what other threads queued before) and
  // writes them unless another thread is writing now, which takes them
  // along. False when no stream is attached: they were dropped.
  bool WriteAll(std::vector<v1::AgentMessage> msgs);
  bool Write(v1::AgentMessage msg);
  // Blocks until nothing is queued or being written. For tests that move
  // a FakeClock: time must not run ahead of a write another thread took
  // on.
  void WaitIdle();

 private:
  // Held while writing; Attach() and Detach() take it to change writer_.
  std::mutex write_mu_;
  Writer writer_;  // guarded by write_mu_
  // Taken inside write_mu_, never the other way round.
  std::mutex out_mu_;
  std::deque<v1::AgentMessage> out_;  // guarded by out_mu_; queued, not yet written
  bool writing_ = false;              // guarded by out_mu_; a thread drains out_
  std::condition_variable idle_;      // writing_ went false
  bool batches_ = false;              // guarded by out_mu_
  bool attached_ = false;             // guarded by out_mu_
};

}  // namespace taskgrid::agent
