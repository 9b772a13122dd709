// Defaults and validation of the job spec's reliability fields: `checkpoint` and
// `max_restarts`. Called by ResolveJobSpec (spec_resolve.cc); kept apart so the checkpoint
// rules have one place.
//
// Defaults: checkpoint.every_steps 100, checkpoint.keep_last 2, checkpoint.dir "" (the worker
// uses "job-<id>" under its --checkpoint-root), max_restarts 3.
// Thread-safe: plain functions over values.
#ifndef BOULDER_COMMON_SPEC_CHECKPOINT_H_
#define BOULDER_COMMON_SPEC_CHECKPOINT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "boulder/v1/spec.pb.h"

namespace boulder::common {

inline constexpr int32_t kDefaultCheckpointEverySteps = 100;
inline constexpr int32_t kDefaultCheckpointKeepLast = 2;
inline constexpr int32_t kDefaultMaxRestarts = 3;
inline constexpr int32_t kMaxMaxRestarts = 100;
inline constexpr int32_t kMaxCheckpointKeepLast = 1000;

// Fills unset checkpoint fields and max_restarts with the defaults above.
void FillCheckpointDefaults(v1::JobSpec* spec);

// INVALID_ARGUMENT with the field path: every_steps < 0, keep_last outside
// [1, kMaxCheckpointKeepLast], max_restarts outside [0, kMaxMaxRestarts], a dir that is
// absolute, contains a ".." component, an empty component, a backslash or a control
// character, or is longer than 255 bytes.
absl::Status ValidateCheckpoint(const v1::JobSpec& spec);

// The checkpoint directory of job `job_id` under `root`: root/<checkpoint.dir>, or
// root/job-<id> when checkpoint.dir is empty. REQUIRES: `spec` passed ValidateCheckpoint.
std::string CheckpointDirectory(absl::string_view root, const v1::JobSpec& spec, int64_t job_id);

}  // namespace boulder::common

#endif  // BOULDER_COMMON_SPEC_CHECKPOINT_H_
