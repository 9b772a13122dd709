// The training loop of one trainer process: builds the backend, model and data for a resolved
// JobSpec, trains training.steps optimizer steps of grad_accum_steps micro-batches each,
// reports progress, and generates greedily at the end.
//
// Reports go through callbacks, called on the thread running Run(): a StepReport after every
// training.log_every_steps-th step and after the last one; a GenerationResult once after
// training when generation.tokens > 0; free-form info lines (model size, backend, arena) at
// start-up.
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

  // Set (by another thread or a signal handler) to stop: Run() returns CANCELLED at the next
  // micro-batch boundary. May be null.
  const std::atomic<bool>* stop = nullptr;

  // Time every backend op on the device and pass the per-op table to on_info at the end
  // (backends without device timers print nothing).
  bool profile_kernels = false;

  // Each may be empty.
  std::function<void(const v1::StepReport&)> on_step;
  std::function<void(const v1::GenerationResult&)> on_generation;
  std::function<void(absl::string_view)> on_info;
};

// Trains the job. OK: every step ran (and generation, if asked). Errors:
//   INVALID_ARGUMENT    the spec is not resolved or not trainable (names the field);
//   FAILED_PRECONDITION this build cannot run it (backend "cuda", precision other than fp32
//                       on the cpu backend, fp8 without fp8.emulate on a GPU below compute
//                       capability 8.9 or without a GPU);
//   UNIMPLEMENTED       world_size > 1 (data-parallel training needs worker/comm);
//   CANCELLED           *stop was set (names the step reached);
//   INTERNAL            the loss became non-finite (names the step); in FP8 such steps are
//                       skipped and counted (StepReport.skipped_steps) and the job fails
//                       after fp8.max_consecutive_skips in a row, naming the first FP8
//                       tensor that overflowed;
//   RESOURCE_EXHAUSTED  the model does not fit in memory;
//   other codes         from the backend.
absl::Status RunTrainer(const TrainerOptions& options);

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_TRAINER_H_
