#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/ids.h"
#include "common/key_values.h"
#include "common/proto_time.h"

namespace taskgrid {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(KeyValues, ParsesListsAndPairs) {
  EXPECT_THAT(ParseList(" a, b,,c "), ElementsAre("a", "b", "c"));
  auto kv = ParseKeyValues("labels", "gpu=1, zone=a,empty=,eq=a=b");
  ASSERT_TRUE(kv.ok());
  EXPECT_THAT(
      *kv, ElementsAre(Pair("empty", ""), Pair("eq", "a=b"), Pair("gpu", "1"), Pair("zone", "a")));
  EXPECT_TRUE(ParseKeyValues("labels", "")->empty());
}

TEST(KeyValues, NamesTheFlagOnBadInput) {
  for (const char* bad : {"novalue", "=v", "a=1,oops"}) {
    auto kv = ParseKeyValues("labels", bad);
    ASSERT_FALSE(kv.ok()) << bad;
    EXPECT_THAT(std::string(kv.status().message()), HasSubstr("--labels"));
  }
}

TEST(Names, CharsetAndLength) {
  EXPECT_TRUE(IsValidName("a-b_c.d:9", 128));
  EXPECT_FALSE(IsValidName("", 128));
  EXPECT_FALSE(IsValidName("a b", 128));
  EXPECT_FALSE(IsValidName("abc", 2));
  EXPECT_THAT(std::string(CheckName("x.id", "bad/id", 128).message()), HasSubstr("x.id"));
}

TEST(ProtoTime, RoundTripsAndKeepsUnsetUnset) {
  const absl::Time t = absl::FromUnixMicros(1'700'000'000'123'456);
  EXPECT_EQ(FromProto(ToProto(t)), t);
  EXPECT_EQ(FromProto(google::protobuf::Timestamp()), absl::InfinitePast());
  EXPECT_EQ(ToProto(absl::InfinitePast()).seconds(), 0);
  EXPECT_EQ(FromUnixMicrosOrZero(ToUnixMicrosOrZero(t)), t);
  EXPECT_EQ(ToUnixMicrosOrZero(absl::InfinitePast()), 0);
  const absl::Duration d = absl::Milliseconds(2500);
  EXPECT_EQ(FromProto(ToProto(d)), d);
  EXPECT_EQ(ToProto(d).seconds(), 2);
  EXPECT_EQ(ToProto(d).nanos(), 500'000'000);
}

}  // namespace
}  // namespace taskgrid
