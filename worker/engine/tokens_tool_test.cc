#include "worker/engine/tokens_tool.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/token_files.h"

namespace boulder::engine {
namespace {

using ::testing::HasSubstr;

class TokensToolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tokens_tool_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(absl::StrCat("rm -rf '", dir_, "'").c_str()); }
  std::string File(const std::string& name, const std::string& text) {
    const std::string path = absl::StrCat(dir_, "/", name);
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::string dir_;
};

TEST_F(TokensToolTest, TextIsByteLevelAndSplitIntoValAndTrainShards) {
  TokensToolOptions o;
  o.text_path = File("in.txt", "hello, world\xff");  // 13 bytes
  o.prefix = absl::StrCat(dir_, "/out");
  o.shard_tokens = 4;
  o.val_tokens = 3;
  auto result = RunTokensTool(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->val_tokens, 3);
  EXPECT_EQ(result->train_tokens, 10);
  ASSERT_EQ(result->val_files.size(), 1u);
  ASSERT_EQ(result->train_files.size(), 3u);  // 4 + 4 + 2
  EXPECT_EQ(result->train_files[2], absl::StrCat(dir_, "/out_train_000002.bin"));

  TokenDataOptions d;
  d.glob = absl::StrCat(dir_, "/out_train_*.bin");
  d.vocab_size = 256;
  d.seq_len = 3;
  d.shuffle = false;
  auto data = TokenData::Open(d);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)->num_tokens(), 10u);
  const Batch b = (*data)->GetSamples(0, 1);
  EXPECT_EQ(b.inputs, (std::vector<int32_t>{'l', 'o', ','}));  // "lo, w" is the first shard
  EXPECT_EQ(b.targets, (std::vector<int32_t>{'o', ',', ' '}));
  d.glob = absl::StrCat(dir_, "/out_val_*.bin");
  d.seq_len = 2;
  auto val = TokenData::Open(d);
  ASSERT_TRUE(val.ok()) << val.status();
  EXPECT_EQ((*val)->GetSamples(0, 1).inputs, (std::vector<int32_t>{'h', 'e'}));
  d.glob = absl::StrCat(dir_, "/out_train_000002.bin");
  d.seq_len = 1;
  auto last = TokenData::Open(d);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ((*last)->GetSamples(0, 1).targets[0], 255);
}

TEST_F(TokensToolTest, IdsFile) {
  TokensToolOptions o;
  o.ids_path = File("ids.txt", "1 2,3\n65535\n\n7");
  o.prefix = absl::StrCat(dir_, "/ids");
  auto result = RunTokensTool(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->train_tokens, 5);
  TokenDataOptions d;
  d.glob = result->train_files[0];
  d.vocab_size = 65536;
  d.seq_len = 4;
  d.shuffle = false;
  auto data = TokenData::Open(d);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)->GetSamples(0, 1).targets, (std::vector<int32_t>{2, 3, 65535, 7}));
}

TEST_F(TokensToolTest, Errors) {
  TokensToolOptions o;
  o.prefix = absl::StrCat(dir_, "/x");
  EXPECT_THAT(RunTokensTool(o).status().message(), HasSubstr("exactly one input"));
  o.ids_path = File("bad.txt", "1 2 70000");
  EXPECT_THAT(RunTokensTool(o).status().message(),
              HasSubstr("bad.txt: byte offset 4: id 70000 is outside [0, 65535]"));
  o.ids_path = File("bad2.txt", "1 x");
  EXPECT_THAT(RunTokensTool(o).status().message(),
              HasSubstr("bad2.txt: byte offset 2: unexpected character 'x'"));
  o.ids_path = File("short.txt", "1 2");
  o.val_tokens = 5;
  EXPECT_THAT(RunTokensTool(o).status().message(), HasSubstr("no training tokens"));
  o.ids_path = absl::StrCat(dir_, "/missing.txt");
  EXPECT_EQ(RunTokensTool(o).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace boulder::engine
