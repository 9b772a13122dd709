// CUDA-graph replay of the training step on the cuda backend (training.cuda_graph): with
// training.deterministic the replayed steps run the same kernels as the eager ones, so losses,
// gradient norms and parameters must be bit-identical; a warmup + cosine schedule changes the
// learning rate at every step, so a value baked into the graph would show. Skips without a GPU.
#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/split_master.h"
#include "worker/engine/fp8_state.h"
#include "worker/engine/rng.h"
#include "worker/engine/step_graph.h"
#include "worker/engine/step_graph_testing.h"
#include "worker/engine/test_temp_dir.h"
#include "worker/engine/trainer.h"

namespace boulder::engine {
namespace {

using ::testing::Contains;
using testing::FirstBitDifference;
using ::testing::HasSubstr;
using testing::StepRun;
using testing::TrainSteps;

std::unique_ptr<kernels::Backend> Gpu(bool deterministic) {
  absl::StatusOr<std::unique_ptr<kernels::Backend>> b = kernels::NewCudaBackend(0);
  if (!b.ok()) return nullptr;
  (*b)->SetDeterministic(deterministic);
  return *std::move(b);
}

ModelOptions GpuOptions(int accum) {
  ModelOptions o;
  o.config.vocab_size = 96;
  o.config.padded_vocab_size = PaddedVocabSize(96);
  o.config.hidden = 128;
  o.config.heads = 2;  // head size 64
  o.config.layers = 2;
  o.config.ffn = 512;
  o.config.context = 64;
  o.batch_size = 4;
  o.seq_len = 64;
  o.grad_accum_steps = accum;
  o.adamw.weight_decay = 0.1f;
  o.adamw.grad_clip = 0.5f;
  o.seed = 5;
  return o;
}

class GpuReplayTest : public ::testing::TestWithParam<int> {};

TEST_P(GpuReplayTest, DeterministicReplayIsBitIdenticalToEager) {
  std::unique_ptr<kernels::Backend> eager_be = Gpu(true), graph_be = Gpu(true);
  if (!eager_be) GTEST_SKIP() << "no usable CUDA device";
  const int accum = GetParam(), steps = 7;
  absl::StatusOr<StepRun> eager = TrainSteps(eager_be.get(), GpuOptions(accum), "off", steps);
  ASSERT_TRUE(eager.ok()) << eager.status();
  absl::StatusOr<StepRun> graph = TrainSteps(graph_be.get(), GpuOptions(accum), "on", steps);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->graphed, std::vector<bool>({false, false, true, true, true, true, true}));
  EXPECT_THAT(graph->info, Contains(HasSubstr("captured the training step at step 3")));
  EXPECT_EQ(FirstBitDifference(eager->losses, graph->losses), -1)
      << ::testing::PrintToString(eager->losses) << " vs "
      << ::testing::PrintToString(graph->losses);
  EXPECT_EQ(FirstBitDifference(eager->norms, graph->norms), -1)
      << ::testing::PrintToString(eager->norms) << " vs " << ::testing::PrintToString(graph->norms);
  ASSERT_EQ(eager->params.size(), graph->params.size());
  EXPECT_EQ(FirstBitDifference(eager->params, graph->params), -1);
  EXPECT_LT(graph->losses.back(), graph->losses.front());  // it trains
}

INSTANTIATE_TEST_SUITE_P(Accum, GpuReplayTest, ::testing::Values(1, 2));

// The norm computed during the backward (ModelOptions::grad_norm_in_backward: bucket by bucket,
// on the backend's norm stream): replayed steps bit-identical to eager ones, in BF16 and FP8,
// and the first step's norm (same weights, same batch, so the same gradient bits) equal to the
// single pass's up to the order of the sum; the runs then train alike.
TEST(GpuReplayTest, GradNormInTheBackwardReplaysAndMatchesOnePass) {
  for (bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8" : "bf16");
    std::unique_ptr<kernels::Backend> eager_be = Gpu(true), graph_be = Gpu(true),
                                      step_be = Gpu(true);
    if (!eager_be) GTEST_SKIP() << "no usable CUDA device";
    if (fp8 && !eager_be->Fp8Supported().ok()) continue;
    ModelOptions o = GpuOptions(1);
    o.fp8.enabled = fp8;
    ModelOptions one_pass = o;
    o.grad_norm_in_backward = true;
    const int steps = 6;
    absl::StatusOr<StepRun> eager = TrainSteps(eager_be.get(), o, "off", steps);
    ASSERT_TRUE(eager.ok()) << eager.status();
    absl::StatusOr<StepRun> graph = TrainSteps(graph_be.get(), o, "on", steps);
    ASSERT_TRUE(graph.ok()) << graph.status();
    absl::StatusOr<StepRun> single = TrainSteps(step_be.get(), one_pass, "off", steps);
    ASSERT_TRUE(single.ok()) << single.status();
    EXPECT_EQ(graph->graphed, std::vector<bool>({false, false, true, true, true, true}));
    EXPECT_EQ(FirstBitDifference(eager->losses, graph->losses), -1)
        << ::testing::PrintToString(eager->losses) << " vs "
        << ::testing::PrintToString(graph->losses);
    EXPECT_EQ(FirstBitDifference(eager->norms, graph->norms), -1)
        << ::testing::PrintToString(eager->norms) << " vs "
        << ::testing::PrintToString(graph->norms);
    EXPECT_EQ(FirstBitDifference(eager->params, graph->params), -1);
    EXPECT_EQ(eager->losses[0], single->losses[0]);
    EXPECT_NEAR(eager->norms[0], single->norms[0], 1e-5 * single->norms[0]);
    EXPECT_GT(eager->norms[0], o.adamw.grad_clip);  // the clip used the norm
    for (int i = 0; i < steps; ++i) {
      EXPECT_NEAR(eager->losses[i], single->losses[i], 1e-2 * single->losses[i]) << "step " << i + 1;
    }
  }
}

// FP8 replayed from graphs (casts, FP8 GEMMs, the device-side skip and scale update in the
// graph): bit-identical to the eager FP8 steps with training.deterministic, scales included.
std::unique_ptr<kernels::Backend> Fp8Gpu() {
  std::unique_ptr<kernels::Backend> be = Gpu(true);
  if (be != nullptr && !be->Fp8Supported().ok()) return nullptr;
  return be;
}

ModelOptions GpuFp8Options(int accum) {
  ModelOptions o = GpuOptions(accum);
  o.fp8.enabled = true;
  return o;
}

// Every tensor's statistics of every step, bit for bit (skipped_step: 1-based step the eager
// loop stopped at its non-finite loss; the graph also ran that micro-batch's backward, so its
// gradient tensors' statistics are compared by scale only).
void ExpectSameFp8Stats(const StepRun& eager, const StepRun& graph, int skipped_step = 0) {
  ASSERT_EQ(eager.fp8_stats.size(), graph.fp8_stats.size());
  for (size_t s = 0; s < eager.fp8_stats.size(); ++s) {
    ASSERT_EQ(eager.fp8_stats[s].size(), graph.fp8_stats[s].size());
    for (size_t i = 0; i < eager.fp8_stats[s].size(); ++i) {
      const Fp8TensorStat &a = eager.fp8_stats[s][i], &b = graph.fp8_stats[s][i];
      const std::string where = absl::StrCat("step ", s + 1, " tensor ", i);
      EXPECT_EQ(FirstBitDifference(std::vector<float>{a.scale}, std::vector<float>{b.scale}), -1)
          << where << ": scale " << a.scale << " vs " << b.scale;
      if (static_cast<int>(s) + 1 == skipped_step && a.role == Fp8Role::kGradOutput) continue;
      EXPECT_EQ(FirstBitDifference(std::vector<float>{a.amax, a.amax_history_max},
                                   std::vector<float>{b.amax, b.amax_history_max}),
                -1)
          << where << ": amax " << a.amax << " vs " << b.amax;
      EXPECT_EQ(a.elements, b.elements) << where;
      EXPECT_EQ(a.saturated_ratio, b.saturated_ratio) << where;
      EXPECT_EQ(a.underflow_ratio, b.underflow_ratio) << where;
      EXPECT_EQ(a.non_finite, b.non_finite) << where;
    }
  }
}

class GpuFp8ReplayTest : public ::testing::TestWithParam<int> {};

TEST_P(GpuFp8ReplayTest, DeterministicReplayIsBitIdenticalToEager) {
  std::unique_ptr<kernels::Backend> eager_be = Fp8Gpu(), graph_be = Fp8Gpu();
  if (!eager_be) GTEST_SKIP() << "no CUDA device with FP8 (compute capability 8.9+)";
  const int accum = GetParam(), steps = 7;
  absl::StatusOr<StepRun> eager = TrainSteps(eager_be.get(), GpuFp8Options(accum), "off", steps);
  ASSERT_TRUE(eager.ok()) << eager.status();
  absl::StatusOr<StepRun> graph = TrainSteps(graph_be.get(), GpuFp8Options(accum), "on", steps);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->graphed, std::vector<bool>({false, false, true, true, true, true, true}));
  EXPECT_EQ(graph->applied, std::vector<bool>(steps, true));
  EXPECT_THAT(graph->info, Contains(HasSubstr("captured the training step at step 3")));
  EXPECT_EQ(FirstBitDifference(eager->losses, graph->losses), -1)
      << ::testing::PrintToString(eager->losses) << " vs "
      << ::testing::PrintToString(graph->losses);
  EXPECT_EQ(FirstBitDifference(eager->norms, graph->norms), -1)
      << ::testing::PrintToString(eager->norms) << " vs " << ::testing::PrintToString(graph->norms);
  EXPECT_EQ(FirstBitDifference(eager->params, graph->params), -1);
  ExpectSameFp8Stats(*eager, *graph);
  EXPECT_NE(graph->fp8_stats.back()[0].scale, 1.0f);  // the graphed scale update ran
  EXPECT_LT(graph->losses.back(), graph->losses.front());
}

