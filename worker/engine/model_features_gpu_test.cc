// Freezing, activation checkpointing and weights in/out on the CUDA backend (BF16 compute,
// FP32 master weights). Skips, saying so, without a usable GPU.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "worker/engine/model.h"
#include "worker/engine/rng.h"
#include "worker/engine/safetensors.h"

namespace boulder::engine {
namespace {

std::unique_ptr<kernels::Backend> Gpu() {
  absl::StatusOr<std::unique_ptr<kernels::Backend>> b = kernels::NewCudaBackend(0);
  if (!b.ok()) return nullptr;
  return std::move(*b);
}

ModelOptions Options() {
  ModelOptions o;
  o.config.vocab_size = 256;
  o.config.padded_vocab_size = PaddedVocabSize(256);
  o.config.hidden = 128;
  o.config.heads = 2;  // head size 64
  o.config.layers = 4;
  o.config.ffn = 512;
  o.config.context = 128;
  o.batch_size = 4;
  o.seq_len = 128;
  o.seed = 5;
  return o;
}

std::vector<int32_t> Tokens(uint64_t seed, size_t n) {
  Rng rng(seed);
  std::vector<int32_t> out(n);
  for (int32_t& x : out) x = static_cast<int32_t>(rng.Below(256));
  return out;
}

std::vector<double> Train(Model* m, int steps) {
  std::vector<double> losses;
  const size_t n = 4 * 128;
  for (int s = 1; s <= steps; ++s) {
    m->ZeroGrad();
    auto l = m->Forward(Tokens(10 + s, n), Tokens(20 + s, n));
    EXPECT_TRUE(l.ok()) << l.status();
    losses.push_back(l.ok() ? *l : 0);
    EXPECT_TRUE(m->Backward().ok());
    EXPECT_TRUE(m->OptimizerStep(1e-3f, s).ok());
  }
  return losses;
}

TEST(ModelFeaturesGpuTest, FrozenLayersStayBitIdentical) {
  auto gpu = Gpu();
  if (!gpu) GTEST_SKIP() << "no usable CUDA GPU (or no CUDA backend in this build)";
  ModelOptions o = Options();
  o.freeze_layers = {0, 1};
  auto m = Model::Create(gpu.get(), o);
  ASSERT_TRUE(m.ok()) << m.status();
  const ParamLayout& layout = (*m)->layout();
  auto before = (*m)->GetParameters();
  ASSERT_TRUE(before.ok());
  Train(m->get(), 3);
  auto after = (*m)->GetParameters();
  ASSERT_TRUE(after.ok());
  for (const TensorInfo& t : layout.tensors()) {
    const bool frozen = t.layer == 0 || t.layer == 1;
    const bool same = std::equal(before->begin() + t.offset, before->begin() + t.offset + t.numel,
                                 after->begin() + t.offset);
    EXPECT_EQ(same, frozen) << t.name;
  }
}

TEST(ModelFeaturesGpuTest, RecomputeKeepsTheLossAndLowersPeakMemory) {
  auto gpu_none = Gpu();
  if (!gpu_none) GTEST_SKIP() << "no usable CUDA GPU (or no CUDA backend in this build)";
  constexpr int kModes = 4;
  std::vector<double> losses[kModes];
  int64_t peak[kModes];
  const Recompute modes[kModes] = {Recompute::kNone, Recompute::kGelu, Recompute::kMlp,
                                   Recompute::kFull};
  for (int i = 0; i < kModes; ++i) {
    auto gpu = Gpu();
    ModelOptions o = Options();
    o.recompute = modes[i];
    auto m = Model::Create(gpu.get(), o);
    ASSERT_TRUE(m.ok()) << m.status();
    losses[i] = Train(m->get(), 3);
    peak[i] = gpu->GetMemoryStats().peak_bytes;
  }
  // The recomputing modes run the same kernels on the same inputs: identical unless a kernel
  // is non-deterministic. kNone's fc2 weight gradient reads the forward's GELU (the GEMM
  // epilogue's, from the FP32 pre-activation) where they recompute it from the BF16 one: the
  // first loss is the same, the later ones within BF16 noise.
  for (int i = 2; i < kModes; ++i) {
    for (size_t s = 0; s < losses[1].size(); ++s) {
      EXPECT_NEAR(losses[i][s], losses[1][s], 1e-6) << "mode " << i << " step " << s;
    }
  }
  ASSERT_EQ(losses[0].size(), losses[1].size());
  EXPECT_NEAR(losses[0][0], losses[1][0], 1e-6);
  for (size_t s = 1; s < losses[0].size(); ++s) {
    EXPECT_NEAR(losses[0][s], losses[1][s], 2e-3 * std::fabs(losses[1][s])) << "step " << s;
  }
  for (int i = 1; i < kModes; ++i) EXPECT_LT(peak[i], peak[i - 1]) << "mode " << i;
  std::printf("peak bytes: none %lld, gelu %lld, mlp %lld, full %lld\n",
              static_cast<long long>(peak[0]), static_cast<long long>(peak[1]),
              static_cast<long long>(peak[2]), static_cast<long long>(peak[3]));
}

TEST(ModelFeaturesGpuTest, ExportedWeightsReloadOnTheCpu) {
  auto gpu = Gpu();
  if (!gpu) GTEST_SKIP() << "no usable CUDA GPU (or no CUDA backend in this build)";
  auto m = Model::Create(gpu.get(), Options());
  ASSERT_TRUE(m.ok());
  Train(m->get(), 2);
  auto params = (*m)->GetParameters();  // FP32 master weights
  ASSERT_TRUE(params.ok());
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/gpu_weights_", getpid(), ".safetensors");
  ASSERT_TRUE(WriteGpt2Safetensors(path, (*m)->layout(), *params).ok());
  auto cpu = kernels::NewCpuBackend(1);
  auto c = Model::Create(cpu.get(), Options());
  ASSERT_TRUE(c.ok());
  auto loaded = LoadGpt2Safetensors(path, (*c)->layout());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, *params);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace boulder::engine
