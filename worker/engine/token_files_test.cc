#include "worker/engine/token_files.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::engine {
namespace {

using ::testing::HasSubstr;

class TokenFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/token_files_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(absl::StrCat("rm -rf '", dir_, "'").c_str()); }

  std::string Write(const std::string& name, const std::vector<int32_t>& tokens) {
    const std::string path = absl::StrCat(dir_, "/", name);
    EXPECT_TRUE(WriteTokenFile(path, tokens).ok());
    return path;
  }

  TokenDataOptions Options(int T, int vocab = 256) const {
    TokenDataOptions o;
    o.glob = absl::StrCat(dir_, "/*.bin");
    o.field = "data.token_files";
    o.vocab_size = vocab;
    o.seq_len = T;
    o.seed = 7;
    return o;
  }

  std::string dir_;
};

std::vector<int32_t> Iota(int n, int start = 0) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = (start + i) % 256;
  return v;
}

TEST_F(TokenFilesTest, FileLayoutIsLlmC) {
  const std::string path = Write("a.bin", {1, 2, 65535});
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), 1024u + 6u);
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 3);
  uint16_t last;
  std::memcpy(&last, bytes.data() + 1024 + 4, 2);
  EXPECT_EQ(last, 65535);
  EXPECT_THAT(WriteTokenFile(path, {70000}).message(), HasSubstr("does not fit uint16"));
}

TEST_F(TokenFilesTest, WindowsShiftTargetsAndCoverEveryShardInOrderWithoutShuffle) {
  Write("a.bin", Iota(9));        // windows at 0, 4 (T = 4): 2
  Write("b.bin", Iota(13, 100));  // windows at 0, 4, 8: 3
  TokenDataOptions o = Options(4);
  o.shuffle = false;
  auto data = TokenData::Open(o);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)->num_windows(), 5u);
  EXPECT_EQ((*data)->num_tokens(), 22u);
  const Batch batch = (*data)->GetSamples(0, 6);  // wraps into the second epoch
  const std::vector<int32_t> first_inputs = {0, 1, 2, 3, 4, 5, 6, 7, 100, 101, 102, 103};
  EXPECT_EQ(std::vector<int32_t>(batch.inputs.begin(), batch.inputs.begin() + 12), first_inputs);
  EXPECT_EQ(batch.targets[0], 1);
  EXPECT_EQ(batch.targets[7], 8);
  EXPECT_EQ(batch.inputs[16], 108);
  EXPECT_EQ(batch.targets[19], 112);
  EXPECT_EQ(batch.inputs[20], 0);  // sample 5 = epoch 1, window 0
}

TEST_F(TokenFilesTest, ShuffleIsAPermutationPerEpochAndDeterministic) {
  Write("a.bin", Iota(4 * 50 + 1));
  auto a = TokenData::Open(Options(4));
  auto b = TokenData::Open(Options(4));
  ASSERT_TRUE(a.ok() && b.ok());
  std::set<int32_t> firsts;
  std::vector<int32_t> order0, order1;
  for (int i = 0; i < 50; ++i) {
    order0.push_back((*a)->GetSamples(i, 1).inputs[0]);
    firsts.insert(order0.back());
  }
  for (int i = 50; i < 100; ++i) order1.push_back((*a)->GetSamples(i, 1).inputs[0]);
  EXPECT_EQ(firsts.size(), 50u);  // every window once per epoch
  EXPECT_NE(order0, order1);      // a fresh order each epoch
  EXPECT_EQ((*b)->Get(3, 1, 5, 2).inputs, (*a)->GetSamples((2 * 2 + 1) * 5, 5).inputs);
  const TokenDataPosition p = (*a)->PositionAt(11, 5, 2);  // 100 samples read
  EXPECT_EQ(p.epoch, 2u);
  EXPECT_EQ(p.sample_in_epoch, 0u);
}

TEST_F(TokenFilesTest, RanksSplitTheWindows) {
  Write("a.bin", Iota(4 * 10 + 1));
  std::set<int32_t> seen;
  for (int rank = 0; rank < 3; ++rank) {
    TokenDataOptions o = Options(4);
    o.rank = rank;
    o.world_size = 3;
    o.shuffle = false;
    auto data = TokenData::Open(o);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ((*data)->num_windows(), rank == 0 ? 4u : 3u);
    for (uint64_t i = 0; i < (*data)->num_windows(); ++i) {
      EXPECT_TRUE(seen.insert((*data)->GetSamples(i, 1).inputs[0]).second);
    }
  }
  EXPECT_EQ(seen.size(), 10u);
}

TEST_F(TokenFilesTest, BadShardsNameFileAndOffset) {
  const std::string good = Write("a.bin", Iota(20));
  const std::string bad = absl::StrCat(dir_, "/b.bin");
  // Truncated: the last token cut in half.
  std::system(absl::StrCat("head -c 1063 '", good, "' > '", bad, "'").c_str());
  auto status = TokenData::Open(Options(4)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("data.token_files: ", bad, ": 1063 bytes")));
  EXPECT_THAT(status.message(), HasSubstr("(truncated)"));

  // Wrong magic.
  {
    ASSERT_TRUE(WriteTokenFile(bad, Iota(20)).ok());
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    const int32_t magic = 12345;
    f.write(reinterpret_cast<const char*>(&magic), 4);
  }
  status = TokenData::Open(Options(4)).status();
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat(bad, ": offset 0: magic 12345 is not 20240520")));

  // Wrong version.
  {
    ASSERT_TRUE(WriteTokenFile(bad, Iota(20)).ok());
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4);
    const int32_t version = 2;
    f.write(reinterpret_cast<const char*>(&version), 4);
  }
  status = TokenData::Open(Options(4)).status();
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat(bad, ": offset 4: version 2 is not 1")));

  // A token at or above the vocabulary.
  std::vector<int32_t> tokens = Iota(20);
  tokens[13] = 96;
  ASSERT_TRUE(WriteTokenFile(bad, tokens).ok());
  status = TokenData::Open(Options(4, 96)).status();
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat(bad,
                                     ": token 96 at token index 13 (byte offset 1050) is not "
                                     "below model.vocab_size 96")));

  // Nothing matches; too little data for one window.
  TokenDataOptions none = Options(4);
  none.glob = absl::StrCat(dir_, "/*.nothing");
  EXPECT_THAT(TokenData::Open(none).status().message(), HasSubstr("matches no file"));
  std::remove(bad.c_str());
  EXPECT_THAT(TokenData::Open(Options(64)).status().message(),
              HasSubstr("has no window of seq_len + 1 = 65 tokens"));
}

}  // namespace
}  // namespace boulder::engine
