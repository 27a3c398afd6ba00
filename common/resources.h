// Compute resources: what an agent offers (taskgrid-agent --resources) and
// what a task asks for (Placement.resources), as amounts per name.
//
// One spelling everywhere (flags, the API, output):
//   cpu      cores ("2", "0.5", "1.25") or millicores ("500m"); kept in
//            millicores, so 1m is the smallest amount
//   memory   bytes with an optional unit: B, KiB/MiB/GiB/TiB (powers of
//            1024, also Ki/Mi/Gi/Ti), KB/MB/GB/TB (powers of 1000, also
//            K/M/G/T); a fraction rounds up to whole bytes ("1.5GiB")
//   others   a whole count ("gpu": "2", "license_x": "1")
// A name is 1-64 of [A-Za-z0-9._-]; every amount is positive and at most
// kMaxResourceAmount, so sums over any realistic fleet stay in int64.
//
// Pure functions over values; thread-compatible.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/btree_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/map.h"

namespace taskgrid {

// Name -> amount in the name's unit (millicores, bytes, a count); sorted
// by name, so two equal sets print the same.
using Resources = absl::btree_map<std::string, int64_t>;

// 2^50: 1 PiB of memory, 10^12 cores, 10^15 of a count.
inline constexpr int64_t kMaxResourceAmount = int64_t{1} << 50;
inline constexpr int kMaxResourceNames = 32;

// The amount `value` spells for resource `name`; INVALID_ARGUMENT saying
// what is wrong with it (`name` is checked too).
absl::StatusOr<int64_t> ParseResourceAmount(absl::string_view name, absl::string_view value);

// "cpu=2,memory=4GiB,gpu=1" (spaces around items allowed; empty: none).
// A name given twice is refused.
absl::StatusOr<Resources> ParseResourceList(absl::string_view text);

// The map form of the API (Placement.resources, Hello.resources).
absl::StatusOr<Resources> ParseResourceMap(
    const google::protobuf::Map<std::string, std::string>& m);

// `amount` spelled for `name` as the parsers read it: cpu "2" or "1.5"
// or "0.001", memory "4GiB" (the largest binary unit it is a whole number
// of, else bytes), a count as itself.
std::string FormatResourceAmount(absl::string_view name, int64_t amount);

// "cpu=2,memory=4GiB" (empty for none).
std::string FormatResources(const Resources& r);

// Fills the API's map form.
void ToResourceMap(const Resources& r, google::protobuf::Map<std::string, std::string>* out);

// The amount of `name` in `r` (0 when it names none).
int64_t AmountOf(const Resources& r, const std::string& name);

// a + b per name, saturating at INT64_MAX.
void AddResources(const Resources& b, Resources* a);
// a - b per name; names that reach zero are dropped.
void SubtractResources(const Resources& b, Resources* a);

}  // namespace taskgrid
