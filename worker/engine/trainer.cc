#include "worker/engine/trainer.h"

#include <chrono>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/backend.h"
#include "worker/engine/data.h"
#include "worker/engine/data_parallel.h"
#include "worker/engine/model.h"
#include "worker/engine/param_layout.h"
#include "worker/engine/schedule.h"

namespace boulder::engine {
namespace {

bool Stopped(const TrainerOptions& o) {
  return o.stop != nullptr && o.stop->load(std::memory_order_relaxed);
}

void Info(const TrainerOptions& o, absl::string_view line) {
  if (o.on_info) o.on_info(line);
}

std::string MiB(size_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
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

comm::CommOptions CommOptionsFor(const TrainerOptions& o) {
  comm::CommOptions c;
  c.rank = o.rank;
  c.world_size = o.world_size;
  c.job_id = o.job_id;
  c.attempt = o.attempt;
  c.coordinator = o.coordinator;
  c.host = o.comm_host;
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
  absl::StatusOr<ArithmeticData> data = ArithmeticData::FromSpec(spec);
  if (!data.ok()) return data.status();
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

  ModelOptions mo;
  mo.config = *config;
  mo.batch_size = tr.batch_size();
  mo.seq_len = tr.seq_len();
  mo.grad_accum_steps = tr.grad_accum_steps();
  mo.adamw.beta1 = static_cast<float>(tr.beta1());
  mo.adamw.beta2 = static_cast<float>(tr.beta2());
  mo.adamw.eps = static_cast<float>(tr.eps());
  mo.adamw.weight_decay = static_cast<float>(tr.weight_decay());
  mo.adamw.grad_clip = static_cast<float>(tr.grad_clip());
  mo.seed = tr.seed();
  absl::StatusOr<std::unique_ptr<Model>> model_or = Model::Create(backend->get(), mo);
  if (!model_or.ok()) return model_or.status();
  Model& model = **model_or;

  if (o.profile_kernels) (*backend)->EnableProfiling(true);
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
  const int64_t tokens_per_step = static_cast<int64_t>(B) * T * accum;
  int64_t tokens_processed = 0;
  for (int64_t step = 1; step <= total; ++step) {
    const auto start = std::chrono::steady_clock::now();
    model.ZeroGrad();
    double loss = 0.0;
    for (int micro = 0; micro < accum; ++micro) {
      if (Stopped(o)) {
        return absl::CancelledError(absl::StrCat("stopped at step ", step - 1, " of ", total));
      }
      const Batch batch = data->Get(o.rank, step, micro, B, T);
      absl::StatusOr<double> l = model.Forward(batch.inputs, batch.targets);
      if (!l.ok()) return l.status();
      if (!std::isfinite(*l)) {
        return absl::InternalError(
            absl::StrCat("step ", step, ": loss is ", *l,
                         " (training diverged; try a lower training.lr or training.grad_clip)"));
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
    const double lr = LearningRate(*schedule, step);
    absl::StatusOr<float> norm =
        model.OptimizerStep(static_cast<float>(lr), static_cast<int>(step));
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
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    tokens_processed += tokens_per_step;

    if (o.on_step && (step % tr.log_every_steps() == 0 || step == total)) {
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
      r.set_comm_exposed_seconds(comm_exposed);
      r.set_param_checksum(checksum);
      o.on_step(r);
    }
  }

  if (o.profile_kernels) {
    const std::string report = (*backend)->ProfileReport();
    if (!report.empty()) Info(o, absl::StrCat("device time per op over ", total, " steps:\n", report));
    (*backend)->EnableProfiling(false);
  }
  const int n = spec.generation().tokens();
  if (n > 0) {
    if (Stopped(o)) {
      return absl::CancelledError(
          absl::StrCat("stopped after step ", total, ", before generation"));
    }
    const std::vector<int32_t> prompt = data->Prompt(spec.generation().prompt_len());
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
