// The CUDA backend against the CPU reference on whole training steps and whole runs.
// Skips, saying so, where no usable GPU is present (ctest label gpu).
//
// Tolerances (BF16 activations and gradients, FP32 accumulation and master weights):
//   one step, same weights (the GPU's BF16 values) and batch: loss within 1e-2 relative; each
//   parameter tensor's gradient within 5e-2 relative L2 error (‖gpu − cpu‖ / ‖cpu‖);
//   200 steps of the seed model at batch 8 x 64 (small enough for the CPU run): the mean loss
//   of the last 20 steps within 0.05 absolute (or 10% relative) of the CPU run's;
//   the seed job itself (examples/minigpt.yaml, batch 32 x 256, 200 steps) on the GPU: greedy
//   generation keeps the prompt's stride. (At batch 8 x 64 the model is not trained enough
//   for that: with seed 1337 the CPU reference itself breaks the stride, and the GPU's
//   generation is the CPU's to within two tokens; measured on the H200, 2026-12-03.)
#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "worker/engine/data.h"
#include "worker/engine/model.h"
#include "worker/engine/trainer.h"
#include "worker/engine/test_specs.h"

namespace boulder::engine {
namespace {

std::unique_ptr<kernels::Backend> GpuOrSkip() {
  absl::StatusOr<std::unique_ptr<kernels::Backend>> b = kernels::NewCudaBackend(0);
  if (!b.ok()) return nullptr;
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
  o.seq_len = 100;  // not a multiple of the attention tile
  o.grad_accum_steps = 1;
  o.seed = 7;
  return o;
}

std::vector<float> Download(kernels::Backend& b, const void* p, size_t n) {
  std::vector<float> v(n);
  b.CopyToHostF32(v.data(), p, b.compute_dtype(), n);
  return v;
}

// One optimizer step's gradients over `micro_batches` micro-batches (accumulated without
// zeroing between them) on the GPU and the CPU from the same weights and batches.
void GradientsMatchCpu(int micro_batches) {
  std::unique_ptr<kernels::Backend> gpu = GpuOrSkip();
  if (!gpu) GTEST_SKIP() << "no usable CUDA device";
  std::unique_ptr<kernels::Backend> cpu = kernels::NewCpuBackend(0);
  ModelOptions o = SmallOptions();
  o.grad_accum_steps = micro_batches;
  auto gm = Model::Create(gpu.get(), o);
  auto cm = Model::Create(cpu.get(), o);
  ASSERT_TRUE(gm.ok()) << gm.status();
  ASSERT_TRUE(cm.ok()) << cm.status();
  Model& g = **gm;
  Model& c = **cm;
  const size_t n = g.num_params();
  // The CPU model gets the GPU's BF16-rounded weights, so both compute the same function.
  std::vector<float> w = Download(*gpu, g.params(), n);
  cpu->CopyFromHostF32(c.params(), cpu->compute_dtype(), w.data(), n);

  ArithmeticData data(96, 6, 11);
  g.ZeroGrad();
  c.ZeroGrad();
  for (int micro = 0; micro < micro_batches; ++micro) {
    Batch batch = data.Get(0, 1, micro, o.batch_size, o.seq_len);
    absl::StatusOr<double> gl = g.Forward(batch.inputs, batch.targets);
    absl::StatusOr<double> cl = c.Forward(batch.inputs, batch.targets);
    ASSERT_TRUE(gl.ok() && cl.ok());
    EXPECT_NEAR(*gl, *cl, 1e-2 * std::fabs(*cl)) << "loss";
    ASSERT_TRUE(g.Backward().ok());
    ASSERT_TRUE(c.Backward().ok());
  }
  std::vector<float> gg = Download(*gpu, g.grads(), n), cg = Download(*cpu, c.grads(), n);
  for (const TensorInfo& t : g.layout().tensors()) {
    double num = 0, den = 0;
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
      ASSERT_TRUE(std::isfinite(gg[i])) << t.name << "[" << i - t.offset << "]";
      num += (double(gg[i]) - cg[i]) * (double(gg[i]) - cg[i]);
      den += double(cg[i]) * cg[i];
    }
    if (den == 0) {
      EXPECT_EQ(num, 0) << t.name;
      continue;
    }
    EXPECT_LT(std::sqrt(num / den), 5e-2) << t.name;
  }
}

TEST(ModelGpuTest, OneStepMatchesCpu) { GradientsMatchCpu(1); }

// The bias gradients from GEMM epilogues (written with '=' by cuBLASLt) still accumulate.
TEST(ModelGpuTest, AccumulatedMicroBatchesMatchCpu) { GradientsMatchCpu(3); }

v1::JobSpec SeedSpec(int steps) { return SeedTestSpec(steps, "auto", "auto"); }

struct TrainRun {
  std::vector<double> losses;
  v1::GenerationResult generation;
};

TrainRun Train(const v1::JobSpec& spec, const std::string& backend) {
  TrainRun r;
  TrainerOptions o;
  o.spec = spec;
  o.backend = backend;
  o.on_step = [&](const v1::StepReport& s) { r.losses.push_back(s.loss()); };
  o.on_generation = [&](const v1::GenerationResult& g) { r.generation = g; };
  absl::Status s = RunTrainer(o);
  EXPECT_TRUE(s.ok()) << backend << ": " << s;
  return r;
}

double MeanLast(const std::vector<double>& v, size_t k) {
  double s = 0;
  for (size_t i = v.size() - k; i < v.size(); ++i) s += v[i];
  return s / k;
}

TEST(ModelGpuTest, SeedJobLearnsLikeCpu) {
  if (!GpuOrSkip()) GTEST_SKIP() << "no usable CUDA device";
  const int steps = 200;
  // Deterministic kernels: the GPU run is the same every time, so a generation that misses
  // the stride is a reproducible failure, not a flake.
  v1::JobSpec spec = SeedSpec(steps);
  spec.mutable_training()->set_deterministic(true);
  TrainRun gpu = Train(spec, "cuda");
  TrainRun cpu = Train(SeedSpec(steps), "cpu");
  ASSERT_EQ(gpu.losses.size(), size_t(steps));
  ASSERT_EQ(cpu.losses.size(), size_t(steps));
  for (int s : {0, 9, 49, 99, 199}) {
    std::printf("step %3d  loss cpu %.4f  gpu %.4f\n", s + 1, cpu.losses[s], gpu.losses[s]);
  }
  const double g = MeanLast(gpu.losses, 20), c = MeanLast(cpu.losses, 20);
  std::printf("mean loss of steps %d-%d: cpu %.4f  gpu %.4f\n", steps - 19, steps, c, g);
  EXPECT_NEAR(g, c, std::max(0.05, 0.1 * c));
  EXPECT_LT(g, 0.5);
  std::printf("generated: cpu %s\n           gpu %s\n",
              absl::StrJoin(cpu.generation.tokens(), " ").c_str(),
              absl::StrJoin(gpu.generation.tokens(), " ").c_str());
}

TEST(ModelGpuTest, SeedJobGeneratesTheStride) {
  if (!GpuOrSkip()) GTEST_SKIP() << "no usable CUDA device";
  TrainRun gpu = Train(SeedJobSpec("bf16", "cuda"), "cuda");
  ASSERT_EQ(gpu.losses.size(), 20u);  // a report every 10 steps
  std::printf("seed job, bf16: loss at step 200 %.4f\n", gpu.losses.back());
  EXPECT_LT(gpu.losses.back(), 0.1);
  std::vector<int32_t> seq(gpu.generation.prompt().begin(), gpu.generation.prompt().end());
  seq.insert(seq.end(), gpu.generation.tokens().begin(), gpu.generation.tokens().end());
  int32_t stride = 0;
  EXPECT_TRUE(HasConstantStride(seq, 96, &stride))
      << "prompt + generated: " << absl::StrJoin(seq, " ");
}

TEST(ModelGpuTest, DeterministicLosses) {
  if (!GpuOrSkip()) GTEST_SKIP() << "no usable CUDA device";
  v1::JobSpec spec = SeedSpec(10);
  spec.mutable_generation()->set_tokens(0);
  spec.mutable_training()->set_deterministic(true);
  TrainRun a = Train(spec, "cuda"), b = Train(spec, "cuda");
  ASSERT_EQ(a.losses.size(), 10u);
  EXPECT_EQ(a.losses, b.losses);  // bit-identical
}

}  // namespace
}  // namespace boulder::engine
