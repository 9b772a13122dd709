// StepGraph without a GPU: the cpu backend's fallback and the mode checks, and the replay
// logic itself over RecordingBackend, a cpu backend that records ops between BeginCapture and
// EndCapture as a CUDA graph does (pointers and host-side arguments baked in, host copies and
// syncs forbidden) and replays them. Eager and replayed runs must then agree bit for bit: a
// per-step value baked into the recording (the learning rate, the AdamW step) would show.
#include "worker/engine/step_graph.h"

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "worker/engine/fp8_state.h"
#include "worker/engine/step_graph_testing.h"
#include "worker/engine/trainer.h"

namespace boulder::engine {
namespace {

using ::testing::Contains;
using testing::FirstBitDifference;
using ::testing::HasSubstr;
using testing::StepRun;
using testing::TrainSteps;

class RecordingBackend final : public kernels::Backend {
 public:
  RecordingBackend() : be_(kernels::NewCpuBackend(1)) {}

  class Recorded final : public Graph {
   public:
    explicit Recorded(std::vector<std::function<void()>> ops) : ops_(std::move(ops)) {}
    int64_t num_nodes() const override { return static_cast<int64_t>(ops_.size()); }
    void Run() const {
      for (const auto& op : ops_) op();
    }

   private:
    std::vector<std::function<void()>> ops_;
  };

  // Every EndCapture() after a BeginCapture() fails (a capture the device would reject).
  void set_fail_captures(bool on) { fail_captures_ = on; }
  int captures() const { return captures_; }
  int replays() const { return replays_; }
  // Operations recorded so far by the capture in progress.
  size_t recorded_ops() const { return ops_.size(); }

