// ReloadableTokens: --tokens_file read again while the scheduler runs. A
// file that does not parse, or cannot be read, keeps the table from
// before; one that does replaces it whole, and says who was added,
// removed and changed. Readers on other threads always see a whole table
// (also under ThreadSanitizer, in the tree without gRPC).
#include "scheduler/service/tokens.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/temp_dir.h"

namespace taskgrid::service {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kList[] = "/taskgrid.v1.TaskService/ListTasks";

class ReloadableTokensTest : public ::testing::Test {
 protected:
  void Write(const std::string& text) { std::ofstream(path_, std::ios::trunc) << text; }

  // The principal `token` names in the current table ("" when none).
  std::string Who(const std::string& token) {
    const TokenTable::Principal* p = tokens_->Current()->Find(token);
    return p == nullptr ? "" : p->name;
  }

  void SetUp() override {
    Write(
        "rita reader rita-token-0123456789\n"
        "w1   agent  w1-token-0123456789\n");
    auto tokens = ReloadableTokens::FromFile(path_);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    tokens_ = std::move(*tokens);
  }

  testing::TempDir dir_;
  const std::string path_ = dir_.path() + "/tokens";
  std::unique_ptr<ReloadableTokens> tokens_;
};

TEST_F(ReloadableTokensTest, AGoodFileReplacesTheTableAndSaysWhatChanged) {
  const std::shared_ptr<const TokenTable> before = tokens_->Current();
  Write(
      "rita reader,submitter rita-token-0123456789\n"
      "nia  reader           nia-token-0123456789\n");
  auto change = tokens_->Reload();
  ASSERT_TRUE(change.ok()) << change.status();
  EXPECT_EQ(change->size, 2u);
  EXPECT_THAT(change->added, ElementsAre("nia"));
  EXPECT_THAT(change->removed, ElementsAre("w1"));
  EXPECT_THAT(change->changed, ElementsAre("rita"));
  EXPECT_EQ(Who("nia-token-0123456789"), "nia");
  EXPECT_EQ(Who("w1-token-0123456789"), "") << "a removed token is unknown at once";
  std::string principal;
  EXPECT_EQ(tokens_->Current()->Check(kList, "Bearer w1-token-0123456789", &principal).code(),
            absl::StatusCode::kUnauthenticated);
  // A snapshot taken before stays whole for whoever holds it.
  EXPECT_NE(before->Find("w1-token-0123456789"), nullptr);
}

TEST_F(ReloadableTokensTest, AnUnchangedFileChangesNothing) {
  auto change = tokens_->Reload();
  ASSERT_TRUE(change.ok()) << change.status();
  EXPECT_EQ(change->size, 2u);
  EXPECT_THAT(change->added, IsEmpty());
  EXPECT_THAT(change->removed, IsEmpty());
  EXPECT_THAT(change->changed, IsEmpty());
}

TEST_F(ReloadableTokensTest, AFileThatDoesNotParseKeepsTheOldTable) {
  Write(
      "rita reader rita-token-0123456789\n"
      "nia  writer nia-token-0123456789\n");
  auto change = tokens_->Reload();
  ASSERT_FALSE(change.ok());
  EXPECT_THAT(std::string(change.status().message()), HasSubstr(path_ + ":2: unknown role"));
  EXPECT_EQ(Who("w1-token-0123456789"), "w1");
  EXPECT_EQ(Who("nia-token-0123456789"), "");
  EXPECT_EQ(tokens_->Current()->size(), 2u);
  // Logged, not thrown: the old table stays too.
  tokens_->ReloadAndLog();
  EXPECT_EQ(Who("w1-token-0123456789"), "w1");
}

TEST_F(ReloadableTokensTest, AnUnreadableOrEmptyFileKeepsTheOldTable) {
  ASSERT_EQ(std::remove(path_.c_str()), 0);
  auto change = tokens_->Reload();
  ASSERT_FALSE(change.ok());
  EXPECT_THAT(std::string(change.status().message()), HasSubstr(path_ + ": cannot read it"));
  EXPECT_EQ(Who("rita-token-0123456789"), "rita");
  Write("# everyone removed by mistake\n");
  change = tokens_->Reload();
  ASSERT_FALSE(change.ok());
  EXPECT_THAT(std::string(change.status().message()), HasSubstr("no tokens in it"));
  EXPECT_EQ(Who("rita-token-0123456789"), "rita");
}

// Calls check tokens on many threads while a reload swaps the table: each
// sees the old table or the new one, whole (run under ThreadSanitizer).
TEST_F(ReloadableTokensTest, ReadersSeeAWholeTableWhileItIsSwapped) {
  auto second = TokenTable::Parse("nia reader nia-token-0123456789\n", "second");
  ASSERT_TRUE(second.ok());
  std::shared_ptr<const TokenTable> next(std::move(*second));
  std::atomic<bool> swapped{false};
  std::atomic<int> torn{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < 4; ++i) {
    readers.emplace_back([&] {
      bool saw_new = false;
      while (!saw_new) {
        const bool after = swapped.load();
        std::shared_ptr<const TokenTable> t = tokens_->Current();
        const bool old_known = t->Find("rita-token-0123456789") != nullptr;
        const bool new_known = t->Find("nia-token-0123456789") != nullptr;
        if (old_known == new_known) torn.fetch_add(1);
        saw_new = new_known;
        if (after && !saw_new) torn.fetch_add(1);  // the swap was published before
      }
    });
  }
  tokens_->Replace(next);
  swapped.store(true);
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(torn.load(), 0);
}

}  // namespace
}  // namespace taskgrid::service
