// The trainer's state as checkpoint sections (see checkpoint.h for the file format and the
// section list): saving a Model's parameters and optimizer state with the step, token count,
// data position and RNG seeds, and restoring them so a resumed run continues exactly where
// the checkpoint was taken (bit for bit on the cpu backend: every input of the next step is
// restored and the step itself is deterministic).
//
// Thread-safety: as the Model (one thread).
#ifndef BOULDER_WORKER_ENGINE_TRAINER_CHECKPOINT_H_
#define BOULDER_WORKER_ENGINE_TRAINER_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "boulder/v1/spec.pb.h"
#include "kernels/backend.h"
#include "worker/engine/model.h"

namespace boulder::engine {

// The training loop's counters a checkpoint carries.
struct TrainerProgress {
  int64_t step = 0;              // training steps completed (applied or skipped)
  int64_t tokens_processed = 0;  // cumulative, this rank
  // AdamW steps taken (its bias correction): `step` less the FP8 steps skipped. A checkpoint
  // without the key (written before it existed) resumes with `step`.
  int64_t optimizer_steps = 0;
  // FP8 (precision fp8): steps skipped for non-finite loss or gradients, in all and in the
  // current run, and the tensor that first overflowed in that run. The trainer checkpoints
  // after applied steps only, so the run is normally 0 and its tensor empty.
  int64_t fp8_skipped_steps = 0;
  int64_t fp8_consecutive_skips = 0;
  std::string fp8_first_overflow;
};

// Where a resumed run continues from.
struct ResumePoint : TrainerProgress {
  std::string path;  // the file it came from
};

// Writes the state after progress.step completed steps into `dir` and prunes to keep_last.
// With FP8 (model.fp8_state() set) the FP8 scaling state goes into the "fp8_scaling" section.
// Errors: from SaveCheckpoint (the OS error with the path).
absl::Status SaveTrainerCheckpoint(kernels::Backend& backend, const Model& model,
                                   const v1::JobSpec& spec, const std::string& dir,
                                   const TrainerProgress& progress, int keep_last);

// Loads the newest valid checkpoint in `dir` into `model`. Corrupt or truncated newer files
// are skipped, each reported through on_warning ("checkpoint <path> is corrupt (...);
// skipped"). nullopt: no usable checkpoint (train from step 0).
// FP8: the scaling state is restored from the "fp8_scaling" section, so the resumed run
// continues with the same scales and amax histories (bit for bit on the cpu emulation). A
// checkpoint without that section (written by an older build, or by a run in another
// precision) still loads: the FP8 scaling state starts afresh (scales 1, empty histories) and
// on_warning says so. A non-FP8 job ignores the section, also with a warning.
// FAILED_PRECONDITION: the checkpoint belongs to another job shape (model, dtype, seed,
// batch), or is past training.steps, or its FP8 scaling state was made for another
// fp8.amax_history_len or fp8.format; names the mismatch. DATA_LOSS: a malformed FP8 section.
absl::StatusOr<std::optional<ResumePoint>> RestoreTrainerCheckpoint(
    kernels::Backend& backend, Model& model, const v1::JobSpec& spec, const std::string& dir,
    const std::function<void(absl::string_view)>& on_warning);

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_TRAINER_CHECKPOINT_H_