  absl::Status BeginCapture() override {
    if (capturing_) return absl::FailedPreconditionError("already capturing");
    capturing_ = true;
    forbidden_.clear();
    ops_.clear();
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Graph>> EndCapture() override {
    capturing_ = false;
    if (!forbidden_.empty())
      return absl::InternalError(absl::StrCat(forbidden_, " while capturing"));
    if (fail_captures_ && !ops_.empty()) return absl::InternalError("injected capture failure");
    ++captures_;
    return std::make_unique<Recorded>(std::move(ops_));
  }
  void Replay(const Graph& graph) override {
    ++replays_;
    dynamic_cast<const Recorded&>(graph).Run();
  }

  std::string name() const override { return "recording-cpu"; }
  kernels::DType compute_dtype() const override { return be_->compute_dtype(); }
  kernels::DType state_dtype() const override { return be_->state_dtype(); }
  MasterLayout master_layout() const override { return be_->master_layout(); }
  absl::StatusOr<void*> Alloc(size_t bytes) override {
    Forbid("Alloc");
    return be_->Alloc(bytes);
  }
  void Free(void* ptr) override {
    Forbid("Free");
    be_->Free(ptr);
  }
  void CopyFromHostF32(void* dst, kernels::DType dtype, const float* src, size_t n) override {
    Forbid("CopyFromHostF32");
    be_->CopyFromHostF32(dst, dtype, src, n);
  }
  void CopyToHostF32(float* dst, const void* src, kernels::DType dtype, size_t n) override {
    Forbid("CopyToHostF32");
    be_->CopyToHostF32(dst, src, dtype, n);
  }
  void CopyFromHost(void* dst, const void* src, size_t bytes) override {
    Forbid("CopyFromHost");
    be_->CopyFromHost(dst, src, bytes);
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    Forbid("CopyToHost");
    be_->CopyToHost(dst, src, bytes);
  }
  absl::Status Synchronize() override {
    Forbid("Synchronize");
    return be_->Synchronize();
  }
  kernels::MemoryStats GetMemoryStats() const override { return be_->GetMemoryStats(); }

  // Every op: recorded while capturing, else run.
  void Memset0(void* p, size_t bytes) override {
    Op([=] { be_->Memset0(p, bytes); });
  }
  void EncoderForward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B,
                      int T, int C) override {
    Op([=] { be_->EncoderForward(out, tokens, wte, wpe, B, T, C); });
  }
  void EncoderBackward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B,
                       int T, int C) override {
    Op([=] { be_->EncoderBackward(dwte, dwpe, dout, tokens, B, T, C); });
  }
  void LayerNormForward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                        const void* bias, int N, int C) override {
    Op([=] { be_->LayerNormForward(out, mean, rstd, inp, weight, bias, N, C); });
  }
  void LayerNormBackward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                         const void* weight, const float* mean, const float* rstd, int N,
                         int C) override {
    Op([=] { be_->LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C); });
  }
  void MatmulForward(void* out, void* pre_gelu, const void* inp, const void* weight,
                     const void* bias, int N, int C, int OC, kernels::Epilogue e) override {
    Op([=] { be_->MatmulForward(out, pre_gelu, inp, weight, bias, N, C, OC, e); });
  }
  void MatmulBackward(void* dinp, void* dweight, void* dbias, void* dout, const void* pre_gelu,
                      const void* inp, const void* weight, int N, int C, int OC) override {
    Op([=] { be_->MatmulBackward(dinp, dweight, dbias, dout, pre_gelu, inp, weight, N, C, OC); });
  }
  void SetWeightGradientOverwrite(bool on) override {
    Op([=] { be_->SetWeightGradientOverwrite(on); });
  }
  void AttentionForward(void* out, float* stats, const void* qkv, int B, int T, int C,
                        int NH) override {
    Op([=] { be_->AttentionForward(out, stats, qkv, B, T, C, NH); });
  }
  void AttentionBackward(void* dqkv, const void* dout, const void* qkv, const void* out,
                         const float* stats, int B, int T, int C, int NH) override {
    Op([=] { be_->AttentionBackward(dqkv, dout, qkv, out, stats, B, T, C, NH); });
  }
  void ResidualForward(void* out, const void* a, const void* b, size_t n) override {
    Op([=] { be_->ResidualForward(out, a, b, n); });
  }
  void SoftmaxCrossEntropy(float* losses, void* logits, const int32_t* targets, int N, int V,
                           int Vp, float dloss) override {
    Op([=] { be_->SoftmaxCrossEntropy(losses, logits, targets, N, V, Vp, dloss); });
  }
  void NormSquared(float* out, const void* x, size_t n) override {
    Op([=] { be_->NormSquared(out, x, n); });
  }
  void NormSquaredBeside(float* out, const void* x, size_t n, bool accumulate) override {
    Op([=] { be_->NormSquaredBeside(out, x, n, accumulate); });
  }
  void JoinNormSquared() override {
    Op([=] { be_->JoinNormSquared(); });
  }
  void AdamW(void* params, void* master, const void* grads, void* m, void* v,
             kernels::DecayBits decay, size_t n, float lr, float beta1, float beta2, float eps,
             float weight_decay, int t, float grad_scale, const float* norm_sq,
             float max_norm) override {
    Op([=] {
      be_->AdamW(params, master, grads, m, v, decay, n, lr, beta1, beta2, eps, weight_decay, t,
                 grad_scale, norm_sq, max_norm);
    });
  }
  void SetAdamWStep(float* step, float lr, int t, float beta1, float beta2,
                    bool skip_non_finite) override {
    Op([=] { be_->SetAdamWStep(step, lr, t, beta1, beta2, skip_non_finite); });
  }
  void AdamWDeviceStep(void* params, void* master, const void* grads, void* m, void* v,
                       kernels::DecayBits decay, size_t n, const float* step, float beta1,
                       float beta2, float eps, float weight_decay, float grad_scale,
                       const float* norm_sq, float max_norm) override {
    Op([=] {
      be_->AdamWDeviceStep(params, master, grads, m, v, decay, n, step, beta1, beta2, eps,
                           weight_decay, grad_scale, norm_sq, max_norm);
    });
  }
  void Argmax(int32_t* out, const void* logits, int N, int V, int Vp) override {
    Op([=] { be_->Argmax(out, logits, N, V, Vp); });
  }
  absl::Status Fp8Supported() const override { return be_->Fp8Supported(); }
  void CastFp8(uint8_t* out, uint8_t* out_t, const void* inp, int rows, int cols,
               kernels::Fp8Format format, const float* scale, float* amax,
               uint64_t* counts) override {
    Op([=] { be_->CastFp8(out, out_t, inp, rows, cols, format, scale, amax, counts); });
  }
  void TransposeFp8(uint8_t* out, const uint8_t* in, int rows, int cols) override {
    Op([=] { be_->TransposeFp8(out, in, rows, cols); });
  }
  void LayerNormFp8FromStats(uint8_t* fp8_out, uint8_t* fp8_out_t, void* scratch, const void* inp,
                             const float* mean, const float* rstd, const void* weight,
                             const void* bias, int N, int C, kernels::Fp8Format format,
                             const float* scale, float* amax, uint64_t* counts) override {
    Op([=] {
      be_->LayerNormFp8FromStats(fp8_out, fp8_out_t, scratch, inp, mean, rstd, weight, bias, N, C,
                                 format, scale, amax, counts);
    });
  }
  void MatmulFp8(void* out, const uint8_t* a, kernels::Fp8Format a_format, const float* a_scale_inv,
                 const uint8_t* b, kernels::Fp8Format b_format, const float* b_scale_inv,
                 const void* bias, int M, int N, int K, bool accumulate, bool fast_accum) override {
    Op([=] {
      be_->MatmulFp8(out, a, a_format, a_scale_inv, b, b_format, b_scale_inv, bias, M, N, K,
                     accumulate, fast_accum);
    });
  }
  void GeluForward(void* out, const void* inp, size_t n) override {
    Op([=] { be_->GeluForward(out, inp, n); });
  }
  void GeluBackward(void* dout, const void* pre, size_t n) override {
    Op([=] { be_->GeluBackward(dout, pre, n); });
  }
  void BiasBackward(void* dbias, const void* dout, int N, int OC) override {
    Op([=] { be_->BiasBackward(dbias, dout, N, OC); });
  }
  void Fp8ScaleUpdate(float* scale, float* scale_inv, int scale_inv_stride, float* history,
                      float* amax, const float* fp8_max, int n, int history_len,
                      bool use_history_max, int margin, const float* skip_if_non_finite) override {
    Op([=] {
      be_->Fp8ScaleUpdate(scale, scale_inv, scale_inv_stride, history, amax, fp8_max, n,
                          history_len, use_history_max, margin, skip_if_non_finite);
    });
  }

 private:
  void Forbid(const char* what) {
    if (capturing_ && forbidden_.empty()) forbidden_ = what;
  }
  void Op(std::function<void()> op) {
    if (capturing_) {
      ops_.push_back(std::move(op));
    } else {
      op();
    }
  }

  std::unique_ptr<kernels::Backend> be_;
  bool capturing_ = false;
  std::string forbidden_;  // the first forbidden call of the current capture
  std::vector<std::function<void()>> ops_;
  bool fail_captures_ = false;
  int captures_ = 0;
  int replays_ = 0;
};

