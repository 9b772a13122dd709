#include "worker/engine/param_layout.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ModelConfig Tiny(bool tied) {
  ModelConfig c;
  c.vocab_size = 11;
  c.padded_vocab_size = PaddedVocabSize(11);
  c.hidden = 8;
  c.heads = 2;
  c.layers = 2;
  c.ffn = 16;
  c.context = 8;
  c.tie_embeddings = tied;
  return c;
}

TEST(PaddedVocabSizeTest, RoundsTo32UpTo1024ElseTo128) {
  EXPECT_EQ(PaddedVocabSize(11), 32);
  EXPECT_EQ(PaddedVocabSize(96), 96);
  EXPECT_EQ(PaddedVocabSize(97), 128);
  EXPECT_EQ(PaddedVocabSize(1024), 1024);
  EXPECT_EQ(PaddedVocabSize(1025), 1152);
  EXPECT_EQ(PaddedVocabSize(50257), 50304);
}

TEST(ParamLayoutTest, TensorsTileTheBufferInLayerOrder) {
  const ParamLayout layout(Tiny(false));
  const std::vector<TensorInfo>& t = layout.tensors();
  ASSERT_EQ(t.size(), 2u + 2 * 12 + 3);
  EXPECT_EQ(t[0].name, "wte.weight");
  EXPECT_THAT(t[0].shape, ElementsAre(32, 8));
  EXPECT_EQ(t[1].name, "wpe.weight");
  EXPECT_EQ(t[4].name, "h.0.attn.c_attn.weight");
  EXPECT_THAT(t[4].shape, ElementsAre(24, 8));
  EXPECT_EQ(t[13].name, "h.0.mlp.c_proj.bias");
  EXPECT_EQ(t[14].name, "h.1.ln_1.weight");
  EXPECT_EQ(t.back().name, "lm_head.weight");
  size_t next = 0;
  for (const TensorInfo& x : t) {
    EXPECT_EQ(x.offset, next) << x.name;
    next += x.numel;
    EXPECT_EQ(x.decays, x.shape.size() == 2) << x.name;
  }
  EXPECT_EQ(layout.num_params(), next);
  // 32*8 + 8*8 + 2 * (4*8 + 24*8+24 + 8*8+8 + 16*8+16 + 8*16+8) + 2*8 + 32*8
  EXPECT_EQ(next, 256u + 64 + 2 * 600 + 16 + 256);
  EXPECT_EQ(layout.Offset(TensorKind::kQkvWeight, 1), t[2 + 12 + 2].offset);
  EXPECT_EQ(layout.Offset(TensorKind::kLnfBias), t[27].offset);
}

TEST(ParamLayoutTest, BucketsArePerLayer) {
  const ParamLayout layout(Tiny(false));
  const std::vector<Bucket> b = layout.Buckets();
  ASSERT_EQ(b.size(), 4u);  // embeddings, layer 0, layer 1, final LN + head
  EXPECT_EQ(b[0].offset, 0u);
  EXPECT_EQ(b[0].numel, 256u + 64);
  EXPECT_EQ(b[1].numel, 600u);
  EXPECT_EQ(b[2].offset, b[1].offset + 600);
  EXPECT_EQ(b[3].offset + b[3].numel, layout.num_params());
}

TEST(ParamLayoutTest, TiedModelHasNoHead) {
  const ParamLayout layout(Tiny(true));
  EXPECT_FALSE(layout.Has(TensorKind::kLmHead));
  EXPECT_EQ(layout.tensors().back().name, "ln_f.bias");
  EXPECT_EQ(layout.num_params(), 256u + 64 + 2 * 600 + 16);
}

TEST(ParamLayoutTest, DecayMaskMatchesTheTable) {
  const ParamLayout layout(Tiny(false));
  const std::vector<uint8_t> mask = layout.DecayMask();
  ASSERT_EQ(mask.size(), layout.num_params());
  for (const TensorInfo& t : layout.tensors()) {
    for (size_t i = 0; i < t.numel; ++i) {
      ASSERT_EQ(mask[t.offset + i], t.decays ? 1 : 0) << t.name << "[" << i << "]";
    }
  }
}

TEST(ParamLayoutTest, InitIsDeterministicAndFollowsGpt2) {
  ModelConfig c = Tiny(false);
  c.hidden = 64;
  c.heads = 4;
  c.ffn = 256;
  c.layers = 8;
  const ParamLayout layout(c);
  const std::vector<float> a = layout.InitialValues(5);
  EXPECT_EQ(layout.InitialValues(5), a);
  EXPECT_NE(layout.InitialValues(6), a);
  auto stddev = [&](TensorKind kind, int layer) {
    for (const TensorInfo& t : layout.tensors()) {
      if (t.kind != kind || t.layer != layer) continue;
      double ss = 0;
      for (size_t i = 0; i < t.numel; ++i) ss += double{a[t.offset + i]} * a[t.offset + i];
      return std::sqrt(ss / t.numel);
    }
    return -1.0;
  };
  EXPECT_NEAR(stddev(TensorKind::kFc1Weight, 3), 0.02, 0.001);
  EXPECT_NEAR(stddev(TensorKind::kFc2Weight, 3), 0.02 / 4.0, 0.0003);  // 1/sqrt(2L), L=8
  EXPECT_NEAR(stddev(TensorKind::kAttnProjWeight, 0), 0.02 / 4.0, 0.0005);
  EXPECT_EQ(stddev(TensorKind::kQkvBias, 0), 0.0);
  EXPECT_EQ(a[layout.Offset(TensorKind::kLn2Weight, 5)], 1.0f);
  EXPECT_EQ(a[layout.Offset(TensorKind::kLn2Bias, 5)], 0.0f);
  // wte's padding rows (11..31) are zero.
  const size_t wte = layout.Offset(TensorKind::kWte);
  for (size_t i = 11 * 64; i < 32 * 64; ++i) ASSERT_EQ(a[wte + i], 0.0f);
  EXPECT_NE(a[wte + 10 * 64], 0.0f);
}

TEST(ModelConfigFromSpecTest, ReadsAndChecksTheSpec) {
  v1::ModelSpec m;
  m.set_vocab_size(50257);
  m.set_hidden(768);
  m.set_heads(12);
  m.set_layers(12);
  m.set_ffn(3072);
  m.set_context(1024);
  m.set_tie_embeddings(true);
  absl::StatusOr<ModelConfig> c = ModelConfigFromSpec(m);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->padded_vocab_size, 50304);
  EXPECT_TRUE(c->tie_embeddings);
  m.set_heads(7);
  absl::Status s = ModelConfigFromSpec(m).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "model.heads: 7 does not divide hidden 768");
  m.clear_ffn();
  EXPECT_THAT(ModelConfigFromSpec(m).status().message(), HasSubstr("model.ffn: not set"));
}

}  // namespace
}  // namespace boulder::engine