TEST_P(GpuFp8ReplayTest, NonFiniteReplayedStepIsSkippedAndTrainingGoesOn) {
  // A NaN in layer 0's fc1 weight during step 4 (a replayed step): AdamW and the scale update
  // skip themselves on the device, the host counts the skip and discards the amaxes; the weight
  // is put back after the step and training goes on. Eager with the same NaN agrees.
  std::unique_ptr<kernels::Backend> eager_be = Fp8Gpu(), graph_be = Fp8Gpu();
  if (!eager_be) GTEST_SKIP() << "no CUDA device with FP8 (compute capability 8.9+)";
  const int accum = GetParam(), steps = 7, poisoned = 4;
  absl::StatusOr<StepRun> eager = TrainSteps(
      eager_be.get(), GpuFp8Options(accum), "off", steps, [](int) { return -1.0; },
      testing::PoisonFc1WeightAt(eager_be.get(), poisoned, 0));
  ASSERT_TRUE(eager.ok()) << eager.status();
  absl::StatusOr<StepRun> graph = TrainSteps(
      graph_be.get(), GpuFp8Options(accum), "on", steps, [](int) { return -1.0; },
      testing::PoisonFc1WeightAt(graph_be.get(), poisoned, 0));
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE(graph->graphed[poisoned - 1]);
  const std::vector<bool> want = {true, true, true, false, true, true, true};
  EXPECT_EQ(eager->applied, want);
  EXPECT_EQ(graph->applied, want);
  EXPECT_FALSE(std::isfinite(graph->losses[poisoned - 1]));
  for (int s = poisoned; s < steps; ++s) EXPECT_TRUE(std::isfinite(graph->losses[s])) << s + 1;
  const std::vector<Fp8TensorStat>&before = graph->fp8_stats[poisoned - 2],
        &skipped = graph->fp8_stats[poisoned - 1];
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i].scale, skipped[i].scale) << i;
  EXPECT_EQ(Fp8State::FirstNonFinite(skipped), "layer 0 fc1 weight");
  EXPECT_EQ(Fp8State::FirstNonFinite(graph->fp8_stats[poisoned]), "");
  EXPECT_EQ(FirstBitDifference(eager->losses, graph->losses), -1)
      << ::testing::PrintToString(eager->losses) << " vs "
      << ::testing::PrintToString(graph->losses);
  EXPECT_EQ(FirstBitDifference(eager->params, graph->params), -1);
  ExpectSameFp8Stats(*eager, *graph, poisoned);
}

