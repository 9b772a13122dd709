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

// Where a resumed run continues from.
struct ResumePoint {
  int64_t step = 0;              // optimizer steps completed
  int64_t tokens_processed = 0;  // cumulative, this rank
  std::string path;              // the file it came from
};

// Writes the state after `step` completed steps into `dir` and prunes to keep_last.
// Errors: from SaveCheckpoint (the OS error with the path).
absl::Status SaveTrainerCheckpoint(kernels::Backend& backend, const Model& model,
                                   const v1::JobSpec& spec, const std::string& dir, int64_t step,
                                   int64_t tokens_processed, int keep_last);

// Loads the newest valid checkpoint in `dir` into `model`. Corrupt or truncated newer files
// are skipped, each reported through on_warning ("checkpoint <path> is corrupt (...);
// skipped"). nullopt: no usable checkpoint (train from step 0).
// FAILED_PRECONDITION: the checkpoint belongs to another job shape (model, dtype, seed,
// batch), or is past training.steps; names the mismatch.
absl::StatusOr<std::optional<ResumePoint>> RestoreTrainerCheckpoint(
    kernels::Backend& backend, Model& model, const v1::JobSpec& spec, const std::string& dir,
    const std::function<void(absl::string_view)>& on_warning);

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_TRAINER_CHECKPOINT_H_
