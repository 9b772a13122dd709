#include "worker/engine/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "common/env_choice.h"
#include "common/memory_estimate.h"
#include "kernels/backend.h"
#include "worker/engine/data.h"
#include "worker/engine/data_parallel.h"
#include "worker/engine/fp8_state.h"
#include "worker/engine/model.h"
#include "worker/engine/param_layout.h"
#include "worker/engine/safetensors.h"
#include "worker/engine/schedule.h"
#include "worker/engine/step_graph.h"
#include "worker/engine/token_files.h"
#include "worker/engine/trainer_checkpoint.h"

namespace boulder::engine {
namespace {

bool Stopped(const TrainerOptions& o) {
  return o.stop != nullptr && o.stop->load(std::memory_order_relaxed);
}

void Info(const TrainerOptions& o, absl::string_view line) {
  if (o.on_info) o.on_info(line);
}

void Notice(const TrainerOptions& o, absl::string_view line) {
  if (o.on_notice) o.on_notice(line);
}

std::string MiB(size_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

// precision fp8: the cpu backend when fp8.emulate (rounding emulated), else a cuda backend
// whose GPU has FP8 (compute capability 8.9 or higher).
absl::StatusOr<std::unique_ptr<kernels::Backend>> MakeFp8Backend(const TrainerOptions& o,
                                                                 const std::string& name) {
  if (o.spec.fp8().emulate()) {
    if (name == "cuda") {
      return absl::FailedPreconditionError(
          "fp8.emulate: true emulates FP8 on the cpu backend, but the backend is cuda");
    }
    Info(o, "cpu backend: precision fp8, emulated (fp8.emulate: true)");
    return kernels::NewCpuBackend(o.threads);
  }
  if (name == "cpu") {
    return absl::FailedPreconditionError(
        "precision: fp8 needs a GPU of compute capability 8.9 or higher; the cpu backend only "
        "emulates it (set fp8.emulate: true)");
  }
  absl::StatusOr<std::unique_ptr<kernels::Backend>> cuda = kernels::NewCudaBackend(0);
  if (!cuda.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("precision: fp8 needs a GPU of compute capability 8.9 or higher: ",
                     cuda.status().message()));
  }
  if (absl::Status s = (*cuda)->Fp8Supported(); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("precision: fp8: ", s.message()));
  }
  Info(o, "cuda backend: precision fp8 (delayed scaling), bf16 elsewhere");
  return std::move(*cuda);
}

Fp8Options Fp8OptionsFromSpec(const v1::JobSpec& spec) {
  Fp8Options f;
  f.enabled = spec.precision() == "fp8";
  f.hybrid = spec.fp8().format() == "hybrid";
  f.amax_history_len = spec.fp8().amax_history_len();
  f.use_history_max = spec.fp8().amax_compute_algo() == "max";
  f.margin = spec.fp8().margin();
  return f;
}

void ToProto(const std::vector<Fp8TensorStat>& stats, v1::StepReport* r) {
  for (const Fp8TensorStat& t : stats) {
    v1::Fp8TensorStats* p = r->add_fp8();
    p->set_layer(t.layer);
    p->set_tensor(Fp8LinearName(t.linear));
    p->set_role(Fp8RoleName(t.role));
    p->set_format(kernels::Fp8FormatName(t.format));
    p->set_scale(t.scale);
    p->set_amax(t.amax);
    p->set_amax_history_max(t.amax_history_max);
    p->set_saturated_ratio(t.saturated_ratio);
    p->set_underflow_ratio(t.underflow_ratio);
  }
}

// Picks the backend for the job: the cuda backend trains in bf16, the cpu backend in fp32;
// "auto" takes a usable GPU when this build has the CUDA backend, else the CPU.
absl::StatusOr<std::unique_ptr<kernels::Backend>> MakeBackend(const TrainerOptions& o) {
  const std::string& name = o.backend.empty() ? o.spec.resources().backend() : o.backend;
  if (name != "auto" && name != "cpu" && name != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("resources.backend: unknown '", name, "' (expected auto, cpu or cuda)"));
  }
  if (o.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("threads: ", o.threads, " < 0"));
  }
  const std::string& precision = o.spec.precision();
  if (precision == "fp8") return MakeFp8Backend(o, name);
  std::string cuda_problem;
  if (name != "cpu") {
    absl::StatusOr<std::unique_ptr<kernels::Backend>> cuda = kernels::NewCudaBackend(0);
    if (cuda.ok()) {
      if (precision != "auto" && precision != "bf16") {
        return absl::FailedPreconditionError(absl::StrCat(
            "precision: ", precision, " is not supported by the cuda backend, which trains in "
            "bf16 (set precision: bf16 or auto)"));
      }
      Info(o, absl::StrCat("cuda backend: precision bf16",
                           name == "auto" ? " (backend auto found a GPU)" : ""));
      return std::move(*cuda);
    }
    if (name == "cuda") {
      return absl::FailedPreconditionError(
          absl::StrCat("backend cuda: ", cuda.status().message()));
    }
    cuda_problem = std::string(cuda.status().message());
  }
  if (precision != "auto" && precision != "fp32") {
    return absl::FailedPreconditionError(absl::StrCat(
        "precision: ", precision, " needs the cuda backend",
        cuda_problem.empty() ? "" : absl::StrCat(" (", cuda_problem, ")"),
        "; the cpu backend trains in fp32 (set precision: fp32)"));
  }
  if (!cuda_problem.empty()) Info(o, absl::StrCat("cpu backend: ", cuda_problem));
  return kernels::NewCpuBackend(o.threads);
}

