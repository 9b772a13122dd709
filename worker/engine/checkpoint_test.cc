#include "worker/engine/checkpoint.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/crc32c.h"
#include "worker/engine/rng.h"
#include "worker/engine/test_temp_dir.h"

namespace boulder::engine {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::string RandomBytes(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng.Next() & 0xFF);
  return s;
}

TEST(Crc32cTest, KnownValueAndBothImplementationsAgree) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32cExtendPortable(0, "123456789", 9), 0xE3069283u);
  const std::string data = RandomBytes(1000, 7);
  for (size_t n : {0, 1, 7, 8, 9, 63, 1000}) {
    EXPECT_EQ(Crc32c(data.data(), n), Crc32cExtendPortable(0, data.data(), n)) << n;
  }
  // Extending in pieces equals one pass.
  EXPECT_EQ(Crc32cExtend(Crc32c(data.data(), 300), data.data() + 300, 700),
            Crc32c(data.data(), 1000));
}

TEST(CheckpointFileTest, RoundTripsSectionsAndStep) {
  TempDir dir("ckpt-test");
  const std::string a = RandomBytes(5000, 1), b = "step=3\n", empty;
  const std::string path = dir.path() + "/x.bin";
  ASSERT_TRUE(WriteCheckpointFile(path, 3,
                                  {{"params", a.data(), a.size()},
                                   {"meta", b.data(), b.size()},
                                   {"fp8_scaling", empty.data(), 0}})
                  .ok());
  absl::StatusOr<CheckpointData> read = ReadCheckpointFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->step, 3);
  ASSERT_EQ(read->sections.size(), 3u);
  EXPECT_EQ(*read->Find("params"), a);
  EXPECT_EQ(*read->Find("meta"), b);
  EXPECT_EQ(*read->Find("fp8_scaling"), "");
  EXPECT_EQ(read->Find("token_data"), nullptr);
  // No temporary file is left behind.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) files += !e.is_directory();
  EXPECT_EQ(files, 1);
}