INSTANTIATE_TEST_SUITE_P(Accum, GpuFp8ReplayTest, ::testing::Values(1, 2));

TEST(GpuStepGraphTest, ReplayedStepsUseEachStepsLearningRate) {
  std::unique_ptr<kernels::Backend> a_be = Gpu(true), b_be = Gpu(true);
  if (!a_be) GTEST_SKIP() << "no usable CUDA device";
  absl::StatusOr<StepRun> three = TrainSteps(a_be.get(), GpuOptions(1), "on", 3);
  ASSERT_TRUE(three.ok()) << three.status();
  absl::StatusOr<StepRun> five = TrainSteps(b_be.get(), GpuOptions(1), "on", 5,
                                            [](int step) { return step >= 4 ? 0.0 : -1.0; });
  ASSERT_TRUE(five.ok()) << five.status();
  ASSERT_EQ(five->graphed, std::vector<bool>({false, false, true, true, true}));
  // lr 0 in the replays of steps 4 and 5: the FP32 master weights stay as step 3 left them.
  EXPECT_EQ(FirstBitDifference(three->params, five->params), -1);
  EXPECT_GT(five->norms[4], 0.0f);
}

TEST(GpuStepGraphTest, AutotunedReplayTrainsLikeEager) {
  // Without training.deterministic the GEMMs are autotuned by timing (per backend), and the
  // attention backward adds with atomics: not bit-identical, but the same training.
  std::unique_ptr<kernels::Backend> eager_be = Gpu(false), graph_be = Gpu(false);
  if (!eager_be) GTEST_SKIP() << "no usable CUDA device";
  absl::StatusOr<StepRun> eager = TrainSteps(eager_be.get(), GpuOptions(1), "off", 8);
  ASSERT_TRUE(eager.ok()) << eager.status();
  absl::StatusOr<StepRun> graph = TrainSteps(graph_be.get(), GpuOptions(1), "auto", 8);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_TRUE(graph->graphed.back());
  for (size_t i = 0; i < eager->losses.size(); ++i) {
    EXPECT_NEAR(graph->losses[i], eager->losses[i], 2e-2 * eager->losses[i]) << "step " << i + 1;
  }
}