void ToProto(const kernels::MemoryStats& m, v1::MemoryStats* out) {
  out->set_allocated_bytes(m.allocated_bytes);
  out->set_peak_bytes(m.peak_bytes);
  out->set_reserved_bytes(m.reserved_bytes);
  out->set_device_total_bytes(m.device_total_bytes);
}

void SetNow(google::protobuf::Timestamp* ts) {
  const absl::Time now = absl::Now();
  const int64_t nanos = absl::ToUnixNanos(now);
  ts->set_seconds(nanos / 1000000000);
  ts->set_nanos(static_cast<int32_t>(nanos % 1000000000));
}

TokenDataOptions TokenOptions(const TrainerOptions& o, const std::string& glob,
                              const std::string& field, bool shuffle) {
  TokenDataOptions t;
  t.glob = glob;
  t.field = field;
  t.vocab_size = o.spec.model().vocab_size();
  t.seq_len = o.spec.training().seq_len();
  t.rank = o.rank;
  t.world_size = o.world_size;
  t.seed = o.spec.training().seed();
  t.shuffle = shuffle;
  return t;
}

comm::CommOptions CommOptionsFor(const TrainerOptions& o) {
  comm::CommOptions c;
  c.rank = o.rank;
  c.world_size = o.world_size;
  c.job_id = o.job_id;
  c.attempt = o.attempt;
  c.coordinator = o.coordinator;
  c.host = o.comm_host;
  c.security = o.security;
  c.timeout = absl::Seconds(o.spec.resources().collective_timeout_seconds());
  return c;
}

// A data-parallel failure, with the step it happened in.
absl::Status Annotate(const absl::Status& s, int64_t step) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("step ", step, ": ", s.message()));
}

}  // namespace

