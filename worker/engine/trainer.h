// The training loop of one trainer process: builds the backend, model and data for a resolved
// JobSpec, trains training.steps optimizer steps of grad_accum_steps micro-batches each,
// reports progress, and generates greedily at the end.
//
// Reports go through callbacks, called on the thread running Run(): a StepReport after every
// training.log_every_steps-th step and after the last one; a GenerationResult once after
// training when generation.tokens > 0; free-form info lines (model size, backend, arena) at
// start-up.
//
// With a checkpoint_dir, a run resumes from the newest valid checkpoint there (step k):
// steps k+1.. run with the restored parameters, optimizer state, data position and (precision
// fp8) FP8 scaling state and skip counters, so on the cpu backend (FP8 emulation included) the
// losses equal an uninterrupted run's bit for bit. A failed checkpoint write
// is reported through on_notice and training goes on (the previous checkpoint stays).
//
// Thread-safety: Run() is a blocking call; `stop` may be set from any thread or from a signal
// handler (it is only read).
#ifndef BOULDER_WORKER_ENGINE_TRAINER_H_
#define BOULDER_WORKER_ENGINE_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "boulder/v1/job.pb.h"
#include "boulder/v1/spec.pb.h"
#include "common/grpc_security.h"

namespace boulder::engine {

struct TrainerOptions {
  // The job, resolved (common::LoadJobSpec / ResolveJobSpec): every field set.
  v1::JobSpec spec;
  // "auto", "cpu" or "cuda"; empty: spec.resources.backend. "auto" picks cpu in a build
  // without the CUDA backend.
  std::string backend;
  // CPU threads for the cpu backend; 0: all cores.
  int threads = 0;

  // Identity copied into every StepReport.
  int64_t job_id = 0;
  int32_t attempt = 0;
  int32_t rank = 0;
  int32_t world_size = 1;

  // Data parallelism (world_size > 1, see data_parallel.h): the coordinator ("HOST:PORT")
  // whose rendezvous store connects the ranks, and the address this rank's Gloo listens on
  // (empty: comm::DefaultCommHost). With world_size 1 no communicator is made unless
  // force_communicator is set (a 1-rank run through the data-parallel path, for tests).
  std::string coordinator;
  std::string comm_host;
  // How the rendezvous reaches the coordinator: TLS and the worker join token, as the agent
  // does (the agent passes its own settings on the trainer's command line).
  common::ChannelSecurityOptions security;
  bool force_communicator = false;

  // Set (by another thread or a signal handler) to stop: Run() returns CANCELLED at the next
  // micro-batch boundary. May be null.
  const std::atomic<bool>* stop = nullptr;

  // Time every backend op on the device and pass the per-op table to on_info at the end
  // (backends without device timers print nothing).
  bool profile_kernels = false;

  // Checkpoints (checkpoint.h): when non-empty, the trainer resumes from the newest valid
  // checkpoint here and writes one every spec.checkpoint.every_steps steps (rank 0), keeping
  // spec.checkpoint.keep_last. Empty: no checkpoints.
  std::string checkpoint_dir;

  // When set, the trained weights are written here at the end of training (safetensors, GPT-2
  // names, see safetensors.h), before generation.
  std::string weights_out;
  // Only evaluate: build the model (with model.init_from), report one StepReport (step 0)
  // whose loss and val_loss are the eval files' mean loss, and return. Needs eval.token_files.
  bool eval_only = false;

  // Each may be empty.
  std::function<void(const v1::StepReport&)> on_step;
  std::function<void(const v1::GenerationResult&)> on_generation;
  std::function<void(absl::string_view)> on_info;
  // Lines for the job's log even from a quiet trainer: "resumed from checkpoint ... at step
  // k", "warning: checkpoint ... is corrupt (...); skipped", a failed checkpoint write.
  std::function<void(absl::string_view)> on_notice;
};

// Trains the job. OK: every step ran (and generation, if asked). Errors:
//   INVALID_ARGUMENT    the spec is not resolved or not trainable (names the field);
//   FAILED_PRECONDITION this build cannot run it (backend "cuda", precision other than fp32
//                       on the cpu backend, fp8 without fp8.emulate on a GPU below compute
//                       capability 8.9 or without a GPU);
//   INVALID_ARGUMENT    also: rank outside [0, world_size), or no coordinator for world_size > 1;
//   DEADLINE_EXCEEDED, UNAVAILABLE  data parallelism: a rank never arrived, died or hung (the
//                       message names it) within resources.collective_timeout_seconds;
//   INTERNAL            also: the ranks' parameter replicas diverged (names the ranks);
//   CANCELLED           *stop was set (names the step reached);
//   INTERNAL            the loss became non-finite (names the step); in FP8 such steps are
//                       skipped and counted (StepReport.skipped_steps) and the job fails
//                       after fp8.max_consecutive_skips in a row, naming the first FP8
//                       tensor that overflowed;
//   RESOURCE_EXHAUSTED  the model does not fit in memory (names the allocation);
//   FAILED_PRECONDITION also: the checkpoint directory holds another job's checkpoint;
//   other codes         from the backend.
absl::Status RunTrainer(const TrainerOptions& options);

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_TRAINER_H_