TEST(GpuStepGraphTest, AdamWDeviceStepMatchesAdamWBitForBit) {
  std::unique_ptr<kernels::Backend> be = Gpu(true);
  if (!be) GTEST_SKIP() << "no usable CUDA device";
  const size_t n = 10007;
  Rng rng(17);
  std::vector<float> p(n), g(n), m(n), v(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = static_cast<float>(rng.Gaussian());
    g[i] = static_cast<float>(rng.Gaussian());
    m[i] = static_cast<float>(0.1 * rng.Gaussian());
    v[i] = static_cast<float>(0.01 * rng.Uniform());
  }
  struct Set {
    void *params, *master, *grads, *m, *v;
  };
  auto alloc = [&](size_t bytes) {
    absl::StatusOr<void*> a = be->Alloc(bytes);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? *a : nullptr;
  };
  // The master weights as the backend keeps them (split: the BF16 bits and the low halves).
  const size_t mb = be->master_bytes_per_param();
  ASSERT_GT(mb, 0u);
  std::vector<uint16_t> hi(n), lo(n);
  for (size_t i = 0; i < n; ++i) kernels::SplitMaster(p[i], &hi[i], &lo[i]);
  auto make = [&]() {
    Set s{alloc(n * 2), alloc(n * mb), alloc(n * 2), alloc(n * 4), alloc(n * 4)};
    if (be->master_layout() == kernels::Backend::MasterLayout::kBf16LowHalves) {
      be->CopyFromHost(s.params, hi.data(), n * 2);
      be->CopyFromHost(s.master, lo.data(), n * 2);
    } else {
      be->CopyFromHostF32(s.params, kernels::DType::kBF16, p.data(), n);
      be->CopyFromHostF32(s.master, kernels::DType::kF32, p.data(), n);
    }
    be->CopyFromHostF32(s.grads, kernels::DType::kBF16, g.data(), n);
    be->CopyFromHostF32(s.m, kernels::DType::kF32, m.data(), n);
    be->CopyFromHostF32(s.v, kernels::DType::kF32, v.data(), n);
    return s;
  };
  Set a = make(), b = make();
  float* norm_sq = static_cast<float*>(alloc(4));
  float* step = static_cast<float*>(alloc(kernels::Backend::kAdamWStepFloats * 4));
  std::vector<uint8_t> mask(n);
  for (uint8_t& b : mask) b = rng.Uniform() < 0.5 ? 1 : 0;
  const std::vector<uint8_t> packed = kernels::PackDecayBits(mask);
  void* mask_bits = alloc(packed.size());
  be->CopyFromHost(mask_bits, packed.data(), packed.size());
  const kernels::DecayBits bits{static_cast<const uint8_t*>(mask_bits), 0};
  be->NormSquared(norm_sq, a.grads, n);
  for (int t : {1, 7, 1000}) {
    const float lr = 3e-4f * t;
    be->AdamW(a.params, a.master, a.grads, a.m, a.v, bits, n, lr, 0.9f, 0.95f, 1e-8f, 0.1f, t, 1.0f,
              norm_sq, 1.0f);
    be->SetAdamWStep(step, lr, t, 0.9f, 0.95f, /*skip_non_finite=*/false);
    be->AdamWDeviceStep(b.params, b.master, b.grads, b.m, b.v, bits, n, step, 0.9f, 0.95f, 1e-8f,
                        0.1f, 1.0f, norm_sq, 1.0f);
  }
  ASSERT_TRUE(be->Synchronize().ok());
  auto read = [&](const void* src, size_t bytes) {
    std::vector<char> out(bytes);
    be->CopyToHost(out.data(), src, bytes);
    return out;
  };
  EXPECT_EQ(read(a.params, n * 2), read(b.params, n * 2));
  EXPECT_EQ(read(a.master, n * mb), read(b.master, n * mb));
  EXPECT_EQ(read(a.m, n * 4), read(b.m, n * 4));
  EXPECT_EQ(read(a.v, n * 4), read(b.v, n * 4));
  EXPECT_NE(read(a.params, n * 2),
            std::vector<char>(reinterpret_cast<const char*>(hi.data()),
                              reinterpret_cast<const char*>(hi.data()) + n * 2));
}