ModelOptions SmallOptions(int accum) {
  ModelOptions o;
  o.config.vocab_size = 23;
  o.config.padded_vocab_size = PaddedVocabSize(23);
  o.config.hidden = 16;
  o.config.heads = 2;
  o.config.layers = 2;
  o.config.ffn = 32;
  o.config.context = 12;
  o.batch_size = 3;
  o.seq_len = 12;
  o.grad_accum_steps = accum;
  o.adamw.weight_decay = 0.1f;
  o.adamw.grad_clip = 0.5f;  // low enough that clipping acts: the norm must reach AdamW
  o.seed = 11;
  return o;
}

class ReplayMatchesEagerTest : public ::testing::TestWithParam<int> {};

TEST_P(ReplayMatchesEagerTest, LossesNormsAndParametersBitIdentical) {
  const int accum = GetParam(), steps = 7;
  RecordingBackend eager_be, graph_be;
  absl::StatusOr<StepRun> eager = TrainSteps(&eager_be, SmallOptions(accum), "off", steps);
  ASSERT_TRUE(eager.ok()) << eager.status();
  absl::StatusOr<StepRun> graph = TrainSteps(&graph_be, SmallOptions(accum), "on", steps);
  ASSERT_TRUE(graph.ok()) << graph.status();

  EXPECT_EQ(eager_be.captures(), 0);
  // StepGraph::Create's empty probe, then one graph (accum 1) or the first micro-batch's (its
  // backward writes the weight gradients ZeroGrad deferred), the other micro-batches' and the
  // optimizer's.
  EXPECT_EQ(graph_be.captures(), accum == 1 ? 2 : 4);
  EXPECT_EQ(graph_be.replays(), (steps - 2) * (accum == 1 ? 1 : accum + 1));
  EXPECT_EQ(graph->graphed, std::vector<bool>({false, false, true, true, true, true, true}));
  EXPECT_THAT(graph->info, Contains(HasSubstr("captured the training step at step 3")));
  // The schedule changes the learning rate at every step (warmup, then cosine).
  for (int s = 1; s < steps; ++s) EXPECT_NE(graph->lrs[s], graph->lrs[s - 1]) << s;

  EXPECT_EQ(FirstBitDifference(eager->losses, graph->losses), -1)
      << ::testing::PrintToString(eager->losses) << " vs "
      << ::testing::PrintToString(graph->losses);
  EXPECT_EQ(FirstBitDifference(eager->norms, graph->norms), -1);
  ASSERT_EQ(eager->params.size(), graph->params.size());
  EXPECT_EQ(FirstBitDifference(eager->params, graph->params), -1);
  EXPECT_GT(graph->norms.back(), 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Accum, ReplayMatchesEagerTest, ::testing::Values(1, 3));

// FP8 (the cpu backend's emulation) replayed from graphs: the casts, the scale update and the
// host-side tallies of the recorded steps must give what the eager steps give, bit for bit:
// losses, norms, parameters and every tensor's statistics (scales, amaxes, histories, ratios).
ModelOptions Fp8Options(int accum) {
  ModelOptions o = SmallOptions(accum);
  o.fp8.enabled = true;
  return o;
}

void ExpectSameFp8Stats(const StepRun& eager, const StepRun& graph) {
  ASSERT_EQ(eager.fp8_stats.size(), graph.fp8_stats.size());
  for (size_t s = 0; s < eager.fp8_stats.size(); ++s) {
    ASSERT_EQ(eager.fp8_stats[s].size(), graph.fp8_stats[s].size());
    for (size_t i = 0; i < eager.fp8_stats[s].size(); ++i) {
      const Fp8TensorStat &a = eager.fp8_stats[s][i], &b = graph.fp8_stats[s][i];
      const std::string where = absl::StrCat("step ", s + 1, " tensor ", i);
      if (!eager.applied[s] && a.role == Fp8Role::kGradOutput) {
        // A skipped step: the eager loop stopped at the non-finite loss, the graph ran that
        // micro-batch's backward too (its gradient casts saw the NaNs). The scales are kept.
        EXPECT_EQ(a.scale, b.scale) << where;
        continue;
      }
      EXPECT_EQ(FirstBitDifference(std::vector<float>{a.scale, a.amax, a.amax_history_max},
                                   std::vector<float>{b.scale, b.amax, b.amax_history_max}),
                -1)
          << where << ": " << a.scale << " " << a.amax << " vs " << b.scale << " " << b.amax;
      EXPECT_EQ(a.elements, b.elements) << where;
      EXPECT_EQ(a.saturated_ratio, b.saturated_ratio) << where;
      EXPECT_EQ(a.underflow_ratio, b.underflow_ratio) << where;
      EXPECT_EQ(a.non_finite, b.non_finite) << where;
    }
  }
}

class Fp8ReplayTest : public ::testing::TestWithParam<int> {};

TEST_P(Fp8ReplayTest, MatchesEagerBitForBit) {
  const int accum = GetParam(), steps = 7;
  RecordingBackend eager_be, graph_be;
  absl::StatusOr<StepRun> eager = TrainSteps(&eager_be, Fp8Options(accum), "off", steps);
  ASSERT_TRUE(eager.ok()) << eager.status();
  absl::StatusOr<StepRun> graph = TrainSteps(&graph_be, Fp8Options(accum), "on", steps);
  ASSERT_TRUE(graph.ok()) << graph.status();
  // The probe, then one graph (accum 1) or first-micro-batch, micro-step and optimizer graphs.
  EXPECT_EQ(graph_be.captures(), accum == 1 ? 2 : 4);
  EXPECT_EQ(graph_be.replays(), (steps - 2) * (accum == 1 ? 1 : accum + 1));
  EXPECT_EQ(graph->graphed, std::vector<bool>({false, false, true, true, true, true, true}));
  EXPECT_EQ(graph->applied, std::vector<bool>(steps, true));
  EXPECT_EQ(FirstBitDifference(eager->losses, graph->losses), -1)
      << ::testing::PrintToString(eager->losses) << " vs "
      << ::testing::PrintToString(graph->losses);
  EXPECT_EQ(FirstBitDifference(eager->norms, graph->norms), -1);
  EXPECT_EQ(FirstBitDifference(eager->params, graph->params), -1);
  ExpectSameFp8Stats(*eager, *graph);
  // The scales moved away from 1 (the update ran in the graphs) and the weights were cast once
  // per step: the weight tallies of a replayed step are those of one cast.
  const Fp8TensorStat& w = graph->fp8_stats.back()[1];  // layer 0 qkv weight
  ASSERT_EQ(w.role, Fp8Role::kWeight);
  EXPECT_EQ(w.elements, 16 * 48);
  EXPECT_NE(graph->fp8_stats.back()[0].scale, 1.0f);
  const Fp8TensorStat& in = graph->fp8_stats.back()[0];  // layer 0 qkv input: every micro-batch
  EXPECT_EQ(in.elements, int64_t{accum} * 3 * 12 * 16);
}

INSTANTIATE_TEST_SUITE_P(Accum, Fp8ReplayTest, ::testing::Values(1, 3));

class Fp8SkipReplayTest : public ::testing::TestWithParam<int> {};

TEST_P(Fp8SkipReplayTest, NonFiniteReplayedStepIsSkippedAndTrainingGoesOn) {
  // Step 4 (replayed) sees a NaN in layer 0's fc1 weight: the device skips AdamW and the scale
  // update, the host discards the step's amaxes; the weight is put back after it and steps 5..7
  // train. Eager with the same poisoning gives the same numbers.
  const int accum = GetParam(), steps = 7, poisoned = 4;
  RecordingBackend eager_be, graph_be;
  absl::StatusOr<StepRun> eager = TrainSteps(
      &eager_be, Fp8Options(accum), "off", steps, [](int) { return -1.0; },
      testing::PoisonFc1WeightAt(&eager_be, poisoned, 0));
  ASSERT_TRUE(eager.ok()) << eager.status();
  absl::StatusOr<StepRun> graph = TrainSteps(
      &graph_be, Fp8Options(accum), "on", steps, [](int) { return -1.0; },
      testing::PoisonFc1WeightAt(&graph_be, poisoned, 0));
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE(graph->graphed[poisoned - 1]);
  const std::vector<bool> want = {true, true, true, false, true, true, true};
  EXPECT_EQ(eager->applied, want);
  EXPECT_EQ(graph->applied, want);
  EXPECT_FALSE(std::isfinite(graph->losses[poisoned - 1]));
  for (int s = poisoned; s < steps; ++s) EXPECT_TRUE(std::isfinite(graph->losses[s])) << s + 1;
  // Scales and histories kept over the skipped step.
  const std::vector<Fp8TensorStat>&before = graph->fp8_stats[poisoned - 2],
        &skipped = graph->fp8_stats[poisoned - 1];
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i].scale, skipped[i].scale) << i;
  EXPECT_EQ(Fp8State::FirstNonFinite(skipped), "layer 0 fc1 weight");
  // The next step's statistics are clean (the skipped step's amaxes were discarded).
  EXPECT_EQ(Fp8State::FirstNonFinite(graph->fp8_stats[poisoned]), "");
  EXPECT_EQ(FirstBitDifference(eager->losses, graph->losses), -1);
  EXPECT_EQ(FirstBitDifference(eager->params, graph->params), -1);
  ExpectSameFp8Stats(*eager, *graph);
  // Without the skip the parameters would differ: the skipped step changed nothing.
  RecordingBackend clean_be;
  absl::StatusOr<StepRun> clean = TrainSteps(&clean_be, Fp8Options(accum), "on", poisoned - 1);
  ASSERT_TRUE(clean.ok()) << clean.status();
  absl::StatusOr<StepRun> upto = TrainSteps(
      &graph_be, Fp8Options(accum), "on", poisoned, [](int) { return -1.0; },
      testing::PoisonFc1WeightAt(&graph_be, poisoned, 0));
  ASSERT_TRUE(upto.ok()) << upto.status();
  EXPECT_EQ(FirstBitDifference(clean->params, upto->params), -1);
}

