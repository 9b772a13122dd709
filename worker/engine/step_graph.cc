#include "worker/engine/step_graph.h"

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace boulder::engine {

absl::StatusOr<std::unique_ptr<StepGraph>> StepGraph::Create(kernels::Backend* backend,
                                                             Model* model,
                                                             const StepGraphOptions& options) {
  const std::string& mode = options.mode;
  if (!mode.empty() && mode != "auto" && mode != "on" && mode != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("training.cuda_graph: unknown '", mode, "' (auto, on or off)"));
  }
  if (options.grad_accum_steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training.grad_accum_steps: must be positive, got ", options.grad_accum_steps));
  }
  std::unique_ptr<StepGraph> g(new StepGraph(backend, model, options));
  std::string reason;
  if (mode == "off") {
    reason = "training.cuda_graph is off";
  } else if (options.collectives != nullptr &&
             !options.collectives->CaptureBlocker().empty()) {
    reason = absl::StrCat("data parallelism: ", options.collectives->CaptureBlocker());
  } else if (options.collectives != nullptr && mode != "on") {
    reason =
        "data parallelism: replaying the step with its all-reduces is opt-in "
        "(training.cuda_graph: on) until it has been measured on several GPUs";
  } else if (options.profiling) {
    reason = "per-kernel profiling is on (its events would be recorded)";
  } else {
    // A backend without capture says so at once; on one with it, end the empty probe.
    absl::Status begin = backend->BeginCapture();
    if (begin.code() == absl::StatusCode::kUnimplemented) {
      reason = absl::StrCat("the ", backend->name(), " backend cannot capture graphs");
    } else if (!begin.ok()) {
      reason = absl::StrCat("graph capture unavailable: ", begin.message());
    } else {
      (void)backend->EndCapture();  // discarded either way: the probe recorded nothing
    }
  }
  if (!reason.empty()) {
    if (mode == "on") {
      return absl::FailedPreconditionError(
          absl::StrCat("training.cuda_graph: on, but the step cannot run as a CUDA graph: ", reason,
                       " (set training.cuda_graph: auto or off)"));
    }
    g->reason_ = std::move(reason);
    g->Info(absl::StrCat("cuda graph: off (", g->reason_, ")"));
    return g;
  }
  g->enabled_ = true;
  return g;
}

StepGraph::~StepGraph() = default;

absl::StatusOr<std::unique_ptr<kernels::Backend::Graph>> StepGraph::Record(
    const std::function<void()>& enqueue, std::vector<int64_t>* tallies) {
  Fp8State* fp8 = model_->fp8_state();
  std::vector<int64_t> before;
  if (fp8 != nullptr) before = fp8->elements();
  if (absl::Status s = backend_->BeginCapture(); !s.ok()) return s;
  enqueue();
  absl::StatusOr<std::unique_ptr<kernels::Backend::Graph>> g = backend_->EndCapture();
  tallies->clear();
  if (fp8 != nullptr) {
    const std::vector<int64_t>& after = fp8->elements();
    tallies->resize(after.size());
    for (size_t i = 0; i < after.size(); ++i) (*tallies)[i] = after[i] - before[i];
    fp8->set_elements(std::move(before));
  }
  return g;
}

void StepGraph::Replay(const kernels::Backend::Graph& graph, const std::vector<int64_t>& tallies) {
  backend_->Replay(graph);
  if (Fp8State* fp8 = model_->fp8_state(); fp8 != nullptr) fp8->AddElements(tallies);
}

