#include "worker/engine/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "worker/engine/rng.h"

namespace boulder::engine {
namespace {

using ::testing::HasSubstr;

ModelOptions TinyOptions(bool tied) {
  ModelOptions o;
  o.config.vocab_size = 11;
  o.config.padded_vocab_size = PaddedVocabSize(11);
  o.config.hidden = 8;
  o.config.heads = 2;
  o.config.layers = 2;
  o.config.ffn = 16;
  o.config.context = 8;
  o.config.tie_embeddings = tied;
  o.batch_size = 2;
  o.seq_len = 5;
  o.seed = 3;
  return o;
}

std::vector<int32_t> RandomTokens(Rng* rng, size_t n, int V) {
  std::vector<int32_t> out(n);
  for (int32_t& x : out) x = static_cast<int32_t>(rng->Below(V));
  return out;
}

// Raw FP64 access to a device buffer of the FP64 backend.
std::vector<double> ReadF64(kernels::Backend* be, const void* src, size_t n) {
  std::vector<double> out(n);
  be->CopyToHost(out.data(), src, n * sizeof(double));
  return out;
}

// The mean cross-entropy of the model's logits in double precision, computed on the host
// (the backend's losses are FP32, too coarse for finite differences).
double HostLoss(Model* model, kernels::Backend* be, const std::vector<int32_t>& tokens,
                const std::vector<int32_t>& targets) {
  const ModelOptions& o = model->options();
  const int B = o.batch_size, T = o.seq_len, V = o.config.vocab_size,
            Vp = o.config.padded_vocab_size;
  EXPECT_TRUE(model->ForwardLogits(tokens, B, T).ok());
  const std::vector<double> logits = ReadF64(be, model->logits(), size_t{1} * B * T * Vp);
  double total = 0;
  for (int r = 0; r < B * T; ++r) {
    const double* row = logits.data() + size_t{1} * r * Vp;
    double mx = row[0];
    for (int v = 1; v < V; ++v) mx = std::max(mx, row[v]);
    double z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(row[v] - mx);
    total += std::log(z) + mx - row[targets[r]];
  }
  return total / (B * T);
}

class GradCheckTest : public ::testing::TestWithParam<bool> {};

TEST_P(GradCheckTest, EveryParameterMatchesCentralDifferences) {
  std::unique_ptr<kernels::Backend> be = kernels::NewCpuBackendF64(1);
  ASSERT_EQ(be->compute_dtype(), kernels::DType::kF64);
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Create(be.get(), TinyOptions(GetParam()));
  ASSERT_TRUE(m.ok()) << m.status();
  Model& model = **m;
  const size_t n = model.num_params();

  // Move away from the init (zero biases, unit LayerNorm weights) so every path is exercised.
  Rng rng(11);
  std::vector<double> params = ReadF64(be.get(), model.params(), n);
  for (double& p : params) p += 0.1 * rng.Gaussian();
  be->CopyFromHost(model.params(), params.data(), n * sizeof(double));

  const std::vector<int32_t> tokens = RandomTokens(&rng, 10, 11);
  const std::vector<int32_t> targets = RandomTokens(&rng, 10, 11);
  model.ZeroGrad();
  absl::StatusOr<double> loss = model.Forward(tokens, targets);
  ASSERT_TRUE(loss.ok()) << loss.status();
  ASSERT_TRUE(model.Backward().ok());
  const std::vector<double> grads = ReadF64(be.get(), model.grads(), n);
  // The FP32 loss of Forward agrees with the host's double loss.
  EXPECT_NEAR(*loss, HostLoss(&model, be.get(), tokens, targets), 1e-6);

  // Every element of every tensor (the model is tiny). Criterion as numpy.allclose:
  // |analytic - numeric| <= atol + rtol * max(|analytic|, |numeric|), rtol 1e-5, atol 1e-8.
  // The atol covers gradients that vanish or nearly cancel (the key bias shifts all scores of
  // a query row equally, so softmax ignores it): the backend interface keeps LayerNorm and
  // attention statistics in FP32 even on the FP64 backend, which perturbs gradients by
  // ~1e-9 absolute here, while central differences with h = 1e-5 are exact to ~1e-11.
  const double h = 1e-5, rtol = 1e-5, atol = 1e-8;
  const int V = 11, C = 8;
  size_t checked = 0;
  for (const TensorInfo& t : model.layout().tensors()) {
    double worst_excess = -1;
    std::string worst;
    for (size_t j = 0; j < t.numel; ++j) {
      const size_t i = t.offset + j;
      const double saved = params[i];
      params[i] = saved + h;
      be->CopyFromHost(model.params(), params.data(), n * sizeof(double));
      const double up = HostLoss(&model, be.get(), tokens, targets);
      params[i] = saved - h;
      be->CopyFromHost(model.params(), params.data(), n * sizeof(double));
      const double down = HostLoss(&model, be.get(), tokens, targets);
      params[i] = saved;
      const double numeric = (up - down) / (2 * h);
      const double tol = atol + rtol * std::max(std::abs(grads[i]), std::abs(numeric));
      const double excess = std::abs(grads[i] - numeric) / tol;
      if (excess > worst_excess) {
        worst_excess = excess;
        worst = absl::StrCat("[", j, "] analytic ", grads[i], " numeric ", numeric);
      }
      ++checked;
    }
    be->CopyFromHost(model.params(), params.data(), n * sizeof(double));
    EXPECT_LE(worst_excess, 1.0) << t.name << " worst " << worst;
    // Padding rows of wte / lm_head get no gradient: no token or target maps to them.
    if (t.kind == TensorKind::kWte || t.kind == TensorKind::kLmHead) {
      for (size_t j = size_t{V} * C; j < t.numel; ++j) ASSERT_EQ(grads[t.offset + j], 0.0);
    }
  }
  EXPECT_EQ(checked, n);
}

INSTANTIATE_TEST_SUITE_P(Untied, GradCheckTest, ::testing::Values(false));
INSTANTIATE_TEST_SUITE_P(Tied, GradCheckTest, ::testing::Values(true));

TEST(ModelTest, GradientAccumulationSumsMicroBatches) {
  std::unique_ptr<kernels::Backend> be = kernels::NewCpuBackendF64(1);
  ModelOptions one = TinyOptions(false), two = TinyOptions(false);
  two.grad_accum_steps = 2;
  auto a = Model::Create(be.get(), one);
  auto b = Model::Create(be.get(), two);
  ASSERT_TRUE(a.ok() && b.ok());
  Rng rng(5);
  const std::vector<int32_t> x1 = RandomTokens(&rng, 10, 11), y1 = RandomTokens(&rng, 10, 11);
  const std::vector<int32_t> x2 = RandomTokens(&rng, 10, 11), y2 = RandomTokens(&rng, 10, 11);
  const size_t n = (*a)->num_params();
  // a: each micro-batch alone; b: both accumulated with dloss 1/(2BT).
  (*a)->ZeroGrad();
  ASSERT_TRUE((*a)->Forward(x1, y1).ok() && (*a)->Backward().ok());
  std::vector<double> g1 = ReadF64(be.get(), (*a)->grads(), n);
  (*a)->ZeroGrad();
  ASSERT_TRUE((*a)->Forward(x2, y2).ok() && (*a)->Backward().ok());
  std::vector<double> g2 = ReadF64(be.get(), (*a)->grads(), n);
  (*b)->ZeroGrad();
  ASSERT_TRUE((*b)->Forward(x1, y1).ok() && (*b)->Backward().ok());
  ASSERT_TRUE((*b)->Forward(x2, y2).ok() && (*b)->Backward().ok());
  std::vector<double> g = ReadF64(be.get(), (*b)->grads(), n);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(g[i], 0.5 * (g1[i] + g2[i]), 1e-12) << i;
  }
}

// ZeroGrad() deferring the weight gradients to the step's first backward (which writes them
// with '=') gives the gradients zeroing everything does, bit for bit: over steps whose
// gradient buffer holds the last step's values, with two micro-batches, tied and untied heads,
// and with frozen layers and embeddings (fewer gradients, the backward stopping early). And a
// ZeroGrad() with no backward after it still reads as zero.
TEST(ModelTest, DeferredZeroGradGivesTheZeroedGradients) {
  struct Case {
    bool tied;
    std::vector<int> freeze_layers;
    bool freeze_embeddings;
  };
  for (const Case& k : {Case{false, {}, false}, Case{true, {}, false}, Case{false, {0}, true},
                        Case{true, {1}, false}}) {
    SCOPED_TRACE(absl::StrCat("tied ", k.tied, ", frozen layers ", k.freeze_layers.size(),
                              ", frozen embeddings ", k.freeze_embeddings));
    std::unique_ptr<kernels::Backend> be = kernels::NewCpuBackend(1);
    ModelOptions on = TinyOptions(k.tied);
    on.grad_accum_steps = 2;
    on.freeze_layers = k.freeze_layers;
    on.freeze_embeddings = k.freeze_embeddings;
    ModelOptions off = on;
    off.overwrite_first_weight_gradients = false;
    auto a = Model::Create(be.get(), on);
    auto b = Model::Create(be.get(), off);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    EXPECT_TRUE((*a)->defers_zero_grad());
    EXPECT_FALSE((*b)->defers_zero_grad());
    const size_t n = (*a)->num_trainable_params();
    Rng rng(9);
    for (int step = 1; step <= 3; ++step) {
      SCOPED_TRACE(absl::StrCat("step ", step));
      (*a)->ZeroGrad();
      (*b)->ZeroGrad();
      for (int micro = 0; micro < 2; ++micro) {
        const std::vector<int32_t> x = RandomTokens(&rng, 10, 11), y = RandomTokens(&rng, 10, 11);
        for (Model* m : {a->get(), b->get()}) {
          ASSERT_TRUE(m->Forward(x, y).ok());
          ASSERT_TRUE(m->Backward().ok());
        }
      }
      std::vector<float> ga(n), gb(n);
      be->CopyToHostF32(ga.data(), (*a)->grads(), be->compute_dtype(), n);
      be->CopyToHostF32(gb.data(), (*b)->grads(), be->compute_dtype(), n);
      ASSERT_EQ(0, std::memcmp(ga.data(), gb.data(), n * sizeof(float)));
      for (Model* m : {a->get(), b->get()}) ASSERT_TRUE(m->OptimizerStep(1e-2f, step).ok());
    }
    (*a)->ZeroGrad();
    std::vector<float> g(n, 1.f);
    be->CopyToHostF32(g.data(), (*a)->grads(), be->compute_dtype(), n);
    EXPECT_EQ(std::count(g.begin(), g.end(), 0.f), static_cast<std::ptrdiff_t>(n));
  }
}

// The norm the backward computes bucket by bucket (ModelOptions::grad_norm_in_backward) is the
// norm of all the step's gradients: against the host's sum over grads() after the step, and
// against one pass after the backward (grad_norm_in_backward off), with the clip active so the
// norm changes the update; tied and untied heads, frozen layers and embeddings (buckets the
// backward never reaches), and two micro-batches (where the backward leaves the norm to the
// step). GradNorm() between the backward and the step returns the same norm.
TEST(ModelTest, GradNormFromTheBackwardIsTheWholeGradientsNorm) {
  struct Case {
    bool tied;
    std::vector<int> freeze_layers;
    bool freeze_embeddings;
    int accum;
  };
  for (const Case& k : {Case{false, {}, false, 1}, Case{true, {}, false, 1},
                        Case{false, {0}, true, 1}, Case{true, {1}, false, 1},
                        Case{false, {}, true, 1}, Case{false, {}, false, 2}}) {
    SCOPED_TRACE(absl::StrCat("tied ", k.tied, ", frozen layers ", k.freeze_layers.size(),
                              ", frozen embeddings ", k.freeze_embeddings, ", micro-batches ",
                              k.accum));
    std::unique_ptr<kernels::Backend> be = kernels::NewCpuBackend(1);
    ModelOptions on = TinyOptions(k.tied);
    on.grad_accum_steps = k.accum;
    on.freeze_layers = k.freeze_layers;
    on.freeze_embeddings = k.freeze_embeddings;
    on.adamw.grad_clip = 0.05f;  // below every step's norm here: the clip scales each update
    on.grad_norm_in_backward = true;
    ModelOptions off = on;
    off.grad_norm_in_backward = false;
    auto a = Model::Create(be.get(), on);
    auto b = Model::Create(be.get(), off);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    const size_t n = (*a)->num_trainable_params();
    Rng rng(17);
    for (int step = 1; step <= 3; ++step) {
      SCOPED_TRACE(absl::StrCat("step ", step));
      (*a)->ZeroGrad();
      (*b)->ZeroGrad();
      for (int micro = 0; micro < k.accum; ++micro) {
        const std::vector<int32_t> x = RandomTokens(&rng, 10, 11), y = RandomTokens(&rng, 10, 11);
        for (Model* m : {a->get(), b->get()}) {
          ASSERT_TRUE(m->Forward(x, y).ok());
          ASSERT_TRUE(m->Backward().ok());
        }
      }
      EXPECT_EQ((*a)->grad_norm_computed(), k.accum == 1);
      EXPECT_FALSE((*b)->grad_norm_computed());
      absl::StatusOr<float> early = (*a)->GradNorm();
      absl::StatusOr<float> na = (*a)->OptimizerStep(1e-2f, step);
      absl::StatusOr<float> nb = (*b)->OptimizerStep(1e-2f, step);
      ASSERT_TRUE(early.ok() && na.ok() && nb.ok());
      EXPECT_EQ(*early, *na);
      std::vector<float> g(n);
      be->CopyToHostF32(g.data(), (*a)->grads(), be->compute_dtype(), n);
      double ss = 0;
      for (float v : g) ss += static_cast<double>(v) * v;
      ASSERT_GT(ss, 0.0);
      EXPECT_NEAR(*na, std::sqrt(ss), 1e-5 * std::sqrt(ss));
      EXPECT_NEAR(*na, *nb, 1e-5 * *nb);
      EXPECT_GT(*na, on.adamw.grad_clip);
      std::vector<float> pa(n), pb(n);
      be->CopyToHostF32(pa.data(), (*a)->params(), be->compute_dtype(), n);
      be->CopyToHostF32(pb.data(), (*b)->params(), be->compute_dtype(), n);
      for (size_t i = 0; i < n; ++i) ASSERT_NEAR(pa[i], pb[i], 1e-5) << i;
    }
  }
}

// GradNorm() before the optimizer step (FP8's eager skip check) leaves its norm for the step,
// which then makes no pass of its own: the same value; and a write through grads() after it
// makes the step compute the new gradients' norm.
TEST(ModelTest, OptimizerStepReusesGradNormUntilTheGradientsChange) {
  std::unique_ptr<kernels::Backend> be = kernels::NewCpuBackendF64(1);
  ModelOptions o = TinyOptions(false);
  o.adamw.grad_clip = 0.0f;
  auto m = Model::Create(be.get(), o);
  ASSERT_TRUE(m.ok());
  Model& model = **m;
  const size_t n = model.num_trainable_params();
  Rng rng(21);
  for (int step = 1; step <= 2; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const std::vector<int32_t> x = RandomTokens(&rng, 10, 11), y = RandomTokens(&rng, 10, 11);
    model.ZeroGrad();
    EXPECT_FALSE(model.grad_norm_computed());
    ASSERT_TRUE(model.Forward(x, y).ok());
    ASSERT_TRUE(model.Backward().ok());
    EXPECT_FALSE(model.grad_norm_computed());  // off by default
    absl::StatusOr<float> first = model.GradNorm();
    ASSERT_TRUE(first.ok());
    EXPECT_TRUE(model.grad_norm_computed());
    if (step == 2) {  // double every gradient: the step must see a norm twice as large
      std::vector<double> g = ReadF64(be.get(), model.grads(), n);
      EXPECT_FALSE(model.grad_norm_computed());
      for (double& v : g) v *= 2;
      be->CopyFromHost(model.grads(), g.data(), n * sizeof(double));
    }
    absl::StatusOr<float> norm = model.OptimizerStep(1e-3f, step);
    ASSERT_TRUE(norm.ok());
    EXPECT_FLOAT_EQ(*norm, step == 2 ? 2 * *first : *first);
  }
}

TEST(ModelTest, WeightDecayFollowsTheTableAndNothingIsFrozen) {
  std::unique_ptr<kernels::Backend> be = kernels::NewCpuBackendF64(1);
  ModelOptions o = TinyOptions(false);
  o.adamw.weight_decay = 0.5f;
  o.adamw.grad_clip = 0.0f;
  auto m = Model::Create(be.get(), o);
  ASSERT_TRUE(m.ok());
  Model& model = **m;
  const size_t n = model.num_params();
  const std::vector<double> before = ReadF64(be.get(), model.params(), n);

  // With zero gradients AdamW's update is 0, so only decay moves parameters: decayed tensors
  // shrink by (1 - lr * wd) and the others stay exactly put.
  model.ZeroGrad();
  ASSERT_TRUE(model.OptimizerStep(0.1f, 1).ok());
  std::vector<double> after = ReadF64(be.get(), model.params(), n);
  for (const TensorInfo& t : model.layout().tensors()) {
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
      const double expected = t.decays ? before[i] * (1.0 - 0.1 * 0.5) : before[i];
      ASSERT_NEAR(after[i], expected, 1e-7 * std::abs(before[i])) << t.name << " " << i;
    }
  }

