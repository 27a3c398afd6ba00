// How `taskgridctl logs` prints a StreamTaskOutput stream: the task's
// stdout on stdout and its stderr on stderr, byte for byte; a marker line
// on the same stream where bytes were skipped; and short lines on stderr
// about attempts (a new one after the first, one that ended other than
// SUCCEEDED, one with no live output) and the end. gRPC-free, so what it
// prints is unit-tested.
//
// Not thread-safe; the streams are borrowed and must outlive it.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "taskgrid/v1/task_service.pb.h"

namespace taskgrid::ctl {

class LogPrinter {
 public:
  // `follow`: the stream goes on to the task's end, and END says how it
  // ended (printed unless SUCCEEDED).
  LogPrinter(std::ostream& out, std::ostream& err, std::string task_id, bool follow);

  void Print(const v1::StreamTaskOutputResponse& r);

  // END came, and the state it gave.
  bool ended() const { return ended_; }
  v1::TaskState final_state() const { return final_state_; }

  // "[... 1200 bytes not shown ...]": the marker of a gap (no newline).
  static std::string GapMarker(int64_t bytes);

  // "--- text ---" on a line of its own on stderr.
  void Note(const std::string& text);

 private:
  struct Position {
    int64_t next = 0;           // offset after the last byte printed
    bool at_line_start = true;  // the last byte printed was a newline (or none was)
  };
  std::ostream& Sink(int stream) { return stream == 1 ? err_ : out_; }
  // A new attempt's offsets start at 0.
  void Begin(int32_t attempt);

  std::ostream& out_;
  std::ostream& err_;
  const std::string task_id_;
  const bool follow_;
  int32_t attempt_ = -1;  // whose output is printed; -1: none yet
  bool shown_attempt_ = false;
  Position pos_[2];
  bool ended_ = false;
  v1::TaskState final_state_ = v1::TASK_STATE_UNSPECIFIED;
};

}  // namespace taskgrid::ctl