absl::Status RunTrainer(const TrainerOptions& o) {
  const v1::JobSpec& spec = o.spec;
  const v1::TrainingSpec& tr = spec.training();
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " is not in [0, world size ", o.world_size, ")"));
  }
  const bool data_parallel = o.world_size > 1 || o.force_communicator;
  if (data_parallel && o.coordinator.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", o.world_size,
                     ": data-parallel training needs the coordinator's address for the rendezvous "
                     "(--coordinator HOST:PORT; the worker agent passes it)"));
  }
  absl::StatusOr<ModelConfig> config = ModelConfigFromSpec(spec.model());
  if (!config.ok()) return config.status();
  absl::StatusOr<ScheduleConfig> schedule = ScheduleFromSpec(tr);
  if (!schedule.ok()) return schedule.status();
  // The data is opened (and token files validated) before anything else is allocated.
  std::unique_ptr<ArithmeticData> arithmetic;
  std::unique_ptr<TokenData> tokens;
  if (spec.data().source() == "token_files") {
    absl::StatusOr<std::unique_ptr<TokenData>> t =
        TokenData::Open(TokenOptions(o, spec.data().token_files(), "data.token_files", true));
    if (!t.ok()) return t.status();
    tokens = std::move(*t);
    Info(o, absl::StrCat("data: ", tokens->num_tokens(), " tokens in ", tokens->num_files(),
                         " files; ", tokens->num_windows(), " windows of ", tr.seq_len() + 1,
                         " tokens for rank ", o.rank));
  } else {
    absl::StatusOr<ArithmeticData> data = ArithmeticData::FromSpec(spec);
    if (!data.ok()) return data.status();
    arithmetic = std::make_unique<ArithmeticData>(*data);
  }
  std::unique_ptr<TokenData> eval;
  if (!spec.eval().token_files().empty()) {
    absl::StatusOr<std::unique_ptr<TokenData>> e =
        TokenData::Open(TokenOptions(o, spec.eval().token_files(), "eval.token_files", false));
    if (!e.ok()) return e.status();
    eval = std::move(*e);
    Info(o, absl::StrCat("eval: ", eval->num_tokens(), " tokens; ", spec.eval().batches(),
                         " batches every ", spec.eval().every_steps(), " steps"));
  }
  absl::StatusOr<Recompute> recompute = ParseRecompute(tr.activation_checkpointing());
  if (!recompute.ok()) return recompute.status();
  if (tr.log_every_steps() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.log_every_steps: must be positive, got ", tr.log_every_steps()));
  }
  if (spec.generation().tokens() > 0 && spec.generation().prompt_len() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("generation.prompt_len: must be positive when generation.tokens > 0, got ",
                     spec.generation().prompt_len()));
  }
  absl::StatusOr<std::unique_ptr<kernels::Backend>> backend = MakeBackend(o);
  if (!backend.ok()) return backend.status();
  (*backend)->SetDeterministic(tr.deterministic());

  ModelOptions mo;
  mo.config = *config;
  mo.batch_size = tr.batch_size();
  mo.seq_len = tr.seq_len();
  mo.grad_accum_steps = tr.grad_accum_steps();
  mo.gradient_ranks = data_parallel ? o.world_size : 1;  // DataParallel sums the gradients
  mo.adamw.beta1 = static_cast<float>(tr.beta1());
  mo.adamw.beta2 = static_cast<float>(tr.beta2());
  mo.adamw.eps = static_cast<float>(tr.eps());
  mo.adamw.weight_decay = static_cast<float>(tr.weight_decay());
  mo.adamw.grad_clip = static_cast<float>(tr.grad_clip());
  mo.seed = tr.seed();
  mo.freeze_layers.assign(tr.freeze_layers().begin(), tr.freeze_layers().end());
  mo.freeze_embeddings = tr.freeze_embeddings();
  mo.recompute = *recompute;
  mo.fp8 = Fp8OptionsFromSpec(spec);
  if (absl::Status s = common::ReadEnvSwitch(common::kEnvWeightGradOverwrite, "on", "off",
                                             &mo.overwrite_first_weight_gradients);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = common::ReadEnvSwitch(common::kEnvGradNorm, "backward", "step",
                                             &mo.grad_norm_in_backward);
      !s.ok()) {
    return s;
  }
  const bool fp8 = mo.fp8.enabled;
  if (fp8 && (*backend)->name() == "cuda") {
    // FP8 keeps its weight and LayerNorm-input transposes per layer where it then still needs
    // no more memory than BF16 (the estimate the coordinator placed the job by).
    absl::StatusOr<common::MemoryEstimate> e = common::EstimateTrainingMemory(spec, "fp8", "cuda");
    mo.fp8_keep_weight_transposes = e.ok() && e->fp8_keeps_weight_transposes;
    mo.fp8_keep_ln_input_transposes = e.ok() && e->fp8_keeps_ln_input_transposes;
    Info(o, absl::StrCat("fp8: weight transposes ",
                         mo.fp8_keep_weight_transposes ? "kept per layer" : "made in each backward",
                         ", qkv/fc1 input transposes ",
                         mo.fp8_keep_ln_input_transposes ? "kept per layer"
                                                         : "recomputed in the backward",
                         " (kept where FP8 stays within BF16's memory)"));
    if (const std::string settings = (*backend)->Fp8Settings(); !settings.empty()) {
      Info(o, absl::StrCat("fp8: ", settings));
    }
  }
  absl::StatusOr<std::unique_ptr<Model>> model_or = Model::Create(backend->get(), mo);
  if (!model_or.ok()) return model_or.status();
  Model& model = **model_or;
  if (!spec.model().init_from().empty()) {
    absl::StatusOr<std::vector<float>> weights =
        LoadGpt2Safetensors(spec.model().init_from(), model.layout());
    if (!weights.ok()) {
      return absl::Status(weights.status().code(),
                          absl::StrCat("model.init_from: ", weights.status().message()));
    }
    if (absl::Status s = model.SetParameters(*weights); !s.ok()) return s;
    Info(o, absl::StrCat("weights: loaded from ", spec.model().init_from()));
  }
  if (model.num_trainable_params() != model.num_params()) {
    Info(o, absl::StrFormat("frozen: %.2fM of %.2fM parameters (no gradients, no optimizer state)",
                            (model.num_params() - model.num_trainable_params()) / 1e6,
                            model.num_params() / 1e6));
  }

  const ModelConfig& c = *config;
  Info(o, absl::StrFormat(
              "model: %d layers, hidden %d, %d heads, ffn %d, vocab %d (padded %d), context %d%s; "
              "%.2fM parameters",
              c.layers, c.hidden, c.heads, c.ffn, c.vocab_size, c.padded_vocab_size, c.context,
              c.tie_embeddings ? ", tied head" : "", model.num_params() / 1e6));
  Info(o, absl::StrCat("backend: ", (*backend)->name(), " (",
                       kernels::DTypeName((*backend)->compute_dtype()), "); activations ",
                       MiB(model.activation_bytes()), " for ", tr.batch_size(), " x ", tr.seq_len(),
                       " tokens; total ", MiB(model.total_bytes())));

  std::unique_ptr<DataParallel> dp;
  if (data_parallel) {
    absl::StatusOr<std::unique_ptr<DataParallel>> made =
        DataParallel::Create(CommOptionsFor(o), backend->get(), &model);
    if (!made.ok()) return made.status();
    dp = *std::move(made);
    Info(o, absl::StrCat("data parallel: rank ", o.rank, " of ", o.world_size, " over ",
                         dp->communicator()->name(), ", ", model.layout().Buckets().size(),
                         " gradient buckets"));
  }
  const int64_t checksum_every = spec.resources().checksum_every_steps();

  const int B = tr.batch_size(), T = tr.seq_len(), accum = tr.grad_accum_steps();
  const int64_t total = tr.steps();
  // Mean loss over eval.batches micro-batches of the eval files, read in order.
  auto evaluate_loss = [&]() -> absl::StatusOr<double> {
    double sum = 0.0;
    for (int i = 0; i < spec.eval().batches(); ++i) {
      if (Stopped(o)) return absl::CancelledError("stopped during evaluation");
      const Batch batch = eval->GetSamples(static_cast<uint64_t>(i) * B, B);
      absl::StatusOr<double> l = model.Forward(batch.inputs, batch.targets);
      if (!l.ok()) return l.status();
      sum += *l;
    }
    return sum / spec.eval().batches();
  };
  if (o.eval_only) {
    if (!eval) {
      return absl::InvalidArgumentError("eval.token_files: needed to evaluate (--eval-only)");
    }
    absl::StatusOr<double> val = evaluate_loss();
    if (!val.ok()) return val.status();
    if (o.on_step) {
      v1::StepReport r;
      r.set_job_id(o.job_id);
      r.set_rank(o.rank);
      r.set_attempt(o.attempt);
      r.set_total_steps(total);
      r.set_loss(*val);
      r.set_val_loss(*val);
      ToProto((*backend)->GetMemoryStats(), r.mutable_memory());
      SetNow(r.mutable_time());
      o.on_step(r);
    }
    return absl::OkStatus();
  }
  const int64_t tokens_per_step = static_cast<int64_t>(B) * T * accum;
  int64_t tokens_processed = 0;
  int64_t first_step = 1;
  ResumePoint resume;  // the counters a checkpoint restores
  if (!o.checkpoint_dir.empty()) {
    auto resumed = RestoreTrainerCheckpoint(
        **backend, model, spec, o.checkpoint_dir,
        [&o](absl::string_view w) { Notice(o, absl::StrCat("warning: ", w)); });
    if (!resumed.ok()) return resumed.status();
    if (resumed->has_value()) {
      resume = **resumed;
      first_step = resume.step + 1;
      tokens_processed = resume.tokens_processed;
      Notice(o, absl::StrCat("resumed from checkpoint ", (*resumed)->path, " at step ",
                             (*resumed)->step, " of ", total));
    }
  }
  const int every = spec.checkpoint().every_steps();
  StepGraphOptions graph_options;
  graph_options.mode = tr.cuda_graph();
  graph_options.grad_accum_steps = accum;
  graph_options.collectives = dp.get();
  graph_options.profiling = o.profile_kernels;
  graph_options.on_info = [&o](absl::string_view line) { Info(o, line); };
  absl::StatusOr<std::unique_ptr<StepGraph>> step_graph =
      StepGraph::Create(backend->get(), &model, graph_options);
  if (!step_graph.ok()) return step_graph.status();
  // Optimizer steps taken (AdamW's bias correction) and the FP8 skip counters, as checkpointed.
  int64_t applied = resume.optimizer_steps;
  int64_t skipped = resume.fp8_skipped_steps;  // FP8 steps skipped for non-finite values
  int64_t consecutive_skips = resume.fp8_consecutive_skips;
  std::string first_overflow = resume.fp8_first_overflow;  // of the current run of skips
  std::vector<Fp8TensorStat> fp8_stats;
  // Step 1 of a run pays one-time costs (lazy kernel loading, GEMM plans and autotuning), so
  // the profile starts one step later when there is one.
  const int64_t profile_from = total > first_step ? first_step + 1 : first_step;
  for (int64_t step = first_step; step <= total; ++step) {
    if (o.profile_kernels && step == profile_from) (*backend)->EnableProfiling(true);
    const auto start = std::chrono::steady_clock::now();
    model.ZeroGrad();
    double loss = 0.0;
    bool finite = true;
    auto next_batch = [&](int micro) {
      return tokens ? tokens->Get(step, micro, B, accum)
                    : arithmetic->Get(o.rank, step, micro, B, T);
    };
    const double lr = LearningRate(*schedule, step);
    // A step replayed from CUDA graphs runs its micro-batches and the optimizer in there; the
    // eager loop below then has nothing to do (a stop request leaves the step to it).
    absl::StatusOr<std::optional<StepGraph::Result>> graphed = std::nullopt;
    if (!Stopped(o)) {
      graphed = (*step_graph)
                    ->Run(step, static_cast<float>(lr), static_cast<int>(applied + 1), next_batch);
      if (!graphed.ok()) return graphed.status();
      if (graphed->has_value()) {
        loss = (*graphed)->loss;
        finite = (*graphed)->applied;  // FP8: a non-finite step was skipped on the device
      }
    }
    for (int micro = 0; micro < accum && !graphed->has_value(); ++micro) {
      if (Stopped(o)) {
        return absl::CancelledError(absl::StrCat("stopped at step ", step - 1, " of ", total));
      }
      const Batch batch = next_batch(micro);
      absl::StatusOr<double> l = model.Forward(batch.inputs, batch.targets);
      if (!l.ok()) return l.status();
      if (!std::isfinite(*l)) {
        if (!fp8) {
          return absl::InternalError(
              absl::StrCat("step ", step, ": loss is ", *l,
                           " (training diverged; try a lower training.lr or training.grad_clip)"));
        }
        finite = false;
        // Data parallel: the backward still runs, so this rank joins the other ranks'
        // gradient all-reduces; the step is then skipped on every rank.
        if (dp == nullptr) {
          loss = *l;
          break;
        }
      }
      loss += *l / accum;
      if (dp != nullptr) dp->ReduceDuringNextBackward(micro == accum - 1);
      if (absl::Status s = model.Backward(); !s.ok()) return s;
    }
    double comm_exposed = 0.0;
    uint64_t checksum = 0;
    if (dp != nullptr) {
      absl::StatusOr<double> waited = dp->FinishGradients();
      if (!waited.ok()) return Annotate(waited.status(), step);
      comm_exposed = *waited;
    }
    if (fp8 && finite && !graphed->has_value()) {
      absl::StatusOr<float> norm = model.GradNorm();
      if (!norm.ok()) return norm.status();
      finite = std::isfinite(*norm);
    }
    // A replayed step decided on the device from the all-reduced gradients' norm, the same on
    // every rank (every rank replays: StepGraph's agreement).
    if (fp8 && dp != nullptr && !graphed->has_value()) {
      absl::StatusOr<bool> all = dp->AllRanksFinite(finite);
      if (!all.ok()) return Annotate(all.status(), step);
      finite = *all;
    }
    if (!finite) {
      // FP8: skip the step (no update, the step's amaxes discarded) and name the first FP8
      // tensor that saw an inf or NaN.
      if (absl::Status s = model.Fp8EndStep(/*apply=*/false, &fp8_stats); !s.ok()) return s;
      ++skipped;
      if (++consecutive_skips == 1) {
        first_overflow = Fp8State::FirstNonFinite(fp8_stats);
        if (first_overflow.empty()) {
          first_overflow = dp == nullptr ? "none of the FP8 tensors (BF16 ops overflowed)"
                                         : absl::StrCat("none of rank ", o.rank,
                                                        "'s FP8 tensors (another rank's, or a "
                                                        "BF16 op, overflowed)");
        } else if (dp != nullptr) {
          absl::StrAppend(&first_overflow, " on rank ", o.rank);
        }
      }
      Info(o,
           absl::StrCat("step ", step, ": skipped (loss ", loss,
                        ", non-finite loss or gradients; first overflow in ", first_overflow, ")"));
      if (consecutive_skips >= spec.fp8().max_consecutive_skips()) {
        return absl::InternalError(absl::StrCat(
            "step ", step, ": ", consecutive_skips,
            " consecutive steps skipped for non-finite loss or gradients (fp8.max_consecutive_"
            "skips ",
            spec.fp8().max_consecutive_skips(),
            "); the first tensor that overflowed: ", first_overflow));
      }
      continue;
    }
    consecutive_skips = 0;
    ++applied;
    absl::StatusOr<float> norm =
        graphed->has_value()
            ? absl::StatusOr<float>((*graphed)->grad_norm)
            : model.OptimizerStep(static_cast<float>(lr), static_cast<int>(applied));
    if (!norm.ok()) return norm.status();
    if (dp != nullptr) {
      absl::StatusOr<double> mean = dp->AverageLoss(loss);
      if (!mean.ok()) return Annotate(mean.status(), step);
      loss = *mean;
      if ((checksum_every > 0 && step % checksum_every == 0) || step == total) {
        absl::StatusOr<uint64_t> agreed = dp->CheckReplicas(step);
        if (!agreed.ok()) return Annotate(agreed.status(), step);
        checksum = *agreed;
      }
    }
    const bool evaluate = eval && (step % spec.eval().every_steps() == 0 || step == total);
    const bool report =
        o.on_step && (step % tr.log_every_steps() == 0 || step == total || evaluate);
    if (fp8) {
      if (dp != nullptr && !graphed->has_value()) {  // a replayed step reduced them on the device
        if (absl::Status s = dp->ReduceFp8Amaxes(model.fp8_state()); !s.ok()) {
          return Annotate(s, step);
        }
      }
      std::vector<Fp8TensorStat>* stats = report ? &fp8_stats : nullptr;
      if (absl::Status s = graphed->has_value() ? model.Fp8EndReplayedStep(stats)
                                                : model.Fp8EndStep(/*apply=*/true, stats);
          !s.ok()) {
        return s;
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    tokens_processed += tokens_per_step;

    double val_loss = 0.0;
    if (evaluate) {
      absl::StatusOr<double> val = evaluate_loss();
      if (!val.ok()) return val.status();
      val_loss = *val;
    }

    if (report) {
      v1::StepReport r;
      r.set_job_id(o.job_id);
      r.set_rank(o.rank);
      r.set_attempt(o.attempt);
      r.set_step(step);
      r.set_total_steps(total);
      r.set_loss(loss);
      r.set_lr(lr);
      r.set_grad_norm(*norm);
      r.set_step_time_seconds(seconds);
      r.set_tokens_per_second(seconds > 0 ? tokens_per_step / seconds : 0.0);
      ToProto((*backend)->GetMemoryStats(), r.mutable_memory());
      SetNow(r.mutable_time());
      r.set_tokens_processed(tokens_processed);
      if (evaluate) r.set_val_loss(val_loss);
      r.set_comm_exposed_seconds(comm_exposed);
      r.set_param_checksum(checksum);
      r.set_cuda_graph(graphed->has_value());
      if (fp8) {
        ToProto(fp8_stats, &r);
        r.set_skipped_steps(skipped);
      }
      o.on_step(r);
    }
    if (!o.checkpoint_dir.empty() && o.rank == 0 && every > 0 && step % every == 0 &&
        step < total) {
      TrainerProgress progress;
      progress.step = step;
      progress.tokens_processed = tokens_processed;
      progress.optimizer_steps = applied;
      progress.fp8_skipped_steps = skipped;
      progress.fp8_consecutive_skips = consecutive_skips;
      progress.fp8_first_overflow = first_overflow;
      absl::Status saved = SaveTrainerCheckpoint(**backend, model, spec, o.checkpoint_dir, progress,
                                                 spec.checkpoint().keep_last());
      if (!saved.ok()) {
        Notice(o, absl::StrCat("warning: checkpoint at step ", step,
                               " not written: ", saved.message()));
      }
    }
  }

  if (o.profile_kernels) {
    const std::string report = (*backend)->ProfileReport();
    if (!report.empty()) {
      Info(o, absl::StrCat("device time per op over steps ", profile_from, "-", total, ":\n",
                           report));
    }
    (*backend)->EnableProfiling(false);
  }
  if (!o.weights_out.empty()) {
    absl::StatusOr<std::vector<float>> weights = model.GetParameters();
    if (!weights.ok()) return weights.status();
    if (absl::Status s = WriteGpt2Safetensors(o.weights_out, model.layout(), *weights); !s.ok()) {
      return s;
    }
    Info(o, absl::StrCat("weights: wrote ", o.weights_out, " (safetensors, GPT-2 names)"));
  }
  const int n = spec.generation().tokens();
  if (n > 0) {
    if (Stopped(o)) {
      return absl::CancelledError(
          absl::StrCat("stopped after step ", total, ", before generation"));
    }
    const std::vector<int32_t> prompt = tokens ? tokens->Prompt(spec.generation().prompt_len())
                                               : arithmetic->Prompt(spec.generation().prompt_len());
    absl::StatusOr<std::vector<int32_t>> generated = model.Generate(prompt, n);
    if (!generated.ok()) return generated.status();
    if (o.on_generation) {
      v1::GenerationResult g;
      g.mutable_prompt()->Add(prompt.begin(), prompt.end());
      g.mutable_tokens()->Add(generated->begin(), generated->end());
      o.on_generation(g);
    }
  }
  return absl::OkStatus();
}

}  // namespace boulder::engine
