// FP8 training on the GPU (precision fp8) against the CPU backend's exact FP8 emulation and
// against BF16 training. Skips, saying so, without a GPU of compute capability 8.9 or higher
// (ctest label gpu).
//
// Tolerances:
//   one step, same BF16-rounded weights and batch, scales from a first step: the GPU's FP8
//   loss within 2e-2 relative of the emulation's (BF16 vs FP32 activations move some values
//   across FP8 rounding boundaries); each parameter's gradient within 0.25 relative L2 error;
//   scales within 5% (their amaxes come from BF16 vs FP32 activations).
//   200 steps of the seed job: FP8's mean loss over the last 20 steps within 0.05 absolute
//   (or 10% relative) of BF16's (the margin the issue asks to state), no skipped steps, and
//   greedy generation keeps the prompt's stride.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "worker/engine/data.h"
#include "worker/engine/model.h"
#include "worker/engine/test_specs.h"
#include "worker/engine/trainer.h"

namespace boulder::engine {
namespace {

// A CUDA backend with FP8, or null with the reason in *why.
std::unique_ptr<kernels::Backend> Fp8GpuOrNull(std::string* why) {
  absl::StatusOr<std::unique_ptr<kernels::Backend>> b = kernels::NewCudaBackend(0);
  if (!b.ok()) {
    *why = absl::StrCat("no usable CUDA device: ", b.status().message());
    return nullptr;
  }
  if (absl::Status s = (*b)->Fp8Supported(); !s.ok()) {
    *why = absl::StrCat("GPU without FP8: ", s.message());
    return nullptr;
  }
  return std::move(*b);
}

ModelOptions SmallOptions() {
  ModelOptions o;
  o.config.vocab_size = 96;
  o.config.padded_vocab_size = PaddedVocabSize(96);
  o.config.hidden = 128;
  o.config.heads = 2;  // head size 64
  o.config.layers = 2;
  o.config.ffn = 512;
  o.config.context = 128;
  o.batch_size = 4;
  o.seq_len = 64;  // 256 rows: FP8 GEMM dims are multiples of 16
  o.seed = 7;
  o.fp8.enabled = true;
  return o;
}

std::vector<float> Download(kernels::Backend& b, const void* p, size_t n) {
  std::vector<float> v(n);
  b.CopyToHostF32(v.data(), p, b.compute_dtype(), n);
  return v;
}

TEST(Fp8GpuTest, StepMatchesCpuEmulation) {
  std::string why;
  std::unique_ptr<kernels::Backend> gpu = Fp8GpuOrNull(&why);
  if (!gpu) GTEST_SKIP() << why;
  std::unique_ptr<kernels::Backend> cpu = kernels::NewCpuBackend(0);
  const ModelOptions o = SmallOptions();
  auto gm = Model::Create(gpu.get(), o);
  auto cm = Model::Create(cpu.get(), o);
  ASSERT_TRUE(gm.ok()) << gm.status();
  ASSERT_TRUE(cm.ok()) << cm.status();
  Model& g = **gm;
  Model& c = **cm;
  const size_t n = g.num_params();
  std::vector<float> w = Download(*gpu, g.params(), n);
  cpu->CopyFromHostF32(c.params(), cpu->compute_dtype(), w.data(), n);

  ArithmeticData data(96, 6, 11);
  const Batch batch = data.Get(0, 1, 0, o.batch_size, o.seq_len);
  std::vector<Fp8TensorStat> gs, cs;
  for (Model* m : {&g, &c}) {
    m->ZeroGrad();
    ASSERT_TRUE(m->Forward(batch.inputs, batch.targets).ok());
    ASSERT_TRUE(m->Backward().ok());
  }
  ASSERT_TRUE(g.Fp8EndStep(true, &gs).ok());
  ASSERT_TRUE(c.Fp8EndStep(true, &cs).ok());
  ASSERT_EQ(gs.size(), cs.size());
  for (size_t i = 0; i < gs.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("layer ", gs[i].layer, " ", Fp8LinearName(gs[i].linear), " ",
                              Fp8RoleName(gs[i].role)));
    EXPECT_NEAR(gs[i].scale, cs[i].scale, 0.05 * cs[i].scale);
    EXPECT_NEAR(gs[i].saturated_ratio, cs[i].saturated_ratio, 0.01);
    EXPECT_NEAR(gs[i].underflow_ratio, cs[i].underflow_ratio, 0.05);
  }

