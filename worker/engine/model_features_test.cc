// Freezing, activation checkpointing and parameter import/export of the Model (issue 10).
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "worker/engine/model.h"
#include "worker/engine/rng.h"
#include "worker/engine/safetensors.h"

namespace boulder::engine {
namespace {

ModelOptions Small(bool tied = false) {
  ModelOptions o;
  o.config.vocab_size = 50;
  o.config.padded_vocab_size = PaddedVocabSize(50);
  o.config.hidden = 32;
  o.config.heads = 4;
  o.config.layers = 4;
  o.config.ffn = 128;
  o.config.context = 16;
  o.config.tie_embeddings = tied;
  o.batch_size = 4;
  o.seq_len = 16;
  o.seed = 11;
  o.adamw.weight_decay = 0.1f;
  return o;
}

std::vector<int32_t> Tokens(uint64_t seed, size_t n, int V) {
  Rng rng(seed);
  std::vector<int32_t> out(n);
  for (int32_t& x : out) x = static_cast<int32_t>(rng.Below(V));
  return out;
}

std::vector<float> Read(kernels::Backend* be, const void* p, size_t n) {
  std::vector<float> out(n);
  be->CopyToHostF32(out.data(), p, be->compute_dtype(), n);
  EXPECT_TRUE(be->Synchronize().ok());
  return out;
}

// Runs `steps` optimizer steps on fixed random data; returns the losses.
std::vector<double> Train(Model* model, int steps) {
  const ModelOptions& o = model->options();
  const size_t n = static_cast<size_t>(o.batch_size) * o.seq_len;
  std::vector<double> losses;
  for (int s = 1; s <= steps; ++s) {
    model->ZeroGrad();
    const auto x = Tokens(100 + s, n, o.config.vocab_size);
    const auto y = Tokens(200 + s, n, o.config.vocab_size);
    auto loss = model->Forward(x, y);
    EXPECT_TRUE(loss.ok()) << loss.status();
    losses.push_back(loss.ok() ? *loss : 0);
    EXPECT_TRUE(model->Backward().ok());
    EXPECT_TRUE(model->OptimizerStep(1e-2f, s).ok());
  }
  return losses;
}

// The gradient of the tensor `info` in model m (nothing frozen: layout offsets).
std::vector<float> Slice(const std::vector<float>& flat, const TensorInfo& info) {
  return std::vector<float>(flat.begin() + info.offset, flat.begin() + info.offset + info.numel);
}

bool Frozen(const TensorInfo& t, const ModelOptions& o) {
  for (int l : o.freeze_layers) {
    if (t.layer == l) return true;
  }
  return o.freeze_embeddings && (t.kind == TensorKind::kWte || t.kind == TensorKind::kWpe);
}

class FreezeTest : public ::testing::TestWithParam<int> {};

TEST_P(FreezeTest, FrozenTensorsStayBitIdenticalAndTheOthersGetTheFullModelsGradient) {
  auto be = kernels::NewCpuBackend(1);
  ModelOptions frozen_options = Small(GetParam() == 2);
  if (GetParam() == 0) frozen_options.freeze_layers = {0, 1};
  if (GetParam() == 1) frozen_options.freeze_layers = {1, 3};
  if (GetParam() == 2) {  // tied head frozen with the embeddings; no backward below layer 1
    frozen_options.freeze_layers = {0};
    frozen_options.freeze_embeddings = true;
  }
  ModelOptions full_options = frozen_options;
  full_options.freeze_layers.clear();
  full_options.freeze_embeddings = false;
  auto frozen = Model::Create(be.get(), frozen_options);
  auto full = Model::Create(be.get(), full_options);
  ASSERT_TRUE(frozen.ok() && full.ok());
  const ParamLayout& layout = (*full)->layout();

  size_t frozen_count = 0;
  for (const TensorInfo& t : layout.tensors()) {
    if (Frozen(t, frozen_options)) frozen_count += t.numel;
  }
  EXPECT_EQ((*frozen)->num_trainable_params(), layout.num_params() - frozen_count);
  EXPECT_LT((*frozen)->total_bytes(), (*full)->total_bytes());

  // One micro-batch: every trainable tensor's gradient equals the full model's, bit for bit.
  const size_t n = 4 * 16;
  for (Model* m : {frozen->get(), full->get()}) {
    m->ZeroGrad();
    ASSERT_TRUE(m->Forward(Tokens(1, n, 50), Tokens(2, n, 50)).ok());
    ASSERT_TRUE(m->Backward().ok());
  }
  const std::vector<float> g_full = Read(be.get(), (*full)->grads(), layout.num_params());
  const std::vector<float> g_frozen =
      Read(be.get(), (*frozen)->grads(), (*frozen)->num_trainable_params());
  size_t at = 0;
  for (const TensorInfo& t : layout.tensors()) {
    if (Frozen(t, frozen_options)) continue;
    const std::vector<float> a(g_frozen.begin() + at, g_frozen.begin() + at + t.numel);
    EXPECT_EQ(a, Slice(g_full, t)) << t.name;
    at += t.numel;
  }

  const std::vector<float> before = Read(be.get(), (*frozen)->params(), layout.num_params());
  Train(frozen->get(), 3);
  const std::vector<float> after = Read(be.get(), (*frozen)->params(), layout.num_params());
  for (const TensorInfo& t : layout.tensors()) {
    if (Frozen(t, frozen_options)) {
      EXPECT_EQ(Slice(after, t), Slice(before, t)) << t.name << " changed although frozen";
    } else {
      EXPECT_NE(Slice(after, t), Slice(before, t)) << t.name << " did not train";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sets, FreezeTest, ::testing::Values(0, 1, 2));

class RecomputeTest : public ::testing::TestWithParam<Recompute> {};

TEST_P(RecomputeTest, SameLossesAndWeightsWithASmallerArena) {
  auto be_none = kernels::NewCpuBackend(1);
  auto be_ckpt = kernels::NewCpuBackend(1);
  ModelOptions o = Small();
  auto none = Model::Create(be_none.get(), o);
  o.recompute = GetParam();
  auto ckpt = Model::Create(be_ckpt.get(), o);
  ASSERT_TRUE(none.ok() && ckpt.ok());
  const std::vector<double> a = Train(none->get(), 3);
  const std::vector<double> b = Train(ckpt->get(), 3);
  EXPECT_EQ(a, b);
  const size_t n = (*none)->num_params();
  EXPECT_EQ(Read(be_none.get(), (*none)->params(), n), Read(be_ckpt.get(), (*ckpt)->params(), n));
  EXPECT_LT((*ckpt)->activation_bytes(), (*none)->activation_bytes());
  EXPECT_LT(be_ckpt->GetMemoryStats().peak_bytes, be_none->GetMemoryStats().peak_bytes);
  // Inference is unaffected.
  ASSERT_TRUE((*none)->ForwardLogits(Tokens(5, 16, 50), 1, 16).ok());
  ASSERT_TRUE((*ckpt)->ForwardLogits(Tokens(5, 16, 50), 1, 16).ok());
  const size_t logits = 16 * static_cast<size_t>(o.config.padded_vocab_size);
  EXPECT_EQ(Read(be_none.get(), (*none)->logits(), logits),
            Read(be_ckpt.get(), (*ckpt)->logits(), logits));
}

TEST(ParseRecomputeTest, MapsEveryModeAndNamesTheFieldOtherwise) {
  EXPECT_EQ(*ParseRecompute(""), Recompute::kNone);
  EXPECT_EQ(*ParseRecompute("none"), Recompute::kNone);
  EXPECT_EQ(*ParseRecompute("gelu"), Recompute::kGelu);
  EXPECT_EQ(*ParseRecompute("mlp"), Recompute::kMlp);
  EXPECT_EQ(*ParseRecompute("full"), Recompute::kFull);
  absl::StatusOr<Recompute> bad = ParseRecompute("some");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "training.activation_checkpointing: unknown 'some' (none, gelu, mlp or full)");
}

INSTANTIATE_TEST_SUITE_P(Modes, RecomputeTest,
                         ::testing::Values(Recompute::kGelu, Recompute::kMlp, Recompute::kFull));

TEST(ModelWeightsTest, ExportThenInitFromGivesIdenticalLogits) {
  char tmpl[] = "/tmp/model_weights_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = absl::StrCat(tmpl, "/w.safetensors");
  for (bool tied : {false, true}) {
    auto be = kernels::NewCpuBackend(1);
    ModelOptions o = Small(tied);
    auto trained = Model::Create(be.get(), o);
    ASSERT_TRUE(trained.ok());
    Train(trained->get(), 2);
    auto params = (*trained)->GetParameters();
    ASSERT_TRUE(params.ok());
    ASSERT_TRUE(WriteGpt2Safetensors(path, (*trained)->layout(), *params).ok());

    o.seed = 999;  // a different random init, replaced by the file
    auto loaded = Model::Create(be.get(), o);
    ASSERT_TRUE(loaded.ok());
    auto weights = LoadGpt2Safetensors(path, (*loaded)->layout());
    ASSERT_TRUE(weights.ok()) << weights.status();
    ASSERT_TRUE((*loaded)->SetParameters(*weights).ok());
    const auto x = Tokens(7, 32, 50);
    const size_t logits = 32 * static_cast<size_t>(o.config.padded_vocab_size);
    ASSERT_TRUE((*trained)->ForwardLogits(x, 2, 16).ok());
    const std::vector<float> want = Read(be.get(), (*trained)->logits(), logits);
    ASSERT_TRUE((*loaded)->ForwardLogits(x, 2, 16).ok());
    EXPECT_EQ(Read(be.get(), (*loaded)->logits(), logits), want) << "tied " << tied;
  }
  EXPECT_EQ(
      Model::Create(kernels::NewCpuBackend(1).get(), Small()).value()->SetParameters({1.0f}).code(),
      absl::StatusCode::kInvalidArgument);
  std::system(absl::StrCat("rm -rf '", tmpl, "'").c_str());
}

}  // namespace
}  // namespace boulder::engine