INSTANTIATE_TEST_SUITE_P(Accum, Fp8SkipReplayTest, ::testing::Values(1, 3));

TEST(StepGraphTest, Fp8FailedCaptureRunsEagerlyLikeEager) {
  // A failed capture recorded weight casts that never ran: the eager steps after it must cast
  // the weights again (with accum 3 the failed first-micro-batch recording is the last one).
  for (int accum : {1, 3}) {
    RecordingBackend eager_be, auto_be;
    auto_be.set_fail_captures(true);
    absl::StatusOr<StepRun> eager = TrainSteps(&eager_be, Fp8Options(accum), "off", 5);
    ASSERT_TRUE(eager.ok()) << eager.status();
    absl::StatusOr<StepRun> fallback = TrainSteps(&auto_be, Fp8Options(accum), "auto", 5);
    ASSERT_TRUE(fallback.ok()) << fallback.status();
    EXPECT_EQ(fallback->graphed, std::vector<bool>(5, false));
    EXPECT_EQ(FirstBitDifference(eager->losses, fallback->losses), -1) << accum;
    EXPECT_EQ(FirstBitDifference(eager->params, fallback->params), -1) << accum;
    ExpectSameFp8Stats(*eager, *fallback);
  }
}

TEST(StepGraphTest, CpuBackendSkipFlags) {
  // The device-side skip of a replayed FP8 step, on the cpu backend: AdamWDeviceStep with
  // skip_non_finite and Fp8ScaleUpdate with a skip scalar change nothing when the norm is
  // inf or NaN, and update as usual when it is finite (or when the skip is off).
  std::unique_ptr<kernels::Backend> be = kernels::NewCpuBackend(1);
  const float inf = std::numeric_limits<float>::infinity();
  for (float norm_sq : {std::nanf(""), inf, 4.0f}) {
    for (bool skip : {true, false}) {
      std::vector<float> params = {1.0f, -2.0f}, grads = {0.5f, 0.25f}, m = {0, 0}, v = {0, 0};
      float step[kernels::Backend::kAdamWStepFloats];
      be->SetAdamWStep(step, 0.1f, 1, 0.9f, 0.95f, skip);
      be->AdamWDeviceStep(params.data(), nullptr, grads.data(), m.data(), v.data(),
                          kernels::DecayBits{}, 2, step, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, &norm_sq,
                          0.0f);
      const bool skipped = skip && !std::isfinite(norm_sq);
      EXPECT_EQ(params[0] == 1.0f && m[0] == 0.0f && v[0] == 0.0f, skipped)
          << "norm_sq " << norm_sq << " skip " << skip;
    }
    float scale = 2.0f, scale_inv = 0.5f, history[2] = {3.0f, 1.0f}, amax = 7.0f, max = 448.0f;
    be->Fp8ScaleUpdate(&scale, &scale_inv, 1, history, &amax, &max, 1, 2, true, 0, &norm_sq);
    if (std::isfinite(norm_sq)) {
      EXPECT_EQ(history[0], 7.0f);  // rolled in
      EXPECT_EQ(amax, 0.0f);
      EXPECT_EQ(scale, 448.0f / 7.0f);
    } else {
      EXPECT_EQ(scale, 2.0f) << norm_sq;
      EXPECT_EQ(scale_inv, 0.5f);
      EXPECT_EQ(history[0], 3.0f);
      EXPECT_EQ(history[1], 1.0f);
      EXPECT_EQ(amax, 7.0f);  // left for the caller to discard
    }
  }
}