  g.ZeroGrad();
  c.ZeroGrad();
  absl::StatusOr<double> gl = g.Forward(batch.inputs, batch.targets);
  absl::StatusOr<double> cl = c.Forward(batch.inputs, batch.targets);
  ASSERT_TRUE(gl.ok() && cl.ok());
  EXPECT_NEAR(*gl, *cl, 2e-2 * std::fabs(*cl)) << "loss";
  ASSERT_TRUE(g.Backward().ok());
  ASSERT_TRUE(c.Backward().ok());
  std::vector<float> gg = Download(*gpu, g.grads(), n), cg = Download(*cpu, c.grads(), n);
  for (const TensorInfo& t : g.layout().tensors()) {
    double num = 0, den = 0;
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
      ASSERT_TRUE(std::isfinite(gg[i])) << t.name << "[" << i - t.offset << "]";
      num += (double(gg[i]) - cg[i]) * (double(gg[i]) - cg[i]);
      den += double(cg[i]) * cg[i];
    }
    if (den == 0) continue;
    EXPECT_LT(std::sqrt(num / den), 0.25) << t.name;
  }
}

// Activation checkpointing in FP8 on the GPU: the recomputed FP8 Linears (input casts without
// a transpose, statistics discarded) reproduce the forward, so losses agree with keeping the
// activations to the kernels' determinism (deterministic mode: 1e-6, as the BF16 recompute
// test), every tensor's element tally is exact and its scale the same; peak memory drops.
TEST(Fp8GpuTest, RecomputeKeepsTheLossAndTheStatistics) {
  std::string why;
  if (!Fp8GpuOrNull(&why)) GTEST_SKIP() << why;
  ArithmeticData data(96, 6, 13);
  const Recompute modes[3] = {Recompute::kNone, Recompute::kMlp, Recompute::kFull};
  std::vector<double> losses[3];
  std::vector<Fp8TensorStat> stats[3];
  int64_t peak[3];
  for (int i = 0; i < 3; ++i) {
    std::unique_ptr<kernels::Backend> gpu = Fp8GpuOrNull(&why);
    gpu->SetDeterministic(true);
    ModelOptions o = SmallOptions();
    o.config.layers = 3;
    o.recompute = modes[i];
    auto m = Model::Create(gpu.get(), o);
    ASSERT_TRUE(m.ok()) << m.status();
    for (int step = 1; step <= 3; ++step) {
      const Batch batch = data.Get(0, step, 0, o.batch_size, o.seq_len);
      (*m)->ZeroGrad();
      absl::StatusOr<double> l = (*m)->Forward(batch.inputs, batch.targets);
      ASSERT_TRUE(l.ok()) << l.status();
      losses[i].push_back(*l);
      ASSERT_TRUE((*m)->Backward().ok());
      ASSERT_TRUE((*m)->OptimizerStep(1e-3f, step).ok());
      ASSERT_TRUE((*m)->Fp8EndStep(true, &stats[i]).ok());
    }
    peak[i] = gpu->GetMemoryStats().peak_bytes;
  }
  for (int i = 1; i < 3; ++i) {
    SCOPED_TRACE(i == 1 ? "mlp" : "full");
    for (size_t s = 0; s < losses[0].size(); ++s) {
      EXPECT_NEAR(losses[i][s], losses[0][s], 1e-6) << "step " << s + 1;
    }
    ASSERT_EQ(stats[i].size(), stats[0].size());
    for (size_t t = 0; t < stats[0].size(); ++t) {
      EXPECT_EQ(stats[i][t].elements, stats[0][t].elements) << t;
      EXPECT_NEAR(stats[i][t].scale, stats[0][t].scale, 1e-6 * stats[0][t].scale) << t;
      EXPECT_NEAR(stats[i][t].saturated_ratio, stats[0][t].saturated_ratio, 1e-6) << t;
    }
  }
  EXPECT_LT(peak[1], peak[0]);
  EXPECT_LT(peak[2], peak[1]);
  std::printf("FP8 peak bytes: none %lld, mlp %lld, full %lld\n", static_cast<long long>(peak[0]),
              static_cast<long long>(peak[1]), static_cast<long long>(peak[2]));
}

