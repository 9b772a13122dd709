// The FP8 backward's recomputed operands (model_fp8.cc) on the cpu backend's rounding
// emulation: training with every input transpose (qkv's and fc1's from their LayerNorm's kept
// input and statistics, fc2's from GELU, the attention projection's from its input) and every
// weight transpose recomputed in the backward matches the layout that keeps them all per
// layer (ModelOptions::fp8_keep_transposes) — bit-identically here, where the forward's GELU
// is GeluForward on the stored pre-activation too — with the same FP8 statistics, in every
// activation-checkpointing mode and with gradient accumulation, and allocates exactly the kept
// transposes' bytes less.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "worker/engine/data.h"
#include "worker/engine/fp8_state.h"
#include "worker/engine/model.h"
#include "worker/engine/param_layout.h"

namespace boulder::engine {
namespace {

ModelOptions Options(Recompute recompute, bool keep, int grad_accum) {
  ModelOptions o;
  o.config.vocab_size = 96;
  o.config.padded_vocab_size = PaddedVocabSize(96);
  o.config.hidden = 64;
  o.config.heads = 4;
  o.config.layers = 2;
  o.config.ffn = 256;
  o.config.context = 32;
  o.batch_size = 4;
  o.seq_len = 32;
  o.grad_accum_steps = grad_accum;
  o.seed = 11;
  o.recompute = recompute;
  o.fp8.enabled = true;
  o.fp8_keep_transposes = keep;
  return o;
}

struct TrainResult {
  std::vector<double> losses;
  std::vector<float> params;
  std::vector<Fp8TensorStat> stats;  // the last step's
};

// `steps` optimizer steps of `grad_accum` micro-batches each.
TrainResult Train(kernels::Backend* be, const ModelOptions& o, int steps) {
  TrainResult r;
  absl::StatusOr<std::unique_ptr<Model>> created = Model::Create(be, o);
  EXPECT_TRUE(created.ok()) << created.status();
  if (!created.ok()) return r;
  Model& m = **created;
  ArithmeticData data(96, 6, 3);
  for (int step = 0; step < steps; ++step) {
    m.ZeroGrad();
    for (int micro = 0; micro < o.grad_accum_steps; ++micro) {
      const Batch batch =
          data.Get(step * o.grad_accum_steps + micro, 1, 0, o.batch_size, o.seq_len);
      absl::StatusOr<double> loss = m.Forward(batch.inputs, batch.targets);
      EXPECT_TRUE(loss.ok()) << loss.status();
      if (!loss.ok()) return r;
      r.losses.push_back(*loss);
      EXPECT_TRUE(m.Backward().ok());
    }
    EXPECT_TRUE(m.OptimizerStep(1e-3f, step + 1).ok());
    EXPECT_TRUE(m.Fp8EndStep(/*apply=*/true, &r.stats).ok());
  }
  absl::StatusOr<std::vector<float>> p = m.GetParameters();
  EXPECT_TRUE(p.ok());
  if (p.ok()) r.params = *p;
  return r;
}

// got trains as want: the same losses, parameters and FP8 statistics, bit for bit.
void ExpectSameTraining(const TrainResult& want, const TrainResult& got) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  EXPECT_EQ(got.losses, want.losses);
  ASSERT_EQ(got.params.size(), want.params.size());
  size_t differing = 0;
  for (size_t i = 0; i < want.params.size(); ++i) differing += got.params[i] != want.params[i];
  EXPECT_EQ(differing, 0u) << "parameters differ";
  ASSERT_EQ(got.stats.size(), want.stats.size());
  for (size_t i = 0; i < want.stats.size(); ++i) {
    const Fp8TensorStat& a = want.stats[i];
    const Fp8TensorStat& b = got.stats[i];
    SCOPED_TRACE(absl::StrCat(a.layer, " ", Fp8LinearName(a.linear), " ", Fp8RoleName(a.role)));
    EXPECT_EQ(b.scale, a.scale);
    EXPECT_EQ(b.amax, a.amax);
    EXPECT_EQ(b.amax_history_max, a.amax_history_max);
    EXPECT_EQ(b.saturated_ratio, a.saturated_ratio);
    EXPECT_EQ(b.underflow_ratio, a.underflow_ratio);
    EXPECT_EQ(b.elements, a.elements);
  }
}

TEST(Fp8RecomputeTest, TrainsLikeKeepingEveryTransposeInEveryCheckpointingMode) {
  std::unique_ptr<kernels::Backend> cpu = kernels::NewCpuBackend(1);
  for (Recompute mode : {Recompute::kNone, Recompute::kMlp, Recompute::kFull}) {
    for (int accum : {1, 3}) {
      SCOPED_TRACE(absl::StrCat("recompute ", static_cast<int>(mode), ", grad_accum ", accum));
      const TrainResult kept = Train(cpu.get(), Options(mode, /*keep=*/true, accum), 3);
      const TrainResult recomputed = Train(cpu.get(), Options(mode, /*keep=*/false, accum), 3);
      ASSERT_EQ(kept.losses.size(), static_cast<size_t>(3 * accum));
      // The first step's loss runs before any gradient: equal in any case. The later ones
      // follow the gradients, which see the same FP8 operands. The recomputing casts record
      // nothing: the statistics are the forward's.
      ExpectSameTraining(kept, recomputed);
      ASSERT_EQ(kept.stats.size(), 2u * 4 * 3);
      for (const Fp8TensorStat& a : kept.stats) EXPECT_GT(a.amax, 0.0f);
    }
  }
}

// FP8 never keeps GELU's output (fc2's backward recasts it from fc1's output), so
// activation_checkpointing "gelu" is "none" there: the same arena, the same training.
TEST(Fp8RecomputeTest, GeluModeIsNoneInFp8) {
  std::unique_ptr<kernels::Backend> cpu = kernels::NewCpuBackend(1);
  absl::StatusOr<std::unique_ptr<Model>> none =
      Model::Create(cpu.get(), Options(Recompute::kNone, false, 1));
  absl::StatusOr<std::unique_ptr<Model>> gelu =
      Model::Create(cpu.get(), Options(Recompute::kGelu, false, 1));
  ASSERT_TRUE(none.ok() && gelu.ok());
  EXPECT_EQ((*gelu)->activation_bytes(), (*none)->activation_bytes());
  ExpectSameTraining(Train(cpu.get(), Options(Recompute::kNone, false, 2), 3),
                     Train(cpu.get(), Options(Recompute::kGelu, false, 2), 3));
}

// ModelOptions::fp8_fuse_gelu_cast and fp8_fuse_attention_cast: fc2's input cast by fc1's GEMM
// (Backend::MatmulFp8GeluCast: fc2 then reads the GELU output's buffer) and the projection's
// input cast by the attention forward (Backend::AttentionForwardFp8Cast), both of which the
// cpu backend takes, train exactly as the op followed by the Linear's own cast: each fused
// alone, and both, against neither, in every checkpointing mode (whose recomputed fc1 and
// attention run unfused) and with gradient accumulation.
TEST(Fp8RecomputeTest, CastingAnInputInTheOpBeforeItTrainsTheSame) {
  std::unique_ptr<kernels::Backend> cpu = kernels::NewCpuBackend(1);
  for (Recompute mode : {Recompute::kNone, Recompute::kMlp, Recompute::kFull}) {
    for (int accum : {1, 3}) {
      ModelOptions apart = Options(mode, /*keep=*/false, accum);
      apart.fp8_fuse_gelu_cast = false;
      apart.fp8_fuse_attention_cast = false;
      const TrainResult split = Train(cpu.get(), apart, 3);
      ASSERT_EQ(split.losses.size(), static_cast<size_t>(3 * accum));
      for (int fused : {1, 2, 3}) {  // bit 0: fc2's input, bit 1: the projection's
        SCOPED_TRACE(absl::StrCat("recompute ", static_cast<int>(mode), ", grad_accum ", accum,
                                  ", fused casts ", fused));
        ModelOptions o = apart;
        o.fp8_fuse_gelu_cast = (fused & 1) != 0;
        o.fp8_fuse_attention_cast = (fused & 2) != 0;
        ExpectSameTraining(split, Train(cpu.get(), o, 3));
      }
    }
  }
}

// ModelOptions::fp8_keep_weight_transposes (what the trainer sets where FP8 then still fits in
// BF16's memory): the weight transposes written with the weights once per step instead of cast
// again in every backward train identically, and take every Linear's transpose less the
// shared one more.
TEST(Fp8RecomputeTest, KeepingTheWeightTransposesTrainsTheSame) {
  std::unique_ptr<kernels::Backend> cpu = kernels::NewCpuBackend(1);
  for (int accum : {1, 3}) {
    for (bool ln : {false, true}) {
      SCOPED_TRACE(absl::StrCat("grad_accum ", accum, ln ? ", LayerNorm inputs' too" : ""));
      ModelOptions keep_w = Options(Recompute::kNone, /*keep=*/false, accum);
      keep_w.fp8_keep_weight_transposes = true;
      keep_w.fp8_keep_ln_input_transposes = ln;
      const TrainResult kept = Train(cpu.get(), keep_w, 3);
      const TrainResult cast = Train(cpu.get(), Options(Recompute::kNone, false, accum), 3);
      ASSERT_EQ(kept.losses.size(), static_cast<size_t>(3 * accum));
      ExpectSameTraining(kept, cast);
    }
  }
  ModelOptions keep_w = Options(Recompute::kNone, false, 1);
  keep_w.fp8_keep_weight_transposes = true;
  absl::StatusOr<std::unique_ptr<Model>> a = Model::Create(cpu.get(), keep_w);
  absl::StatusOr<std::unique_ptr<Model>> b =
      Model::Create(cpu.get(), Options(Recompute::kNone, false, 1));
  ASSERT_TRUE(a.ok() && b.ok());
  const size_t C = 64, F = 256, L = 2, N = 4 * 32;
  EXPECT_EQ((*a)->fp8_bytes() - (*b)->fp8_bytes(),
            L * (4 * C * C + 2 * C * F) - C * std::max(3 * C, F));
  keep_w.fp8_keep_ln_input_transposes = true;
  absl::StatusOr<std::unique_ptr<Model>> c = Model::Create(cpu.get(), keep_w);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->fp8_bytes() - (*a)->fp8_bytes(), L * 2 * C * N);
  // With activation checkpointing the LayerNorm outputs are kept or recomputed instead: no
  // input transpose is kept.
  ModelOptions mlp = Options(Recompute::kMlp, false, 1);
  mlp.fp8_keep_weight_transposes = true;
  absl::StatusOr<std::unique_ptr<Model>> d = Model::Create(cpu.get(), mlp);
  mlp.fp8_keep_ln_input_transposes = true;
  absl::StatusOr<std::unique_ptr<Model>> e = Model::Create(cpu.get(), mlp);
  ASSERT_TRUE(d.ok() && e.ok());
  EXPECT_EQ((*e)->fp8_bytes(), (*d)->fp8_bytes());
}

