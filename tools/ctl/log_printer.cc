#include "tools/ctl/log_printer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/core/state_machine.h"
#include "tools/ctl/output.h"

namespace taskgrid::ctl {

namespace {
using Response = v1::StreamTaskOutputResponse;
}  // namespace

LogPrinter::LogPrinter(std::ostream& out, std::ostream& err, std::string task_id, bool follow)
    : out_(out), err_(err), task_id_(std::move(task_id)), follow_(follow) {}

std::string LogPrinter::GapMarker(int64_t bytes) {
  return absl::StrCat("[... ", bytes, " bytes not shown ...]");
}

void LogPrinter::Note(const std::string& text) {
  if (!pos_[1].at_line_start) err_ << "\n";
  err_ << "--- " << text << " ---\n";
  pos_[1].at_line_start = true;
  err_.flush();
}

void LogPrinter::Begin(int32_t attempt) {
  if (attempt == attempt_) return;
  attempt_ = attempt;
  for (Position& p : pos_) p.next = 0;
}

void LogPrinter::Print(const Response& r) {
  switch (r.kind()) {
    case Response::KIND_ATTEMPT_STARTED: {
      Begin(r.attempt());
      std::string line = absl::StrCat("attempt ", r.attempt(), " on agent ", r.agent_id());
      // The first attempt needs no header unless there is something to say.
      if (!r.note().empty()) {
        Note(absl::StrCat(line, ": ", r.note()));
      } else if (shown_attempt_) {
        Note(line);
      }
      shown_attempt_ = true;
      break;
    }
    case Response::KIND_OUTPUT: {
      Begin(r.attempt());
      const int s = r.stream() == v1::OUTPUT_STREAM_STDERR ? 1 : 0;
      Position& p = pos_[s];
      std::ostream& sink = Sink(s);
      if (r.offset() > p.next) {
        if (!p.at_line_start) sink << "\n";
        sink << GapMarker(r.offset() - p.next) << "\n";
        p.at_line_start = true;
      }
      // Bytes printed already (never sent twice, but cheap to be sure of).
      const int64_t skip = std::max<int64_t>(0, p.next - r.offset());
      if (skip < static_cast<int64_t>(r.data().size())) {
        const std::string& d = r.data();
        sink.write(d.data() + skip, static_cast<std::streamsize>(d.size() - skip));
        p.at_line_start = d.back() == '\n';
        p.next = r.offset() + static_cast<int64_t>(d.size());
      }
      sink.flush();
      break;
    }
    case Response::KIND_ATTEMPT_ENDED:
      if (r.outcome() != v1::OUTCOME_SUCCEEDED && r.outcome() != v1::OUTCOME_UNSPECIFIED) {
        Note(absl::StrCat("attempt ", r.attempt(),
                          r.agent_id().empty() ? "" : absl::StrCat(" on agent ", r.agent_id()),
                          " ended: ", OutcomeName(r.outcome())));
      }
      break;
    case Response::KIND_END:
      ended_ = true;
      final_state_ = r.state();
      if (!r.note().empty()) {
        Note(absl::StrCat(task_id_, " is ", core::StateName(r.state()), ": ", r.note()));
      } else if (follow_ && r.state() != v1::TASK_STATE_SUCCEEDED) {
        Note(absl::StrCat(task_id_, " ", core::StateName(r.state())));
      }
      break;
    default:
      break;
  }
}

}  // namespace taskgrid::ctl