TEST(GpuStepGraphTest, ForbiddenCallFailsTheCaptureAndTheBackendStaysUsable) {
  std::unique_ptr<kernels::Backend> be = Gpu(true);
  if (!be) GTEST_SKIP() << "no usable CUDA device";
  absl::StatusOr<void*> buf = be->Alloc(1024);
  ASSERT_TRUE(buf.ok());
  ASSERT_TRUE(be->BeginCapture().ok());
  EXPECT_EQ(be->BeginCapture().code(), absl::StatusCode::kFailedPrecondition);
  be->Memset0(*buf, 1024);
  char host[16];
  be->CopyToHost(host, *buf, sizeof(host));  // synchronises: not capturable
  absl::StatusOr<std::unique_ptr<kernels::Backend::Graph>> g = be->EndCapture();
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("graph capture"));
  // Nothing ran; the backend works eagerly and can record again.
  std::vector<float> ones(256, 1.0f), back(256, 0.0f);
  be->CopyFromHostF32(*buf, kernels::DType::kF32, ones.data(), 256);
  ASSERT_TRUE(be->BeginCapture().ok());
  be->Memset0(*buf, 512);  // the first 128 floats
  absl::StatusOr<std::unique_ptr<kernels::Backend::Graph>> ok = be->EndCapture();
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->num_nodes(), 1);
  be->CopyToHostF32(back.data(), *buf, kernels::DType::kF32, 256);
  EXPECT_EQ(back[0], 1.0f) << "recorded work must not run before Replay";
  be->Replay(**ok);
  be->CopyToHostF32(back.data(), *buf, kernels::DType::kF32, 256);
  ASSERT_TRUE(be->Synchronize().ok());
  EXPECT_EQ(back[0], 0.0f);
  EXPECT_EQ(back[127], 0.0f);
  EXPECT_EQ(back[128], 1.0f);
}

// The trainer: training.cuda_graph on against off, deterministic, warmup + cosine.
struct TrainerRun {
  absl::Status status;
  std::vector<v1::StepReport> steps;
  std::vector<std::string> info;
  std::string weights;
};

