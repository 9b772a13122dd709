#include "client/generation.h"

#include "gtest/gtest.h"

namespace boulder::client {
namespace {

v1::GenerationResult Gen(std::vector<int32_t> prompt, std::vector<int32_t> tokens) {
  v1::GenerationResult g;
  for (int32_t t : prompt) g.add_prompt(t);
  for (int32_t t : tokens) g.add_tokens(t);
  return g;
}

TEST(ConstantStrideTest, FindsStrideModuloVocab) {
  EXPECT_EQ(ConstantStride({5, 9, 13, 17}, 96), 4);
  EXPECT_EQ(ConstantStride({90, 94, 2, 6}, 96), 4);  // wraps around the vocabulary
  EXPECT_EQ(ConstantStride({7, 7, 7}, 96), 0);
  EXPECT_EQ(ConstantStride({5, 3, 1}, 96), 94);  // -2 mod 96
  EXPECT_EQ(ConstantStride({5, 3, 1}, 0), -2);   // vocabulary unknown: plain differences
}

TEST(ConstantStrideTest, NoneForBrokenOrShortSequences) {
  EXPECT_EQ(ConstantStride({1, 2, 4}, 96), std::nullopt);
  EXPECT_EQ(ConstantStride({90, 94, 3}, 96), std::nullopt);
  EXPECT_EQ(ConstantStride({3}, 96), std::nullopt);
  EXPECT_EQ(ConstantStride({}, 96), std::nullopt);
}

TEST(CheckGenerationTest, ContinuationMustKeepThePromptStride) {
  GenerationCheck good = CheckGeneration(Gen({5, 9, 13, 17}, {21, 25, 29}), 96);
  EXPECT_EQ(good.prompt_stride, 4);
  EXPECT_TRUE(good.continues);

  GenerationCheck broken = CheckGeneration(Gen({5, 9, 13, 17}, {21, 25, 30}), 96);
  EXPECT_EQ(broken.prompt_stride, 4);
  EXPECT_FALSE(broken.continues);

  // The generation alone has a stride (5) but not the prompt's.
  GenerationCheck shifted = CheckGeneration(Gen({5, 9, 13, 17}, {22, 27, 32}), 96);
  EXPECT_FALSE(shifted.continues);

  GenerationCheck no_prompt_stride = CheckGeneration(Gen({5, 9, 14}, {19, 24}), 96);
  EXPECT_EQ(no_prompt_stride.prompt_stride, std::nullopt);
  EXPECT_FALSE(no_prompt_stride.continues);
}

TEST(JoinTokensTest, ElidesAfterMax) {
  v1::GenerationResult g = Gen({1, 2, 3, 4, 5}, {});
  EXPECT_EQ(JoinTokens(g.prompt(), 0), "1 2 3 4 5");
  EXPECT_EQ(JoinTokens(g.prompt(), 5), "1 2 3 4 5");
  EXPECT_EQ(JoinTokens(g.prompt(), 3), "1 2 3 ...");
  EXPECT_EQ(JoinTokens(g.tokens(), 3), "");
}

TEST(GenerationLineTest, ShowsVerdict) {
  EXPECT_EQ(GenerationLine(Gen({5, 9, 13, 17, 21}, {25, 29, 33, 37, 41}), 96, 4),
            "prompt: 5 9 13 17 ...  generated: 25 29 33 37 ... (constant stride 4)");
  EXPECT_EQ(GenerationLine(Gen({5, 9, 13}, {17, 20}), 96, 0),
            "prompt: 5 9 13  generated: 17 20 (no constant stride; the prompt's stride is 4)");
  EXPECT_EQ(GenerationLine(Gen({5, 9, 14}, {17}), 96, 0),
            "prompt: 5 9 14  generated: 17 (no constant stride)");
}

TEST(StrideVerdictTest, YesNoAndNoPromptStride) {
  EXPECT_EQ(StrideVerdict(Gen({5, 9, 13}, {17, 21}), 96), "constant stride 4: yes");
  EXPECT_EQ(StrideVerdict(Gen({5, 9, 13}, {17, 22}), 96), "constant stride 4: no");
  EXPECT_EQ(StrideVerdict(Gen({5, 9, 14}, {17, 22}), 96), "constant stride: no");
}

}  // namespace
}  // namespace boulder::client