TEST(Fp8RecomputeTest, AllocatesTheKeptTransposesLess) {
  std::unique_ptr<kernels::Backend> cpu = kernels::NewCpuBackend(1);
  for (Recompute mode : {Recompute::kNone, Recompute::kMlp, Recompute::kFull}) {
    SCOPED_TRACE(static_cast<int>(mode));
    const ModelOptions keep_options = Options(mode, true, 1);
    absl::StatusOr<std::unique_ptr<Model>> keep = Model::Create(cpu.get(), keep_options);
    absl::StatusOr<std::unique_ptr<Model>> lean = Model::Create(cpu.get(), Options(mode, false, 1));
    ASSERT_TRUE(keep.ok() && lean.ok());
    const size_t N = 4 * 32, C = 64, F = 256, L = 2;
    // Per layer: the input transposes of qkv, the projection, fc1 (C bytes per token each)
    // and fc2 (F) and the four weight transposes (one byte per weight); less the one shared
    // weight transpose.
    const size_t saved =
        L * (N * (3 * C + F) + 3 * C * C + C * C + C * F + F * C) - C * std::max(3 * C, F);
    EXPECT_EQ((*keep)->fp8_bytes() - (*lean)->fp8_bytes(), saved);
    EXPECT_EQ((*keep)->activation_bytes(), (*lean)->activation_bytes());
    EXPECT_EQ((*keep)->total_bytes() - (*lean)->total_bytes(), saved);
  }
}

}  // namespace
}  // namespace boulder::engine
