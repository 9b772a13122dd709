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
// (Model::ZeroGrad, before each step); where it defers the weight gradients to the step's first
// backward (Model::defers_zero_grad), that backward is recorded writing them with '=', in the
// one graph or, with more micro-batches, in a first-micro-batch graph of its own.
//
// FP8 (precision fp8): the graphs also hold the casts and, after AdamW, the delayed-scaling
// update. The weights are cast once per optimizer step: with grad_accum_steps 1 in the one
// graph, with more in a first-micro-batch graph (the micro-step graph with the weight casts)
// replayed for micro-batch 0 and the micro-step graph without them for the others. A
// non-finite step is skipped on the device: AdamW and the scale update read the gradient's sum
// of squares and leave parameters, optimizer state, scales and histories untouched when it is
// inf or NaN; Run reports the step as not applied and the caller does the host bookkeeping
// (Model::Fp8EndStep(apply=false): the amaxes discarded; skip counters; the statistics naming
// the tensor that overflowed). The host-side element tallies of the casts (for the saturation
// ratios) are taken from each recording and added at each replay. With grad_accum_steps > 1 a
// micro-batch whose loss is not finite ends the step there (as the eager loop: the optimizer
// graph is not replayed).
//
// Data parallelism (StepGraphOptions::collectives with collectives that can be recorded: NCCL;
// mode "on" only, for now: "auto" keeps such steps eager until the recorded step has been
// measured on several GPUs): the graph of the step's last micro-batch (the one graph with
// grad_accum_steps 1, else a last-micro-batch graph beside the micro-step one) also holds the
// gradient all-reduces, issued per bucket during the backward on the communicator's stream and
// joined on the device before the gradient norm; with FP8 the amaxes' MAX all-reduce runs
// before the scale update. A micro-batch with a non-finite FP8 loss does not end the step early
// (the other ranks' all-reduces wait for this rank's): the all-reduced norm, not finite then on
// every rank, skips the update on the device. After recording, the ranks agree that every one
// of them recorded (else all fail: their collectives would no longer match); each replay is
// waited for with the collective timeout, watching for a failed peer.
//
// Where graphs don't apply the step runs eagerly (Run returns nullopt): mode "off"; a backend
// without capture (cpu); data parallelism with collectives that cannot be recorded (Gloo) or in
// mode "auto"; per-kernel profiling (its events). Mode "on" makes any of these an error instead,
// and mode "auto" also falls back to eager steps when the capture itself fails (with a notice;
// with data parallelism a failed capture is an error on every rank).
//
// Thread-safety: none; used by the thread that drives the model and its backend.
#ifndef BOULDER_WORKER_ENGINE_STEP_GRAPH_H_
#define BOULDER_WORKER_ENGINE_STEP_GRAPH_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "worker/engine/data.h"
#include "worker/engine/model.h"

namespace boulder::engine {

// The data-parallel collectives of a recorded step (DataParallel implements it).
class StepCollectives {
 public:
  virtual ~StepCollectives() = default;
  // Why the collectives cannot be recorded in a graph; "" when they can.
  virtual std::string CaptureBlocker() const = 0;
  // While recording, in this order around the model's work: before the backward (its buckets
  // then issue their all-reduces as they finish), after it (the backend's stream joins them,
  // no host wait), and with FP8 before the scale update (the amaxes' MAX over the ranks,
  // joined on the device). The first error is returned by the later calls too.
  virtual void ReduceDuringBackward() = 0;
  virtual absl::Status JoinGradientsOnDevice() = 0;
  virtual absl::Status ReduceFp8AmaxesOnDevice(Fp8State* state) = 0;
  // After recording: whether `recorded` holds on every rank (a blocking collective).
  virtual absl::StatusOr<bool> AllRanksTrue(bool recorded) = 0;
  // After a replay is launched: waits for it up to the collective timeout, failing (naming the
  // ranks) when a peer failed or hung.
  virtual absl::Status WaitForReplay() = 0;
};

struct StepGraphOptions {
  // training.cuda_graph: "auto" (also ""), "on" or "off".
  std::string mode = "auto";
  int grad_accum_steps = 1;
  // Data parallelism: null without. Not owned; must outlive the StepGraph.
  StepCollectives* collectives = nullptr;
  // Conditions that rule graphs out (see above).
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
    double loss;      // mean over the micro-batches, as the eager loop computes it; for a
                      // skipped FP8 step the first non-finite micro-batch loss
    float grad_norm;  // before clipping (NaN when a micro-batch's loss ended the step)
    // false: an FP8 step skipped for a non-finite loss or gradient norm. Nothing was updated;
    // the step's amaxes and counters are still in the model's Fp8State (for
    // Model::Fp8EndStep(/*apply=*/false, ...)). true: updated as the eager step would (for FP8
    // end it with Model::Fp8EndReplayedStep).
    bool applied = true;
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
  // `t` is the AdamW step (not advanced by the caller over skipped steps).
  // REQUIRES: the gradients are zero (Model::ZeroGrad) when a step starts; FP8: the previous
  // step was ended (Model::Fp8EndStep or Fp8EndReplayedStep).
  // Errors: INTERNAL when a micro-batch's loss is not finite without FP8 (as the eager loop;
  // the step's update has then been applied, and the job fails), or with FP8 when the loss is
  // not finite but the gradient norm is (the device applied the update the eager loop would
  // have skipped); a failed capture in mode "on", or with data parallelism on any rank; the
  // collectives' errors (a failed or hung peer); the backend's errors.
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
  // Records `enqueue`; with FP8 also takes the element tallies it added into *tallies (and
  // puts the model's tallies back: nothing ran).
  absl::StatusOr<std::unique_ptr<kernels::Backend::Graph>> Record(
      const std::function<void()>& enqueue, std::vector<int64_t>* tallies);
  // Replays `graph` and adds its recorded element tallies.
  void Replay(const kernels::Backend::Graph& graph, const std::vector<int64_t>& tallies);

  kernels::Backend* backend_;
  Model* model_;
  StepGraphOptions options_;
  bool enabled_ = false;
  std::string reason_;
  int eager_steps_done_ = 0;
  int64_t replayed_ = 0;
  // accum 1: step_ only; accum > 1: micro_ and optimizer_, and with FP8 or a deferring
  // ZeroGrad first_micro_ (micro_ with the weight casts and the '=' weight gradients, for
  // micro-batch 0). Each with the FP8 element tallies it adds.
  // With data parallelism and accum > 1 also last_micro_ (micro_ with the all-reduces, for the
  // last micro-batch).
  std::unique_ptr<kernels::Backend::Graph> step_, micro_, first_micro_, last_micro_, optimizer_;
  std::vector<int64_t> step_tallies_, micro_tallies_, first_micro_tallies_, last_micro_tallies_,
      optimizer_tallies_;
};

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_STEP_GRAPH_H_