// The backward's recomputed FP8 input transposes (model_fp8.cc: qkv's and fc1's from their
// LayerNorm's kept input and statistics, Backend::LayerNormFp8FromStats; the projection's cast
// again; fc2's GELU recomputed) against keeping every transpose per layer
// (ModelOptions::fp8_keep_transposes), deterministic kernels, at the scales of a first step:
// every gradient is bit-identical (fc2's input, forward and recomputed, is GeluCastFp8 of the
// same kept pre-activation), and the recomputing layout allocates the kept transposes' bytes
// less. The recomputing layouts run the MLP backward's fused cast (Backend::
// GeluCastFp8AndGrad, Model::MlpBackwardFp8), the kept layout the two casts it replaces.
TEST(Fp8GpuTest, RecomputedTransposesGiveTheKeptLayoutsGradients) {
  std::string why;
  if (!Fp8GpuOrNull(&why)) GTEST_SKIP() << why;
  ArithmeticData data(96, 6, 17);
  // [0] recomputed, [1] every transpose kept, [2] the weight transposes kept (written with the
  // weights by CastFp8Weights: fp8_keep_weight_transposes), [3] those and qkv's and fc1's input
  // transposes (written by their LayerNorm: fp8_keep_ln_input_transposes).
  std::vector<float> grads[4];
  size_t fp8_bytes[4] = {0, 0, 0, 0};
  std::vector<TensorInfo> tensors;
  const ModelOptions base = SmallOptions();
  for (int keep = 0; keep < 4; ++keep) {
    std::unique_ptr<kernels::Backend> gpu = Fp8GpuOrNull(&why);
    gpu->SetDeterministic(true);
    ModelOptions o = base;
    o.fp8_keep_transposes = keep == 1;
    o.fp8_keep_weight_transposes = keep >= 2;
    o.fp8_keep_ln_input_transposes = keep == 3;
    auto m = Model::Create(gpu.get(), o);
    ASSERT_TRUE(m.ok()) << m.status();
    // A first micro-batch sets the scales (no optimizer step: the weights stay the same).
    for (int step = 1; step <= 2; ++step) {
      const Batch batch = data.Get(0, step, 0, o.batch_size, o.seq_len);
      (*m)->ZeroGrad();
      ASSERT_TRUE((*m)->Forward(batch.inputs, batch.targets).ok());
      ASSERT_TRUE((*m)->Backward().ok());
      if (step == 1) {
        ASSERT_TRUE((*m)->Fp8EndStep(true, nullptr).ok());
      }
    }
    grads[keep] = Download(*gpu, (*m)->grads(), (*m)->num_params());
    fp8_bytes[keep] = (*m)->fp8_bytes();
    tensors = (*m)->layout().tensors();
  }
  for (const TensorInfo& t : tensors) {
    SCOPED_TRACE(t.name);
    size_t differing = 0;
    double num = 0, den = 0;
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
      const double a = grads[1][i], b = grads[0][i];
      ASSERT_TRUE(std::isfinite(b)) << i - t.offset;
      differing += std::memcmp(&grads[0][i], &grads[1][i], sizeof(float)) != 0;
      differing += std::memcmp(&grads[0][i], &grads[2][i], sizeof(float)) != 0;
      differing += std::memcmp(&grads[0][i], &grads[3][i], sizeof(float)) != 0;
      num += (a - b) * (a - b);
      den += a * a;
    }
    EXPECT_EQ(differing, 0u) << "of " << t.numel << ", relative L2 "
                             << std::sqrt(num / std::max(den, 1e-30));
  }
  const size_t N = size_t(base.batch_size) * base.seq_len, C = base.config.hidden,
               F = base.config.ffn, L = base.config.layers;
  EXPECT_EQ(fp8_bytes[1] - fp8_bytes[0],
            L * (N * (3 * C + F) + 4 * C * C + 2 * C * F) - C * std::max(3 * C, F));
  EXPECT_EQ(fp8_bytes[2] - fp8_bytes[0], L * (4 * C * C + 2 * C * F) - C * std::max(3 * C, F));
  EXPECT_EQ(fp8_bytes[3] - fp8_bytes[2], L * 2 * C * N);
}