absl::Status StepGraph::Capture(int64_t step) {
  Model& m = *model_;
  absl::Status failed;
  std::string sizes;
  const bool fp8 = m.fp8_state() != nullptr;
  StepCollectives* const dp = options_.collectives;
  absl::Status dp_status;  // the collectives' first error while recording
  auto optimizer = [&m, dp, &dp_status] {
    m.EnqueueOptimizerStep();
    if (dp != nullptr && m.fp8_state() != nullptr) {
      dp_status.Update(dp->ReduceFp8AmaxesOnDevice(m.fp8_state()));
    }
    m.EnqueueFp8ScaleUpdate();  // FP8 only
  };
  // The step's last micro-batch: with data parallelism its backward also issues the bucket
  // all-reduces, joined on the device before anything reads the gradients.
  // The step's first backward writes the weight gradients ZeroGrad deferred (with '=').
  const bool first_writes = m.defers_zero_grad();
  auto last_micro_step = [&m, dp, &dp_status](bool first_of_step) {
    m.EnqueueTrainingForward();
    if (dp != nullptr) dp->ReduceDuringBackward();
    m.EnqueueBackward(first_of_step);
    if (dp != nullptr) dp_status.Update(dp->JoinGradientsOnDevice());
  };
  if (options_.grad_accum_steps == 1) {
    absl::StatusOr<std::unique_ptr<kernels::Backend::Graph>> g = Record(
        [&last_micro_step, &optimizer, first_writes] {
          last_micro_step(first_writes);
          optimizer();
        },
        &step_tallies_);
    if (g.ok() && !dp_status.ok()) g = dp_status;
    if (g.ok()) {
      step_ = *std::move(g);
      sizes = absl::StrCat("one graph of ", step_->num_nodes(), " nodes");
    } else {
      failed = g.status();
    }
  } else {
    auto micro_step = [&m](bool first_of_step) {
      return [&m, first_of_step] {
        m.EnqueueTrainingForward();
        m.EnqueueBackward(first_of_step);
      };
    };
    // A graph of its own for the first micro-batch where it differs from the others: FP8's
    // weights are stale at the start of a step, so the first recording casts them and the
    // second (the other micro-batches') finds them cast; and its backward writes the weight
    // gradients ZeroGrad deferred.
    using GraphOr = absl::StatusOr<std::unique_ptr<kernels::Backend::Graph>>;
    GraphOr first = fp8 || first_writes
                        ? Record(micro_step(first_writes), &first_micro_tallies_)
                        : GraphOr(std::unique_ptr<kernels::Backend::Graph>());
    absl::StatusOr<std::unique_ptr<kernels::Backend::Graph>> micro =
        first.ok() ? Record(micro_step(false), &micro_tallies_) : first.status();
    // Data parallelism: a graph of its own for the last micro-batch (the others only
    // accumulate).
    GraphOr last = !micro.ok()     ? GraphOr(micro.status())
                   : dp != nullptr ? Record([&last_micro_step] { last_micro_step(false); },
                                            &last_micro_tallies_)
                                   : GraphOr(std::unique_ptr<kernels::Backend::Graph>());
    absl::StatusOr<std::unique_ptr<kernels::Backend::Graph>> opt =
        last.ok() ? Record(optimizer, &optimizer_tallies_) : last.status();
    if (opt.ok() && !dp_status.ok()) opt = dp_status;
    if (opt.ok()) {
      first_micro_ = *std::move(first);
      micro_ = *std::move(micro);
      last_micro_ = *std::move(last);
      optimizer_ = *std::move(opt);
      sizes = first_micro_ != nullptr
                  ? absl::StrCat("a first-micro-batch graph of ", first_micro_->num_nodes(),
                                 fp8 ? " nodes with the FP8 weight casts" : " nodes",
                                 first_writes ? " writing the weight gradients" : "",
                                 ", a micro-step graph of ", micro_->num_nodes(),
                                 " nodes replayed ", options_.grad_accum_steps - 1, " times")
                  : absl::StrCat("a micro-step graph of ", micro_->num_nodes(), " nodes replayed ",
                                 options_.grad_accum_steps, " times");
      if (last_micro_ != nullptr) {
        absl::StrAppend(&sizes, ", a last-micro-batch graph of ", last_micro_->num_nodes(),
                        " nodes with the gradient all-reduces");
      }
      absl::StrAppend(&sizes, " and an optimizer graph of ", optimizer_->num_nodes(), " nodes");
    } else {
      failed = opt.status();
    }
  }
  if (dp != nullptr) {
    // Every rank replays its graph's collectives or none does: agree before the first replay.
    absl::StatusOr<bool> all = dp->AllRanksTrue(failed.ok());
    if (!all.ok()) return all.status();
    if (!failed.ok() || !*all) {
      m.InvalidateFp8Weights();
      return absl::InternalError(absl::StrCat(
          "step ", step, ": capturing the data-parallel step in a CUDA graph failed ",
          failed.ok() ? "on another rank" : absl::StrCat("on this rank: ", failed.message()),
          " (set training.cuda_graph: off to train eagerly)"));
    }
  }
  if (!failed.ok()) {
    m.InvalidateFp8Weights();  // the recorded weight casts never ran
    if (options_.mode == "on") {
      return absl::Status(failed.code(), absl::StrCat("step ", step,
                                                      ": training.cuda_graph: on, but capturing "
                                                      "the step failed: ",
                                                      failed.message()));
    }
    enabled_ = false;
    reason_ = absl::StrCat("capturing the step failed: ", failed.message());
    Info(absl::StrCat("cuda graph: off from step ", step, " (", reason_, "); steps run eagerly"));
    return absl::OkStatus();
  }
  Info(absl::StrCat("cuda graph: captured the training step at step ", step, " (", sizes,
                    "); every later step replays it"));
  return absl::OkStatus();
}

