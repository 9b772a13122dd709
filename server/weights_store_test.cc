#include "server/weights_store.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::server {
namespace {

using ::testing::HasSubstr;

class WeightsStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/weights_store_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    WeightsStoreOptions o;
    o.dir = absl::StrCat(dir_, "/w");
    o.max_bytes = 100;
    auto store = WeightsStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  void TearDown() override { std::system(absl::StrCat("rm -rf '", dir_, "'").c_str()); }
  std::string dir_;
  std::unique_ptr<WeightsStore> store_;
};

TEST_F(WeightsStoreTest, ChunksResumeAndOnlyCompleteFilesAreRead) {
  EXPECT_EQ(store_->Read(1, 0, 0).status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(store_->Append(1, 1, 10, 0, "0123", false).value(), 4);
  // A resent chunk (the reply was lost) names the offset to resume at.
  auto again = store_->Append(1, 1, 10, 0 + 2, "23", false);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("expected at offset 4, got 2"));
  EXPECT_EQ(store_->Read(1, 0, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(store_->Append(1, 1, 10, 4, "456789x", true).status().message(),
              HasSubstr("runs past total_bytes 10"));
  EXPECT_THAT(store_->Append(1, 1, 10, 4, "45", true).status().message(),
              HasSubstr("last chunk leaves 6 of 10 bytes"));
  // A new attempt starts over.
  ASSERT_EQ(store_->Append(1, 2, 10, 0, "abcde", false).value(), 5);
  ASSERT_EQ(store_->Append(1, 2, 10, 5, "fghij", true).value(), 10);
  auto chunk = store_->Read(1, 3, 4);
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  EXPECT_EQ(chunk->data, "defg");
  EXPECT_EQ(chunk->total_bytes, 10);
  EXPECT_EQ(store_->Read(1, 8, 0).value().data, "ij");
  EXPECT_EQ(store_->Read(1, 10, 0).value().data, "");
  EXPECT_EQ(store_->Read(1, 11, 0).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(store_->Append(2, 1, 101, 0, "x", false).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace boulder::server
