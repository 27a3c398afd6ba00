#include "common/proto_time.h"

namespace taskgrid {

absl::Time FromProto(const google::protobuf::Timestamp& ts) {
  if (ts.seconds() == 0 && ts.nanos() == 0) return absl::InfinitePast();
  return absl::FromUnixSeconds(ts.seconds()) + absl::Nanoseconds(ts.nanos());
}

google::protobuf::Timestamp ToProto(absl::Time t) {
  google::protobuf::Timestamp ts;
  SetTimestamp(t, &ts);
  return ts;
}

void SetTimestamp(absl::Time t, google::protobuf::Timestamp* out) {
  if (t == absl::InfinitePast()) {
    out->Clear();
    return;
  }
  const int64_t s = absl::ToUnixSeconds(t);
  out->set_seconds(s);
  out->set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(t - absl::FromUnixSeconds(s))));
}

absl::Duration FromProto(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

google::protobuf::Duration ToProto(absl::Duration d) {
  google::protobuf::Duration out;
  const int64_t s = absl::IDivDuration(d, absl::Seconds(1), &d);
  out.set_seconds(s);
  out.set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(d)));
  return out;
}

int64_t ToUnixMicrosOrZero(absl::Time t) {
  return t == absl::InfinitePast() ? 0 : absl::ToUnixMicros(t);
}

absl::Time FromUnixMicrosOrZero(int64_t us) {
  return us == 0 ? absl::InfinitePast() : absl::FromUnixMicros(us);
}

}  // namespace taskgrid
