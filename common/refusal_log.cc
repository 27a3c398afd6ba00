#include "common/refusal_log.h"

#include <spdlog/spdlog.h>

#include <iterator>

#include "absl/strings/str_cat.h"

namespace taskgrid {

namespace {
// At most one line a second is written, so this many cover several
// minutes.
constexpr size_t kMaxRemembered = 256;
}  // namespace

std::string RefusalLog::Refused(absl::StatusCode code, const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[absl::StatusCodeToString(code)];
  const absl::Duration now = clock_->Monotonic();
  auto seen = written_.find(line);
  if (now < next_line_ || (seen != written_.end() && now - seen->second < repeat_every_)) {
    ++left_out_;
    return "";
  }
  next_line_ = now + every_;
  if (written_.size() >= kMaxRemembered) {
    for (auto it = written_.begin(); it != written_.end();) {
      it = now - it->second >= repeat_every_ ? written_.erase(it) : std::next(it);
    }
    // Still full (many different lines within repeat_every_): forget them.
    if (written_.size() >= kMaxRemembered) written_.clear();
  }
  written_[line] = now;
  std::string out = line;
  if (left_out_ > 0) {
    absl::StrAppend(&out, " (and ", left_out_, " more refusals not logged since the last line)");
  }
  left_out_ = 0;
  return out;
}

void RefusalLog::Log(absl::StatusCode code, const std::string& line) {
  const std::string out = Refused(code, line);
  if (!out.empty()) spdlog::warn("{}", out);
}

std::map<std::string, int64_t> RefusalLog::Counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

}  // namespace taskgrid
