// google.protobuf.Timestamp / Duration <-> absl::Time / Duration.
#pragma once

#include "absl/time/time.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/timestamp.pb.h"

namespace taskgrid {

// The zero Timestamp (unset) maps to absl::InfinitePast() and back.
absl::Time FromProto(const google::protobuf::Timestamp& ts);
google::protobuf::Timestamp ToProto(absl::Time t);
void SetTimestamp(absl::Time t, google::protobuf::Timestamp* out);

absl::Duration FromProto(const google::protobuf::Duration& d);
google::protobuf::Duration ToProto(absl::Duration d);

// Microseconds since the Unix epoch, as stored; InfinitePast() <-> 0.
int64_t ToUnixMicrosOrZero(absl::Time t);
absl::Time FromUnixMicrosOrZero(int64_t us);

}  // namespace taskgrid
