// Shared by the fuzz targets: a scheduler core on a fake clock, and the
// checks every input must pass whatever it holds.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "common/clock.h"
#include "google/protobuf/message.h"
#include "scheduler/core/scheduler.h"

namespace taskgrid::fuzz {

// The message type the target parses its input as (the corpus replay uses
// it to read the text-format seeds); null for a target whose input is not
// a protobuf.
const google::protobuf::Message* InputPrototype();

// A broken invariant is a bug whatever the input: stop loudly so the
// fuzzer keeps the input.
inline void CheckOrDie(const core::Scheduler& s, const char* where) {
  if (absl::Status st = s.CheckInvariants(); !st.ok()) {
    std::fprintf(stderr, "invariant broken %s: %s\n", where, st.ToString().c_str());
    std::abort();
  }
}

inline void Die(const char* what) {
  std::fprintf(stderr, "%s\n", what);
  std::abort();
}

}  // namespace taskgrid::fuzz