TEST(StepGraphTest, ReplayedStepsUseEachStepsLearningRate) {
  // Steps 4 and 5 replay with lr 0, so the parameters stay exactly where step 3 left them. A
  // learning rate baked into the recording (step 3's) would move them.
  RecordingBackend a_be, b_be;
  absl::StatusOr<StepRun> three = TrainSteps(&a_be, SmallOptions(1), "on", 3);
  ASSERT_TRUE(three.ok()) << three.status();
  absl::StatusOr<StepRun> five =
      TrainSteps(&b_be, SmallOptions(1), "on", 5, [](int step) { return step >= 4 ? 0.0 : -1.0; });
  ASSERT_TRUE(five.ok()) << five.status();
  ASSERT_EQ(five->graphed, std::vector<bool>({false, false, true, true, true}));
  EXPECT_EQ(FirstBitDifference(three->params, five->params), -1);
  // The zero-lr steps did run: their losses are those of step 3's weights on new batches.
  EXPECT_GT(five->losses[4], 0.0);
  EXPECT_GT(five->norms[4], 0.0f);
}

// A recorded first backward writes the weight gradients that ZeroGrad() leaves to it (with '=');
// replayed without a ZeroGrad() before it, it would silently drop the gradients the step was
// meant to add to, so Run refuses, naming the step, and the eager path is untouched.
class ReplayWithoutZeroGradTest : public ::testing::TestWithParam<int> {};

TEST_P(ReplayWithoutZeroGradTest, IsRefusedNamingTheStep) {
  const int accum = GetParam();
  RecordingBackend be;
  const ModelOptions options = SmallOptions(accum);
  absl::StatusOr<std::unique_ptr<Model>> made = Model::Create(&be, options);
  ASSERT_TRUE(made.ok()) << made.status();
  Model& model = **made;
  ASSERT_TRUE(model.defers_zero_grad());
  StepGraphOptions go;
  go.mode = "on";
  go.grad_accum_steps = accum;
  absl::StatusOr<std::unique_ptr<StepGraph>> graph = StepGraph::Create(&be, &model, go);
  ASSERT_TRUE(graph.ok()) << graph.status();
  const ArithmeticData data(options.config.vocab_size, 6, 7);
  const int B = options.batch_size, T = options.seq_len;
  for (int step = 1; step <= 4; ++step) {
    auto batch = [&](int micro) { return data.Get(0, step, micro, B, T); };
    if (step != 4) model.ZeroGrad();
    absl::StatusOr<std::optional<StepGraph::Result>> r = (*graph)->Run(step, 1e-3f, step, batch);
    if (step == 4) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
      EXPECT_THAT(r.status().message(),
                  HasSubstr("step 4: the recorded step writes the weight gradients that "
                            "Model::ZeroGrad() leaves to it, and no ZeroGrad() came before it"));
      break;
    }
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->has_value(), step == 3) << step;
    if (r->has_value()) continue;
    for (int micro = 0; micro < accum; ++micro) {
      const Batch b = batch(micro);
      ASSERT_TRUE(model.Forward(b.inputs, b.targets).ok());
      ASSERT_TRUE(model.Backward().ok());
    }
    ASSERT_TRUE(model.OptimizerStep(1e-3f, step).ok());
  }
  EXPECT_EQ(be.captures(), accum == 1 ? 2 : 4);
}

