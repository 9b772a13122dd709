// The steady-state training step replayed from CUDA graphs (training.cuda_graph): after a few
// eager steps (cuBLASLt picks and autotunes its algorithms, the scratch buffers reach their
// size), the step's device work is recorded once and each later step is one graph launch plus
// its host-side edges: the batch copied into the model's fixed token buffers and the step's
// learning rate and AdamW step written to device memory before the launch, the loss and the
// gradient norm read after it (one sync).
//
// Graphs: with grad_accum_steps 1, one graph holds forward, loss, backward, gradient norm and
// AdamW; with more, a micro-step graph (forward, loss, backward) replays once per micro-batch
// and an optimizer graph once per step. Zeroing the gradients stays with the caller
// (Model::ZeroGrad, one memset).
//
// Where graphs don't apply the step runs eagerly (Run returns nullopt): mode "off"; a backend
// without capture (cpu); FP8 (its weight casts and scale bookkeeping live on the host);
// data parallelism (the gradient all-reduce runs on its own stream and the host, per bucket);
// per-kernel profiling (its events). Mode "on" makes any of these an error instead, and mode
// "auto" also falls back to eager steps when the capture itself fails (with a notice).
//
// Thread-safety: none; used by the thread that drives the model and its backend.
#ifndef BOULDER_WORKER_ENGINE_STEP_GRAPH_H_
#define BOULDER_WORKER_ENGINE_STEP_GRAPH_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "worker/engine/data.h"
#include "worker/engine/model.h"

namespace boulder::engine {

struct StepGraphOptions {
  // training.cuda_graph: "auto" (also ""), "on" or "off".
  std::string mode = "auto";
  int grad_accum_steps = 1;
  // Conditions that rule graphs out (see above).
  bool fp8 = false;
  bool data_parallel = false;
  bool profiling = false;
  // Eager steps before the capture: the first calls of each GEMM shape pick (and, unless
  // deterministic, time) their algorithms, which must not happen while recording.
  int eager_steps = 2;
  // Lines for the log: the capture (graph sizes) or why the step stays eager. May be empty.
  std::function<void(absl::string_view)> on_info;
};

class StepGraph {
 public:
  struct Result {
    double loss;      // mean over the micro-batches, as the eager loop computes it
    float grad_norm;  // before clipping
  };

  // INVALID_ARGUMENT: an unknown mode (names training.cuda_graph). FAILED_PRECONDITION: mode
  // "on" where graphs don't apply (names the reason). `backend` and `model` must outlive it.
  static absl::StatusOr<std::unique_ptr<StepGraph>> Create(kernels::Backend* backend, Model* model,
                                                           const StepGraphOptions& options);
  ~StepGraph();

  // Whether steps will (eventually) replay graphs; false: every Run() returns nullopt.
  bool enabled() const { return enabled_; }
  // Why graphs are off ("" when enabled).
  const std::string& reason() const { return reason_; }
  // Steps replayed so far.
  int64_t replayed_steps() const { return replayed_; }

  // One optimizer step, `step` of the run (for messages), with learning rate `lr` and AdamW step
  // `t`, over the micro-batches batch(0 .. grad_accum_steps-1). nullopt: the caller runs this
  // step eagerly (graphs off, or one of the first eager_steps calls). Otherwise the step ran
  // from graphs: parameters and optimizer state are updated as the eager step would.
  // REQUIRES: the gradients are zero (Model::ZeroGrad) when a step starts.
  // Errors: INTERNAL when a micro-batch's loss is not finite (as the eager loop; the step's
  // update has then been applied, and the job fails); a failed capture in mode "on"; the
  // backend's errors.
  absl::StatusOr<std::optional<Result>> Run(int64_t step, float lr, int t,
                                            const std::function<Batch(int micro)>& batch);

 private:
  StepGraph(kernels::Backend* backend, Model* model, const StepGraphOptions& options)
      : backend_(backend), model_(model), options_(options) {}
  void Info(absl::string_view line) const {
    if (options_.on_info) options_.on_info(line);
  }
  // Records the graphs; on failure in mode "auto" turns graphs off (and returns OK).
  absl::Status Capture(int64_t step);
  absl::StatusOr<std::unique_ptr<kernels::Backend::Graph>> Record(
      const std::function<void()>& enqueue);

  kernels::Backend* backend_;
  Model* model_;
  StepGraphOptions options_;
  bool enabled_ = false;
  std::string reason_;
  int eager_steps_done_ = 0;
  int64_t replayed_ = 0;
  // accum 1: step_ only; accum > 1: micro_ and optimizer_.
  std::unique_ptr<kernels::Backend::Graph> step_, micro_, optimizer_;
};

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_STEP_GRAPH_H_