TEST(CheckpointFileTest, RejectsBadSectionNames) {
  TempDir dir("ckpt-test");
  const std::string path = dir.path() + "/x.bin";
  EXPECT_EQ(WriteCheckpointFile(path, 1, {{"", "", 0}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteCheckpointFile(path, 1, {{std::string(32, 'n'), "", 0}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteCheckpointFile(path, 1, {{"a", "", 0}, {"a", "", 0}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(CheckpointFileTest, EveryTruncationIsDataLoss) {
  TempDir dir("ckpt-test");
  const std::string a = RandomBytes(300, 2), b = RandomBytes(200, 3);
  const std::string path = dir.path() + "/x.bin";
  ASSERT_TRUE(
      WriteCheckpointFile(path, 9, {{"a", a.data(), a.size()}, {"b", b.data(), b.size()}}).ok());
  const std::string whole = ReadFile(path);
  const std::string cut = dir.path() + "/cut.bin";
  for (size_t len = 0; len < whole.size(); len += 7) {
    WriteFile(cut, whole.substr(0, len));
    absl::StatusOr<CheckpointData> r = ReadCheckpointFile(cut);
    ASSERT_FALSE(r.ok()) << "length " << len;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << len << ": " << r.status();
  }
  WriteFile(cut, whole + "x");
  EXPECT_THAT(ReadCheckpointFile(cut).status().message(), HasSubstr("trailing bytes"));
}

TEST(CheckpointFileTest, EveryFlippedByteIsDataLoss) {
  TempDir dir("ckpt-test");
  const std::string a = RandomBytes(64, 4), b = RandomBytes(48, 5);
  const std::string path = dir.path() + "/x.bin";
  ASSERT_TRUE(
      WriteCheckpointFile(path, 1, {{"a", a.data(), a.size()}, {"b", b.data(), b.size()}}).ok());
  const std::string whole = ReadFile(path);
  const std::string bad = dir.path() + "/bad.bin";
  for (size_t i = 0; i < whole.size(); ++i) {
    std::string flipped = whole;
    flipped[i] ^= 0x10;
    WriteFile(bad, flipped);
    absl::StatusOr<CheckpointData> r = ReadCheckpointFile(bad);
    ASSERT_FALSE(r.ok()) << "byte " << i;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << i;
  }
  std::string last = whole;
  last.back() ^= 1;
  WriteFile(bad, last);
  EXPECT_THAT(ReadCheckpointFile(bad).status().message(), HasSubstr("section b: checksum"));
}

TEST(CheckpointFileTest, MissingFileIsNotFound) {
  EXPECT_EQ(ReadCheckpointFile("/nonexistent/ckpt.bin").status().code(),
            absl::StatusCode::kNotFound);
}

std::vector<CheckpointSectionRef> Sections(const std::string& payload) {
  return {{"payload", payload.data(), payload.size()}};
}

TEST(CheckpointDirTest, KeepsTheNewestAndIgnoresForeignFiles) {
  TempDir root("ckpt-test");
  const std::string dir = root.path() + "/job-1/nested";
  for (int step : {10, 20, 30, 40}) {
    const std::string p = absl::StrCat("state at ", step);
    ASSERT_TRUE(SaveCheckpoint(dir, step, Sections(p), /*keep_last=*/2).ok());
  }
  WriteFile(dir + "/notes.txt", "not a checkpoint");
  WriteFile(dir + "/ckpt-0000000050.bin.tmp-123", "a writer died here");
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> files = ListCheckpoints(dir);
  ASSERT_TRUE(files.ok());
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ((*files)[0].first, 40);
  EXPECT_EQ((*files)[0].second, dir + "/ckpt-0000000040.bin");
  EXPECT_EQ((*files)[1].first, 30);
  // The next save removes the stale temporary file.
  ASSERT_TRUE(SaveCheckpoint(dir, 50, Sections("s50"), 2).ok());
  EXPECT_FALSE(std::filesystem::exists(dir + "/ckpt-0000000050.bin.tmp-123"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/notes.txt"));
  EXPECT_EQ(ListCheckpoints(dir)->size(), 2u);
}

TEST(CheckpointDirTest, CorruptLatestIsSkippedForThePreviousOne) {
  TempDir root("ckpt-test");
  const std::string dir = root.path();
  ASSERT_TRUE(SaveCheckpoint(dir, 1, Sections("one"), 3).ok());
  ASSERT_TRUE(SaveCheckpoint(dir, 2, Sections("two"), 3).ok());
  ASSERT_TRUE(SaveCheckpoint(dir, 3, Sections("three"), 3).ok());
  const std::string latest = dir + "/" + CheckpointFileName(3);
  const std::string second = dir + "/" + CheckpointFileName(2);
  std::string bytes = ReadFile(latest);
  WriteFile(latest, bytes.substr(0, bytes.size() - 2));  // truncated
  std::string mid = ReadFile(second);
  mid[mid.size() - 1] ^= 0x01;  // a flipped bit in the payload
  WriteFile(second, mid);

  std::vector<std::string> skipped;
  std::string loaded;
  auto r = LoadLatestCheckpoint(
      dir,
      [&](const std::string& path, const absl::Status& why) {
        EXPECT_EQ(why.code(), absl::StatusCode::kDataLoss);
        skipped.push_back(path);
      },
      &loaded);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->step, 1);
  EXPECT_EQ(*(*r)->Find("payload"), "one");
  EXPECT_EQ(loaded, dir + "/" + CheckpointFileName(1));
  EXPECT_EQ(skipped, (std::vector<std::string>{latest, second}));
}

TEST(CheckpointDirTest, RenamedFileIsDetected) {
  TempDir root("ckpt-test");
  ASSERT_TRUE(SaveCheckpoint(root.path(), 5, Sections("five"), 3).ok());
  std::filesystem::rename(root.path() + "/" + CheckpointFileName(5),
                          root.path() + "/" + CheckpointFileName(7));
  int skips = 0;
  auto r =
      LoadLatestCheckpoint(root.path(), [&](const std::string&, const absl::Status&) { ++skips; });
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_EQ(skips, 1);
}

TEST(CheckpointDirTest, NoDirectoryMeansNoCheckpoint) {
  auto r = LoadLatestCheckpoint("/nonexistent/boulder/ckpt");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
}

TEST(CheckpointDirTest, UnwritableDirectoryIsAnError) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  TempDir root("ckpt-test");
  std::filesystem::permissions(
      root.path(), std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  absl::Status s = SaveCheckpoint(root.path(), 1, Sections("x"), 1);
  std::filesystem::permissions(root.path(), std::filesystem::perms::owner_all);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr(root.path()));
}

}  // namespace
}  // namespace boulder::engine