// The seed job itself (batch 32 x 256, 200 steps, a report every 10 steps): at the GPU tests'
// smaller batch (SeedTestSpec) 200 steps do not train the model enough for its greedy
// generation to keep the stride reliably, in any precision, the CPU's included.
v1::JobSpec SeedSpec(const std::string& precision) {
  v1::JobSpec s = SeedJobSpec(precision, "cuda");
  SetTestFp8(&s, /*emulate=*/false);
  return s;
}

struct TrainRun {
  absl::Status status;
  std::vector<v1::StepReport> steps;
  v1::GenerationResult generation;
  double seconds = 0;
};

TrainRun Train(const v1::JobSpec& spec) {
  TrainRun r;
  TrainerOptions o;
  o.spec = spec;
  o.on_step = [&](const v1::StepReport& s) { r.steps.push_back(s); };
  o.on_generation = [&](const v1::GenerationResult& g) { r.generation = g; };
  const auto start = std::chrono::steady_clock::now();
  r.status = RunTrainer(o);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

double MeanLastLoss(const std::vector<v1::StepReport>& v, size_t k) {
  double s = 0;
  for (size_t i = v.size() - k; i < v.size(); ++i) s += v[i].loss();
  return s / k;
}

TEST(Fp8GpuTest, SeedJobInFp8ConvergesLikeBf16) {
  std::string why;
  if (!Fp8GpuOrNull(&why)) GTEST_SKIP() << why;
  const size_t reports = 20;  // steps 10, 20, ..., 200
  TrainRun fp8 = Train(SeedSpec("fp8"));
  TrainRun bf16 = Train(SeedSpec("bf16"));
  ASSERT_TRUE(fp8.status.ok()) << fp8.status;
  ASSERT_TRUE(bf16.status.ok()) << bf16.status;
  ASSERT_EQ(fp8.steps.size(), reports);
  ASSERT_EQ(bf16.steps.size(), reports);
  for (int i : {0, 4, 9, 19}) {
    std::printf("step %3lld  loss bf16 %.4f  fp8 %.4f\n",
                static_cast<long long>(bf16.steps[i].step()), bf16.steps[i].loss(),
                fp8.steps[i].loss());
  }
  std::printf("wall time (incl. start-up and generation): bf16 %.2f s, fp8 %.2f s\n", bf16.seconds,
              fp8.seconds);
  // The last five reports: steps 160-200.
  const double f = MeanLastLoss(fp8.steps, 5), b = MeanLastLoss(bf16.steps, 5);
  EXPECT_NEAR(f, b, std::max(0.05, 0.1 * b)) << "FP8 did not converge like BF16";
  EXPECT_LT(f, 0.5);
  const v1::StepReport& last = fp8.steps.back();
  EXPECT_EQ(last.skipped_steps(), 0);
  ASSERT_EQ(last.fp8_size(), 4 * 4 * 3);
  for (const v1::Fp8TensorStats& t : last.fp8()) {
    SCOPED_TRACE(absl::StrCat(t.layer(), " ", t.tensor(), " ", t.role()));
    EXPECT_GT(t.amax(), 0);
    EXPECT_GT(t.scale(), 0);
    EXPECT_LT(t.saturated_ratio(), 0.01);
  }
  std::vector<int32_t> seq(fp8.generation.prompt().begin(), fp8.generation.prompt().end());
  seq.insert(seq.end(), fp8.generation.tokens().begin(), fp8.generation.tokens().end());
  int32_t stride = 0;
  EXPECT_TRUE(HasConstantStride(seq, 96, &stride))
      << "prompt + generated: " << absl::StrJoin(seq, " ");
}

TEST(Fp8GpuTest, RefusesFp8WithoutFp8Hardware) {
  // Meaningful on a GPU below 8.9 (A100): the job fails with the reason. On Hopper it runs.
  absl::StatusOr<std::unique_ptr<kernels::Backend>> b = kernels::NewCudaBackend(0);
  if (!b.ok()) GTEST_SKIP() << "no usable CUDA device: " << b.status().message();
  if ((*b)->Fp8Supported().ok()) GTEST_SKIP() << "this GPU has FP8; nothing to refuse";
  b->reset();
  v1::JobSpec spec = SeedSpec("fp8");
  spec.mutable_training()->set_steps(1);
  TrainRun r = Train(spec);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status.message().find("FP8 training needs 8.9 or higher"), std::string::npos)
      << r.status;
}

}  // namespace
}  // namespace boulder::engine
