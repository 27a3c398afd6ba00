#include "agent/live_output.h"

#include <algorithm>

namespace taskgrid::agent {

void LiveOutput::Append(Stream stream, const char* data, size_t n) {
  if (cap_ == 0 || n == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Ring& r = rings_[stream];
  if (r.buf.empty()) r.buf.resize(cap_);
  // Only the last cap_ bytes of a large write can stay.
  const size_t skip = n > cap_ ? n - cap_ : 0;
  r.end += static_cast<int64_t>(skip);
  data += skip;
  n -= skip;
  while (n > 0) {
    const size_t at = static_cast<size_t>(r.end % static_cast<int64_t>(cap_));
    const size_t len = std::min(n, cap_ - at);
    r.buf.replace(at, len, data, len);
    r.end += static_cast<int64_t>(len);
    data += len;
    n -= len;
  }
}

LiveOutput::Piece LiveOutput::Read(Stream stream, int64_t from, size_t max) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Ring& r = rings_[stream];
  const int64_t oldest = std::max<int64_t>(0, r.end - static_cast<int64_t>(cap_));
  Piece p;
  p.offset = std::clamp(from, oldest, r.end);
  size_t n = std::min(static_cast<size_t>(r.end - p.offset), max);
  p.data.reserve(n);
  int64_t at = p.offset;
  while (n > 0) {
    const size_t pos = static_cast<size_t>(at % static_cast<int64_t>(cap_));
    const size_t len = std::min(n, cap_ - pos);
    p.data.append(r.buf, pos, len);
    at += static_cast<int64_t>(len);
    n -= len;
  }
  return p;
}

int64_t LiveOutput::end(Stream stream) const {
  std::lock_guard<std::mutex> lock(mu_);
  return rings_[stream].end;
}

}  // namespace taskgrid::agent
