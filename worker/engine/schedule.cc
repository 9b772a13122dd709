#include "worker/engine/schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace boulder::engine {

absl::StatusOr<ScheduleConfig> ScheduleFromSpec(const v1::TrainingSpec& spec) {
  ScheduleConfig c;
  if (spec.schedule() == "constant") {
    c.kind = ScheduleKind::kConstant;
  } else if (spec.schedule() == "linear") {
    c.kind = ScheduleKind::kLinear;
  } else if (spec.schedule() == "cosine") {
    c.kind = ScheduleKind::kCosine;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("training.schedule: unknown '", spec.schedule(),
                                                   "' (expected cosine, linear or constant)"));
  }
  if (!(spec.lr() > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.lr: must be positive, got ", spec.lr()));
  }
  if (spec.steps() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.steps: must be positive, got ", spec.steps()));
  }
  if (spec.warmup_steps() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.warmup_steps: must be >= 0, got ", spec.warmup_steps()));
  }
  if (spec.min_lr_ratio() < 0.0 || spec.min_lr_ratio() > 1.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.min_lr_ratio: ", spec.min_lr_ratio(), " is not in [0, 1]"));
  }
  c.lr = spec.lr();
  c.warmup_steps = spec.warmup_steps();
  c.total_steps = spec.steps();
  c.min_lr_ratio = spec.min_lr_ratio();
  return c;
}

double LearningRate(const ScheduleConfig& c, int64_t step) {
  step = std::clamp<int64_t>(step, 1, std::max<int64_t>(c.total_steps, 1));
  if (step <= c.warmup_steps) {
    return c.lr * static_cast<double>(step) / static_cast<double>(c.warmup_steps);
  }
  if (c.kind == ScheduleKind::kConstant) return c.lr;
  const double floor = c.min_lr_ratio * c.lr;
  const double p = static_cast<double>(step - c.warmup_steps) /
                   static_cast<double>(c.total_steps - c.warmup_steps);
  if (c.kind == ScheduleKind::kLinear) return c.lr - p * (c.lr - floor);
  return floor + (c.lr - floor) * 0.5 * (1.0 + std::cos(M_PI * p));
}

}  // namespace boulder::engine