INSTANTIATE_TEST_SUITE_P(Accum, ReplayWithoutZeroGradTest, ::testing::Values(1, 3));

TEST(StepGraphTest, RecordingRejectsHostCopies) {
  // The recording backend fails a capture that copies to or from the host, as CUDA's
  // thread-local capture does: the eager Forward() cannot be recorded.
  RecordingBackend be;
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Create(&be, SmallOptions(1));
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(be.BeginCapture().ok());
  std::vector<int32_t> ids(3 * 12, 1);
  (void)(*model)->Forward(ids, ids);
  absl::StatusOr<std::unique_ptr<kernels::Backend::Graph>> g = be.EndCapture();
  EXPECT_THAT(g.status().message(), HasSubstr("CopyFromHost while capturing"));
}

TEST(StepGraphTest, FailedCaptureRunsEagerlyInAutoAndFailsInOn) {
  RecordingBackend eager_be, auto_be, on_be;
  auto_be.set_fail_captures(true);
  on_be.set_fail_captures(true);
  absl::StatusOr<StepRun> eager = TrainSteps(&eager_be, SmallOptions(1), "off", 4);
  ASSERT_TRUE(eager.ok()) << eager.status();
  absl::StatusOr<StepRun> fallback = TrainSteps(&auto_be, SmallOptions(1), "auto", 4);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_EQ(fallback->graphed, std::vector<bool>(4, false));
  EXPECT_THAT(fallback->info,
              Contains("cuda graph: off from step 3 (capturing the step failed: injected capture "
                       "failure); steps run eagerly"));
  EXPECT_EQ(FirstBitDifference(eager->params, fallback->params), -1);
  absl::StatusOr<StepRun> on = TrainSteps(&on_be, SmallOptions(1), "on", 4);
  EXPECT_EQ(on.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(on.status().message(),
              HasSubstr("step 3: training.cuda_graph: on, but capturing the step failed: "
                        "injected capture failure"));
}

TEST(StepGraphTest, CpuBackendRunsEagerlyInAutoAndRefusesOn) {
  std::unique_ptr<kernels::Backend> be = kernels::NewCpuBackend(1);
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Create(be.get(), SmallOptions(1));
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::string> info;
  StepGraphOptions o;
  o.on_info = [&info](absl::string_view l) { info.emplace_back(l); };
  for (const char* mode : {"auto", ""}) {
    o.mode = mode;
    absl::StatusOr<std::unique_ptr<StepGraph>> g = StepGraph::Create(be.get(), model->get(), o);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_FALSE((*g)->enabled());
    EXPECT_EQ((*g)->reason(), "the cpu backend cannot capture graphs");
    for (int i = 0; i < 4; ++i) {
      absl::StatusOr<std::optional<StepGraph::Result>> r =
          (*g)->Run(i + 1, 1e-3f, i + 1, [](int) { return Batch(); });
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_FALSE(r->has_value());
    }
  }
  EXPECT_THAT(info, Contains("cuda graph: off (the cpu backend cannot capture graphs)"));
  o.mode = "on";
  absl::StatusOr<std::unique_ptr<StepGraph>> on = StepGraph::Create(be.get(), model->get(), o);
  EXPECT_EQ(on.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(on.status().message(),
              HasSubstr("training.cuda_graph: on, but the step cannot run as a CUDA graph: the "
                        "cpu backend cannot capture graphs"));
}

// Data parallelism's collectives as StepGraph drives them: a log of the calls, each with the
// number of operations the capture in progress had recorded by then (the fake reduces nothing:
// one rank's arithmetic is the plain run's).
class FakeCollectives final : public StepCollectives {
 public:
  explicit FakeCollectives(const RecordingBackend* be) : be_(be) {}
  std::string blocker;      // CaptureBlocker()
  bool others_recorded = true;  // what the other ranks answer in AllRanksTrue
  absl::Status wait_error;  // WaitForReplay()'s answer
  std::vector<std::pair<std::string, size_t>> log;

  std::string CaptureBlocker() const override { return blocker; }
  void ReduceDuringBackward() override { Log("reduce"); }
  absl::Status JoinGradientsOnDevice() override {
    Log("join");
    return absl::OkStatus();
  }
  absl::Status ReduceFp8AmaxesOnDevice(Fp8State*) override {
    Log("amax");
    return absl::OkStatus();
  }
  absl::StatusOr<bool> AllRanksTrue(bool recorded) override {
    Log(recorded ? "agree(true)" : "agree(false)");
    return recorded && others_recorded;
  }
  absl::Status WaitForReplay() override {
    Log("wait");
    return wait_error;
  }

 private:
  void Log(const std::string& what) { log.emplace_back(what, be_ ? be_->recorded_ops() : 0); }
  const RecordingBackend* be_;
};

std::vector<std::string> Names(const FakeCollectives& c) {
  std::vector<std::string> out;
  for (const auto& [name, ops] : c.log) out.push_back(name);
  return out;
}

// The recorded data-parallel step: the all-reduces issued during the (last micro-batch's)
// backward and joined before the optimizer, FP8's amax reduction before the scale update, one
// agreement after recording, a bounded wait after every replay; the arithmetic is the plain
// replay's.
class DataParallelReplayTest : public ::testing::TestWithParam<int> {};

TEST_P(DataParallelReplayTest, StepIsRecordedWithItsCollectives) {
  const int accum = GetParam();
  for (const bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8" : "bf16");
    const int steps = 6;
    const ModelOptions options = fp8 ? Fp8Options(accum) : SmallOptions(accum);
    RecordingBackend plain_be, dp_be;
    absl::StatusOr<StepRun> plain = TrainSteps(&plain_be, options, "on", steps);
    ASSERT_TRUE(plain.ok()) << plain.status();
    FakeCollectives dp(&dp_be);
    absl::StatusOr<StepRun> run =
        TrainSteps(&dp_be, options, "on", steps, [](int) { return -1.0; }, nullptr, &dp);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->graphed, plain->graphed);
    EXPECT_EQ(FirstBitDifference(plain->losses, run->losses), -1);
    EXPECT_EQ(FirstBitDifference(plain->params, run->params), -1);
    if (fp8) ExpectSameFp8Stats(*plain, *run);
    std::vector<std::string> want = {"reduce", "join"};
    if (fp8) want.push_back("amax");
    want.push_back("agree(true)");
    // A wait after every replay: the step's graph, or each micro-batch's and the optimizer's.
    const int replays_per_step = accum == 1 ? 1 : accum + 1;
    for (int i = 0; i < (steps - 2) * replays_per_step; ++i) want.push_back("wait");
    EXPECT_EQ(Names(dp), want);
    EXPECT_EQ(dp_be.replays(), (steps - 2) * replays_per_step);
    // While recording: the reduce after the forward's ops, the join after the backward's, and
    // FP8's amax reduction after the optimizer's (in its own recording when accum > 1).
    ASSERT_GE(dp.log.size(), 3u);
    EXPECT_GT(dp.log[0].second, 0u);
    EXPECT_GT(dp.log[1].second, dp.log[0].second);
    if (fp8 && accum == 1) {
      EXPECT_GT(dp.log[2].second, dp.log[1].second);
    }
    if (fp8 && accum > 1) {
      EXPECT_GT(dp.log[2].second, 0u);
    }
    if (accum > 1) {
      EXPECT_THAT(run->info, Contains(HasSubstr("last-micro-batch graph")));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Accum, DataParallelReplayTest, ::testing::Values(1, 3));

// An FP8 step that goes non-finite at its first micro-batch: without data parallelism the
// replay stops there; with it every micro-batch and the optimizer graph still replay (the other
// ranks' all-reduces wait for this rank's) and the device skips the update. The same numbers.
TEST(StepGraphTest, DataParallelNonFiniteFp8StepReplaysEveryMicroBatchThenSkips) {
  const int accum = 3, steps = 7, poisoned = 4;
  RecordingBackend plain_be, dp_be;
  absl::StatusOr<StepRun> plain =
      TrainSteps(&plain_be, Fp8Options(accum), "on", steps, [](int) { return -1.0; },
                 testing::PoisonFc1WeightAt(&plain_be, poisoned, 0));
  ASSERT_TRUE(plain.ok()) << plain.status();
  FakeCollectives dp(&dp_be);
  absl::StatusOr<StepRun> run =
      TrainSteps(&dp_be, Fp8Options(accum), "on", steps, [](int) { return -1.0; },
                 testing::PoisonFc1WeightAt(&dp_be, poisoned, 0), &dp);
  ASSERT_TRUE(run.ok()) << run.status();
  const std::vector<bool> want = {true, true, true, false, true, true, true};
  EXPECT_EQ(plain->applied, want);
  EXPECT_EQ(run->applied, want);
  EXPECT_EQ(FirstBitDifference(plain->losses, run->losses), -1);
  EXPECT_EQ(FirstBitDifference(plain->params, run->params), -1);
  EXPECT_EQ(plain_be.replays(), (steps - 3) * (accum + 1) + 1);
  EXPECT_EQ(dp_be.replays(), (steps - 2) * (accum + 1));
}

TEST(StepGraphTest, DataParallelCaptureFailsOnEveryRankWhenOneFails) {
  RecordingBackend be;
  FakeCollectives dp(&be);
  dp.others_recorded = false;
  absl::StatusOr<StepRun> run =
      TrainSteps(&be, SmallOptions(1), "on", 4, [](int) { return -1.0; }, nullptr, &dp);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInternal) << run.status();
  EXPECT_THAT(run.status().message(), HasSubstr("step 3: capturing the data-parallel step"));
  EXPECT_THAT(run.status().message(), HasSubstr("failed on another rank"));
  EXPECT_THAT(run.status().message(), HasSubstr("training.cuda_graph: off"));

  // This rank's own capture fails: the others hear of it before replaying.
  RecordingBackend failing;
  failing.set_fail_captures(true);
  FakeCollectives dp2(&failing);
  run = TrainSteps(&failing, SmallOptions(1), "on", 4, [](int) { return -1.0; }, nullptr, &dp2);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInternal) << run.status();
  EXPECT_THAT(run.status().message(), HasSubstr("failed on this rank: injected capture failure"));
  EXPECT_THAT(Names(dp2), Contains("agree(false)"));
}

TEST(StepGraphTest, DataParallelReplayReturnsTheWaitsError) {
  RecordingBackend be;
  FakeCollectives dp(&be);
  dp.wait_error = absl::UnavailableError("rank 1 is dead or hung");
  absl::StatusOr<StepRun> run =
      TrainSteps(&be, SmallOptions(1), "on", 4, [](int) { return -1.0; }, nullptr, &dp);
  EXPECT_EQ(run.status(), dp.wait_error);
}

TEST(StepGraphTest, ModesAndConditions) {
  RecordingBackend be;
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Create(&be, SmallOptions(1));
  ASSERT_TRUE(model.ok()) << model.status();
  StepGraphOptions o;
  o.mode = "sometimes";
  EXPECT_EQ(
      StepGraph::Create(&be, model->get(), o).status(),
      absl::InvalidArgumentError("training.cuda_graph: unknown 'sometimes' (auto, on or off)"));
  o.mode = "off";
  absl::StatusOr<std::unique_ptr<StepGraph>> off = StepGraph::Create(&be, model->get(), o);
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE((*off)->enabled());
  o.mode = "auto";
  absl::StatusOr<std::unique_ptr<StepGraph>> on_recording = StepGraph::Create(&be, model->get(), o);
  ASSERT_TRUE(on_recording.ok());
  EXPECT_TRUE((*on_recording)->enabled());
  FakeCollectives gloo(nullptr);
  gloo.blocker = "the gloo communicator's collectives run on the host";
  FakeCollectives nccl(nullptr);
  struct Condition {
    std::function<void(StepGraphOptions*)> set;
    const char* reason;
  };
  for (const Condition& c : {
           Condition{[](StepGraphOptions* w) { w->profiling = true; }, "per-kernel profiling"},
           Condition{[&gloo](StepGraphOptions* w) { w->collectives = &gloo; },
                     "data parallelism: the gloo communicator's collectives run on the host"}}) {
    StepGraphOptions with = o;
    c.set(&with);
    with.mode = "auto";
    absl::StatusOr<std::unique_ptr<StepGraph>> g = StepGraph::Create(&be, model->get(), with);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_FALSE((*g)->enabled());
    EXPECT_THAT((*g)->reason(), HasSubstr(c.reason));
    with.mode = "on";
    g = StepGraph::Create(&be, model->get(), with);
    EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(g.status().message(), HasSubstr(c.reason));
  }
  // Data parallelism with collectives a graph can hold: recorded in mode "on" only.
  StepGraphOptions with = o;
  with.collectives = &nccl;
  with.mode = "auto";
  absl::StatusOr<std::unique_ptr<StepGraph>> g = StepGraph::Create(&be, model->get(), with);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_FALSE((*g)->enabled());
  EXPECT_THAT((*g)->reason(), HasSubstr("opt-in (training.cuda_graph: on)"));
  with.mode = "on";
  g = StepGraph::Create(&be, model->get(), with);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE((*g)->enabled());
}

// The trainer on the cpu backend: auto trains eagerly and says so, on is refused up front.
v1::JobSpec CpuSpec(const std::string& mode) {
  v1::JobSpec s;
  s.set_name("graph-cpu");
  v1::ModelSpec* m = s.mutable_model();
  m->set_vocab_size(96);
  m->set_hidden(32);
  m->set_heads(2);
  m->set_layers(1);
  m->set_ffn(64);
  m->set_context(16);
  s.mutable_data()->set_source("arithmetic");
  s.mutable_data()->set_max_stride(6);
  v1::TrainingSpec* t = s.mutable_training();
  t->set_steps(4);
  t->set_batch_size(2);
  t->set_seq_len(16);
  t->set_lr(1e-3);
  t->set_beta1(0.9);
  t->set_beta2(0.95);
  t->set_eps(1e-8);
  t->set_schedule("constant");
  t->set_grad_accum_steps(1);
  t->set_grad_clip(1.0);
  t->set_seed(1);
  t->set_log_every_steps(1);
  t->set_cuda_graph(mode);
  s.set_precision("fp32");
  s.mutable_resources()->set_workers(1);
  s.mutable_resources()->set_backend("cpu");
  s.mutable_generation()->set_prompt_len(4);
  s.mutable_generation()->set_tokens(0);
  return s;
}

TEST(StepGraphTrainerTest, CpuAutoTrainsEagerlyAndSaysSo) {
  TrainerOptions o;
  o.spec = CpuSpec("auto");
  o.threads = 1;
  std::vector<v1::StepReport> steps;
  std::vector<std::string> info;
  o.on_step = [&steps](const v1::StepReport& r) { steps.push_back(r); };
  o.on_info = [&info](absl::string_view l) { info.emplace_back(l); };
  ASSERT_TRUE(RunTrainer(o).ok());
  ASSERT_EQ(steps.size(), 4u);
  for (const v1::StepReport& r : steps) EXPECT_FALSE(r.cuda_graph()) << r.step();
  EXPECT_THAT(info, Contains("cuda graph: off (the cpu backend cannot capture graphs)"));
}

TEST(StepGraphTrainerTest, CpuOnAndUnknownModeAreRefused) {
  TrainerOptions o;
  o.spec = CpuSpec("on");
  o.threads = 1;
  absl::Status on = RunTrainer(o);
  EXPECT_EQ(on.code(), absl::StatusCode::kFailedPrecondition) << on;
  EXPECT_THAT(on.message(), HasSubstr("training.cuda_graph: on"));
  o.spec = CpuSpec("maybe");
  absl::Status bad = RunTrainer(o);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_THAT(bad.message(), HasSubstr("training.cuda_graph: unknown 'maybe'"));
}

}  // namespace
}  // namespace boulder::engine
