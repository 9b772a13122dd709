// Test helper for step_graph_test.cc and step_graph_gpu_test.cc: trains a model for a few
// steps as the trainer's loop does (StepGraph first, the eager micro-batch loop when it
// declines), with a warmup + cosine learning-rate schedule, and returns what a comparison of
// eager and graph runs needs. FP8 models (options.fp8.enabled) run the trainer's skip logic:
// a step with a non-finite loss or gradient norm is skipped (Fp8EndStep(apply=false)), the
// AdamW step t counts applied steps only.
#ifndef BOULDER_WORKER_ENGINE_STEP_GRAPH_TESTING_H_
#define BOULDER_WORKER_ENGINE_STEP_GRAPH_TESTING_H_

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "worker/engine/data.h"
#include "worker/engine/model.h"
#include "worker/engine/schedule.h"
#include "worker/engine/step_graph.h"

namespace boulder::engine::testing {

struct StepRun {
  std::vector<double> losses;     // per step
  std::vector<float> norms;       // per step
  std::vector<double> lrs;        // per step
  std::vector<bool> graphed;      // per step: replayed from graphs
  std::vector<bool> applied;      // per step: false when skipped (FP8)
  std::vector<float> params;      // after the last step
  std::vector<std::string> info;  // StepGraph's log lines
  // FP8: per step, every tensor's statistics at the end of the step (read every step).
  std::vector<std::vector<Fp8TensorStat>> fp8_stats;
};

// Called before (before = true) and after each step; an error ends the run.
using StepHook = std::function<absl::Status(int step, bool before, Model& model)>;

// The schedule of these runs: warmup over the first 2 steps, then cosine to 10% of 1e-2 at
// step 8 (a different learning rate at every step up to there).
inline ScheduleConfig TestSchedule() {
  ScheduleConfig s;
  s.kind = ScheduleKind::kCosine;
  s.lr = 1e-2;
  s.warmup_steps = 2;
  s.total_steps = 8;
  s.min_lr_ratio = 0.1;
  return s;
}

// `steps` optimizer steps of a model made from `options` on `backend`, training.cuda_graph
// `mode`. lr_override(step) >= 0 replaces the schedule's learning rate at that step.
template <typename LrOverride>
absl::StatusOr<StepRun> TrainSteps(kernels::Backend* backend, const ModelOptions& options,
                                   const std::string& mode, int steps, LrOverride lr_override,
                                   const StepHook& hook = nullptr,
                                   StepCollectives* collectives = nullptr) {
  absl::StatusOr<std::unique_ptr<Model>> made = Model::Create(backend, options);
  if (!made.ok()) return made.status();
  Model& model = **made;
  StepRun run;
  StepGraphOptions go;
  go.mode = mode;
  go.grad_accum_steps = options.grad_accum_steps;
  go.collectives = collectives;
  go.on_info = [&run](absl::string_view line) { run.info.emplace_back(line); };
  absl::StatusOr<std::unique_ptr<StepGraph>> graph = StepGraph::Create(backend, &model, go);
  if (!graph.ok()) return graph.status();
  const ArithmeticData data(options.config.vocab_size, 6, 7);
  const int B = options.batch_size, T = options.seq_len, accum = options.grad_accum_steps;
  const ScheduleConfig schedule = TestSchedule();
  const bool fp8 = model.fp8_state() != nullptr;
  int applied_steps = 0;
  for (int step = 1; step <= steps; ++step) {
    if (hook) {
      if (absl::Status s = hook(step, true, model); !s.ok()) return s;
    }
    double lr = LearningRate(schedule, step);
    if (lr_override(step) >= 0) lr = lr_override(step);
    model.ZeroGrad();
    auto batch = [&](int micro) { return data.Get(0, step, micro, B, T); };
    absl::StatusOr<std::optional<StepGraph::Result>> r =
        (*graph)->Run(step, static_cast<float>(lr), applied_steps + 1, batch);
    if (!r.ok()) return r.status();
    double loss = 0;
    float norm = 0;
    bool applied = true;
    if (r->has_value()) {
      loss = (*r)->loss;
      norm = (*r)->grad_norm;
      applied = (*r)->applied;
    } else {
      for (int micro = 0; micro < accum; ++micro) {
        const Batch b = batch(micro);
        absl::StatusOr<double> l = model.Forward(b.inputs, b.targets);
        if (!l.ok()) return l.status();
        if (fp8 && !std::isfinite(*l)) {  // as the trainer: skip the step
          loss = *l;
          applied = false;
          break;
        }
        loss += *l / accum;
        if (absl::Status s = model.Backward(); !s.ok()) return s;
      }
      if (fp8 && applied) {
        absl::StatusOr<float> n = model.GradNorm();
        if (!n.ok()) return n.status();
        applied = std::isfinite(*n);
      }
      norm = std::nanf("");
      if (applied) {
        absl::StatusOr<float> n = model.OptimizerStep(static_cast<float>(lr), applied_steps + 1);
        if (!n.ok()) return n.status();
        norm = *n;
      }
    }
    if (fp8) {
      std::vector<Fp8TensorStat> stats;
      absl::Status s = !applied         ? model.Fp8EndStep(/*apply=*/false, &stats)
                               : r->has_value() ? model.Fp8EndReplayedStep(&stats)
                                        : model.Fp8EndStep(/*apply=*/true, &stats);
      if (!s.ok()) return s;
      run.fp8_stats.push_back(std::move(stats));
    }
    if (applied) ++applied_steps;
    run.losses.push_back(loss);
    run.norms.push_back(norm);
    run.lrs.push_back(lr);
    run.graphed.push_back(r->has_value());
    run.applied.push_back(applied);
    if (hook) {
      if (absl::Status s = hook(step, false, model); !s.ok()) return s;
    }
  }
  absl::StatusOr<std::vector<float>> params = model.GetParameters();
  if (!params.ok()) return params.status();
  run.params = *std::move(params);
  return run;
}

inline absl::StatusOr<StepRun> TrainSteps(kernels::Backend* backend, const ModelOptions& options,
                                          const std::string& mode, int steps) {
  return TrainSteps(backend, options, mode, steps, [](int) { return -1.0; });
}

// Sets element `index` of parameter tensor (kind, layer) to `value` through the backend,
// returning the value it had (to put back with another call). Synchronises.
inline absl::StatusOr<float> SetParameterElement(kernels::Backend* backend, Model& model,
                                                 TensorKind kind, int layer, size_t index,
                                                 float value) {
  const kernels::DType dt = backend->compute_dtype();
  void* p = static_cast<char*>(model.params()) +
            (model.layout().Offset(kind, layer) + index) * kernels::DTypeSize(dt);
  float old = 0;
  backend->CopyToHostF32(&old, p, dt, 1);
  backend->CopyFromHostF32(p, dt, &value, 1);
  if (absl::Status s = backend->Synchronize(); !s.ok()) return s;
  return old;
}

// A hook that sets element 0 of layer `layer`'s fc1 weight to NaN before step `step` and puts
// its value back after it: that step's forward is NaN (an FP8 step is skipped; an inf would
// only saturate the FP8 cast), the others
// train normally.
inline StepHook PoisonFc1WeightAt(kernels::Backend* backend, int step, int layer) {
  auto saved = std::make_shared<float>(0.0f);
  return [=](int s, bool before, Model& model) -> absl::Status {
    if (s != step) return absl::OkStatus();
    absl::StatusOr<float> old =
        SetParameterElement(backend, model, TensorKind::kFc1Weight, layer, 0,
                            before ? std::numeric_limits<float>::quiet_NaN() : *saved);
    if (!old.ok()) return old.status();
    if (before) *saved = *old;
    return absl::OkStatus();
  };
}

// Index of the first element where a and b differ bitwise, or -1 (NaN-safe, -0 != +0).
template <typename F>
long FirstBitDifference(const std::vector<F>& a, const std::vector<F>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(F)) != 0) return static_cast<long>(i);
  }
  return -1;
}

}  // namespace boulder::engine::testing

#endif  // BOULDER_WORKER_ENGINE_STEP_GRAPH_TESTING_H_
