#include "common/refusal_log.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"

namespace taskgrid {

std::string RefusalLog::Refused(absl::StatusCode code, const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[absl::StatusCodeToString(code)];
  const absl::Duration now = clock_->Monotonic();
  if (now < next_line_) {
    ++left_out_;
    return "";
  }
  next_line_ = now + every_;
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