absl::StatusOr<std::optional<StepGraph::Result>> StepGraph::Run(
    int64_t step, float lr, int t, const std::function<Batch(int micro)>& batch) {
  if (!enabled_) return std::nullopt;
  if (eager_steps_done_ < options_.eager_steps) {
    ++eager_steps_done_;
    return std::nullopt;
  }
  if (step_ == nullptr && micro_ == nullptr) {
    if (absl::Status s = Capture(step); !s.ok()) return s;
    if (!enabled_) return std::nullopt;
  }
  Model& m = *model_;
  // Per-step values go to device memory before the launch: the graph reads them there.
  if (absl::Status s = m.SetOptimizerStep(lr, t); !s.ok()) return s;
  const int accum = options_.grad_accum_steps;
  const bool fp8 = m.fp8_state() != nullptr;
  StepCollectives* const dp = options_.collectives;
  // Data parallelism: a replay may hold collectives; wait for it with their timeout.
  auto wait = [dp]() { return dp != nullptr ? dp->WaitForReplay() : absl::OkStatus(); };
  Result r{0.0, 0.0f};
  bool loss_finite = true;
  for (int micro = 0; micro < accum; ++micro) {
    const Batch b = batch(micro);
    if (absl::Status s = m.UploadBatch(b.inputs, b.targets); !s.ok()) return s;
    // The graphs of the step's first backward were recorded writing the weight gradients
    // ZeroGrad defers (when it does); the others add to them.
    const bool first_graph = accum == 1 || (micro == 0 && first_micro_ != nullptr);
    if (first_graph && m.defers_zero_grad()) {
      if (!m.TakePendingZeroGrad()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "step ", step, ": the recorded step writes the weight gradients that "
            "Model::ZeroGrad() leaves to it, and no ZeroGrad() came before it"));
      }
    } else {
      m.FlushPendingZeroGrad();
    }
    if (accum == 1) {
      Replay(*step_, step_tallies_);
    } else if (micro == accum - 1 && last_micro_ != nullptr) {
      Replay(*last_micro_, last_micro_tallies_);
    } else if (micro == 0 && first_micro_ != nullptr) {
      Replay(*first_micro_, first_micro_tallies_);
    } else {
      Replay(*micro_, micro_tallies_);
    }
    if (absl::Status s = wait(); !s.ok()) return s;
    absl::StatusOr<double> l = m.ReadLoss();
    if (!l.ok()) return l.status();
    if (!std::isfinite(*l)) {
      if (!fp8) {
        return absl::InternalError(
            absl::StrCat("step ", step, ": loss is ", *l,
                         " (training diverged; try a lower training.lr or training.grad_clip)"));
      }
      // FP8: the step is skipped (as the eager loop, which stops at this micro-batch). With
      // data parallelism every micro-batch still runs (the other ranks' all-reduces wait for
      // this rank's), and the all-reduced gradients' norm, not finite then, skips the update
      // on the device on every rank.
      if (loss_finite) r.loss = *l;
      loss_finite = false;
      if (dp == nullptr) break;
      continue;
    }
    if (loss_finite) r.loss += *l / accum;
  }
  ++replayed_;
  if (!loss_finite && accum > 1 && dp == nullptr) {
    r.grad_norm = std::nanf("");
    r.applied = false;
    return r;
  }
  if (accum > 1) {
    Replay(*optimizer_, optimizer_tallies_);
    if (absl::Status s = wait(); !s.ok()) return s;
  }
  absl::StatusOr<float> norm = m.ReadGradNorm();
  if (!norm.ok()) return norm.status();
  r.grad_norm = *norm;
  if (fp8) {
    // The device skipped AdamW and the scale update exactly when the norm is not finite.
    r.applied = std::isfinite(*norm);
    if (!loss_finite && r.applied) {
      return absl::InternalError(absl::StrCat(
          "step ", step, ": loss is ", r.loss, " but the gradient norm is finite (", *norm,
          "): the replayed step applied an update the eager step would have skipped"));
    }
  }
  return r;
}

}  // namespace boulder::engine