  // One real step moves every tensor: no parameter is left out of the optimizer.
  Rng rng(9);
  const std::vector<int32_t> x = RandomTokens(&rng, 10, 11), y = RandomTokens(&rng, 10, 11);
  model.ZeroGrad();
  ASSERT_TRUE(model.Forward(x, y).ok());
  ASSERT_TRUE(model.Backward().ok());
  const std::vector<double> grads = ReadF64(be.get(), model.grads(), n);
  absl::StatusOr<float> norm = model.OptimizerStep(1e-3f, 2);
  ASSERT_TRUE(norm.ok());
  double ss = 0;
  for (double g : grads) ss += g * g;
  EXPECT_NEAR(*norm, std::sqrt(ss), 1e-5 * std::sqrt(ss));
  const std::vector<double> stepped = ReadF64(be.get(), model.params(), n);
  for (const TensorInfo& t : model.layout().tensors()) {
    size_t changed = 0;
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
      if (stepped[i] != after[i]) ++changed;
      if (grads[i] != 0.0) {
        ASSERT_NE(stepped[i], after[i]) << t.name << " " << i;
      }
    }
    EXPECT_GT(changed, 0u) << t.name;
  }
}

TEST(ModelTest, RejectsBadInputs) {
  std::unique_ptr<kernels::Backend> be = kernels::NewCpuBackendF64(1);
  ModelOptions o = TinyOptions(false);
  o.seq_len = 9;
  absl::Status s = Model::Create(be.get(), o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("training.seq_len: 9 is not in [1, context 8]"));

  auto m = Model::Create(be.get(), TinyOptions(false));
  ASSERT_TRUE(m.ok());
  Model& model = **m;
  s = model.Backward();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  std::vector<int32_t> x(10, 1), y(10, 2);
  y[7] = 11;
  s = model.Forward(x, y).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("targets[7]: token 11 is outside the vocabulary [0, 11)"));
  s = model.Forward(std::vector<int32_t>(9, 0), std::vector<int32_t>(9, 0)).status();
  EXPECT_THAT(s.message(), HasSubstr("expected 10 tokens"));
  EXPECT_EQ(model.Generate({}, 3).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelTest, GenerateSlidesTheWindowPastTheContext) {
  std::unique_ptr<kernels::Backend> be = kernels::NewCpuBackendF64(1);
  auto m = Model::Create(be.get(), TinyOptions(false));
  ASSERT_TRUE(m.ok());
  Model& model = **m;
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6};
  absl::StatusOr<std::vector<int32_t>> out = model.Generate(prompt, 6);  // 12 > context 8
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 6u);
  // Each generated token is the argmax of a forward over the last 8 tokens.
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), out->begin(), out->end());
  const std::vector<int32_t> window(seq.begin() + 3, seq.begin() + 11);  // predicts seq[11]
  ASSERT_TRUE(model.ForwardLogits(window, 1, 8).ok());
  const std::vector<double> logits = ReadF64(be.get(), model.logits(), 8 * 32);
  int best = 0;
  for (int v = 1; v < 11; ++v) {
    if (logits[7 * 32 + v] > logits[7 * 32 + best]) best = v;
  }
  EXPECT_EQ(seq[11], best);
}

}  // namespace
}  // namespace boulder::engine
