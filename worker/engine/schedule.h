// Learning-rate schedules: linear warm-up, then constant, cosine or linear decay.
//
// For step s (1-based) of total S with W warm-up steps and peak lr:
//   s <= W:  lr * s / W                     (reaches the peak at step W)
//   s >  W:  progress p = (s - W) / (S - W) in (0, 1]; floor f = min_lr_ratio * lr
//            constant: lr;  linear: lr - p (lr - f);  cosine: f + (lr - f) (1 + cos(pi p)) / 2
// so the decayed schedules reach the floor exactly at the last step.
//
// Thread-safety: a value; Lr() is const.
#ifndef BOULDER_WORKER_ENGINE_SCHEDULE_H_
#define BOULDER_WORKER_ENGINE_SCHEDULE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "boulder/v1/spec.pb.h"

namespace boulder::engine {

enum class ScheduleKind { kConstant, kLinear, kCosine };

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::kCosine;
  double lr = 3e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.0;
};

// The schedule of a resolved spec's training section. INVALID_ARGUMENT (with the field path)
// for an unknown schedule name or impossible values.
absl::StatusOr<ScheduleConfig> ScheduleFromSpec(const v1::TrainingSpec& spec);

// The learning rate of 1-based step `step`; steps past the end keep the last value.
double LearningRate(const ScheduleConfig& config, int64_t step);

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_SCHEDULE_H_
