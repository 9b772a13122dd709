#include "worker/engine/step_graph.h"

#include <cmath>
#include <utility>

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
  } else if (options.fp8) {
    reason = "precision fp8 (its weight casts and scaling bookkeeping run on the host)";
  } else if (options.data_parallel) {
    reason = "data parallelism (the gradient all-reduce runs on its own stream, per bucket)";
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
    const std::function<void()>& enqueue) {
  if (absl::Status s = backend_->BeginCapture(); !s.ok()) return s;
  enqueue();
  return backend_->EndCapture();
}

absl::Status StepGraph::Capture(int64_t step) {
  Model& m = *model_;
  absl::Status failed;
  std::string sizes;
  if (options_.grad_accum_steps == 1) {
    absl::StatusOr<std::unique_ptr<kernels::Backend::Graph>> g = Record([&m] {
      m.EnqueueTrainingForward();
      m.EnqueueBackward();
      m.EnqueueOptimizerStep();
    });
    if (g.ok()) {
      step_ = *std::move(g);
      sizes = absl::StrCat("one graph of ", step_->num_nodes(), " nodes");
    } else {
      failed = g.status();
    }
  } else {
    absl::StatusOr<std::unique_ptr<kernels::Backend::Graph>> micro = Record([&m] {
      m.EnqueueTrainingForward();
      m.EnqueueBackward();
    });
    absl::StatusOr<std::unique_ptr<kernels::Backend::Graph>> opt =
        micro.ok() ? Record([&m] { m.EnqueueOptimizerStep(); }) : micro.status();
    if (micro.ok() && opt.ok()) {
      micro_ = *std::move(micro);
      optimizer_ = *std::move(opt);
      sizes = absl::StrCat("a micro-step graph of ", micro_->num_nodes(), " nodes replayed ",
                           options_.grad_accum_steps, " times and an optimizer graph of ",
                           optimizer_->num_nodes(), " nodes");
    } else {
      failed = micro.ok() ? opt.status() : micro.status();
    }
  }
  if (!failed.ok()) {
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
  Result r{0.0, 0.0f};
  for (int micro = 0; micro < accum; ++micro) {
    const Batch b = batch(micro);
    if (absl::Status s = m.UploadBatch(b.inputs, b.targets); !s.ok()) return s;
    backend_->Replay(accum == 1 ? *step_ : *micro_);
    absl::StatusOr<double> l = m.ReadLoss();
    if (!l.ok()) return l.status();
    if (!std::isfinite(*l)) {
      return absl::InternalError(
          absl::StrCat("step ", step, ": loss is ", *l,
                       " (training diverged; try a lower training.lr or training.grad_clip)"));
    }
    r.loss += *l / accum;
  }
  if (accum > 1) backend_->Replay(*optimizer_);
  absl::StatusOr<float> norm = m.ReadGradNorm();
  if (!norm.ok()) return norm.status();
  r.grad_norm = *norm;
  ++replayed_;
  return r;
}

}  // namespace boulder::engine