TrainerRun Train(const std::string& mode, const std::string& dir,
                 const std::string& precision = "bf16") {
  absl::StatusOr<v1::JobSpec> spec = common::LoadJobSpec(
      "{}",
      {"model.hidden=128", "model.heads=2", "model.layers=2", "model.ffn=512", "model.context=64",
       "training.batch_size=4", "training.steps=10", "training.warmup_steps=3",
       "training.schedule=cosine", "training.lr=3e-3", "training.min_lr_ratio=0.1",
       "generation.tokens=0", "training.deterministic=true", "precision=" + precision,
       "resources.backend=cuda", std::string("training.cuda_graph=") + mode});
  TrainerRun run;
  if (!spec.ok()) {
    run.status = spec.status();
    return run;
  }
  TrainerOptions o;
  o.spec = *spec;
  o.backend = "cuda";
  o.weights_out = dir + "/weights-" + mode + "-" + precision + ".safetensors";
  o.on_step = [&run](const v1::StepReport& r) { run.steps.push_back(r); };
  o.on_info = [&run](absl::string_view l) { run.info.emplace_back(l); };
  run.status = RunTrainer(o);
  std::ifstream in(o.weights_out, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  run.weights = bytes.str();
  return run;
}

TEST(GpuStepGraphTrainerTest, GraphRunMatchesEagerRunBitForBit) {
  if (!Gpu(true)) GTEST_SKIP() << "no usable CUDA device";
  TempDir dir("step-graph-gpu-test");
  const TrainerRun eager = Train("off", dir.path());
  ASSERT_TRUE(eager.status.ok()) << eager.status;
  const TrainerRun graph = Train("on", dir.path());
  ASSERT_TRUE(graph.status.ok()) << graph.status;
  ASSERT_EQ(eager.steps.size(), 10u);
  ASSERT_EQ(graph.steps.size(), 10u);
  EXPECT_THAT(eager.info, Contains("cuda graph: off (training.cuda_graph is off)"));
  EXPECT_THAT(graph.info, Contains(HasSubstr("cuda graph: captured the training step at step 3")));
  for (size_t i = 0; i < 10; ++i) {
    const v1::StepReport &e = eager.steps[i], &g = graph.steps[i];
    EXPECT_FALSE(e.cuda_graph());
    EXPECT_EQ(g.cuda_graph(), i >= 2) << "step " << g.step();
    EXPECT_EQ(g.lr(), e.lr()) << "step " << g.step();
    EXPECT_EQ(g.loss(), e.loss()) << "step " << g.step();
    EXPECT_EQ(g.grad_norm(), e.grad_norm()) << "step " << g.step();
    if (i > 0) {
      EXPECT_NE(g.lr(), graph.steps[i - 1].lr()) << "the schedule must move";
    }
  }
  ASSERT_FALSE(eager.weights.empty());
  EXPECT_TRUE(eager.weights == graph.weights) << "final weights differ";
}

TEST(GpuStepGraphTrainerTest, Fp8GraphRunMatchesEagerRunBitForBit) {
  if (!Fp8Gpu()) GTEST_SKIP() << "no CUDA device with FP8 (compute capability 8.9+)";
  TempDir dir("step-graph-gpu-fp8-test");
  const TrainerRun eager = Train("off", dir.path(), "fp8");
  ASSERT_TRUE(eager.status.ok()) << eager.status;
  const TrainerRun graph = Train("on", dir.path(), "fp8");
  ASSERT_TRUE(graph.status.ok()) << graph.status;
  ASSERT_EQ(eager.steps.size(), 10u);
  ASSERT_EQ(graph.steps.size(), 10u);
  EXPECT_THAT(graph.info, Contains(HasSubstr("cuda graph: captured the training step at step 3")));
  for (size_t i = 0; i < 10; ++i) {
    const v1::StepReport &e = eager.steps[i], &g = graph.steps[i];
    EXPECT_EQ(g.cuda_graph(), i >= 2) << "step " << g.step();
    EXPECT_EQ(g.loss(), e.loss()) << "step " << g.step();
    EXPECT_EQ(g.grad_norm(), e.grad_norm()) << "step " << g.step();
    EXPECT_EQ(g.skipped_steps(), e.skipped_steps()) << "step " << g.step();
    ASSERT_EQ(g.fp8_size(), e.fp8_size()) << "step " << g.step();
    ASSERT_GT(g.fp8_size(), 0);
    for (int t = 0; t < g.fp8_size(); ++t) {
      EXPECT_EQ(g.fp8(t).SerializeAsString(), e.fp8(t).SerializeAsString())
          << "step " << g.step() << " tensor " << t << ": " << g.fp8(t).ShortDebugString() << " vs "
          << e.fp8(t).ShortDebugString();
    }
  }
  ASSERT_FALSE(eager.weights.empty());
  EXPECT_TRUE(eager.weights == graph.weights) << "final weights differ";
}

}  // namespace
}  // namespace boulder::engine
