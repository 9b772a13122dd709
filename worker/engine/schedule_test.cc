#include "worker/engine/schedule.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::engine {
namespace {

using ::testing::HasSubstr;

ScheduleConfig Make(ScheduleKind kind) {
  ScheduleConfig c;
  c.kind = kind;
  c.lr = 1e-3;
  c.warmup_steps = 10;
  c.total_steps = 110;
  c.min_lr_ratio = 0.1;
  return c;
}

TEST(ScheduleTest, WarmupIsLinearToThePeak) {
  for (ScheduleKind k : {ScheduleKind::kConstant, ScheduleKind::kLinear, ScheduleKind::kCosine}) {
    const ScheduleConfig c = Make(k);
    EXPECT_DOUBLE_EQ(LearningRate(c, 1), 1e-4);
    EXPECT_DOUBLE_EQ(LearningRate(c, 5), 5e-4);
    EXPECT_DOUBLE_EQ(LearningRate(c, 10), 1e-3);
  }
}

TEST(ScheduleTest, ConstantStaysAtThePeak) {
  const ScheduleConfig c = Make(ScheduleKind::kConstant);
  EXPECT_DOUBLE_EQ(LearningRate(c, 11), 1e-3);
  EXPECT_DOUBLE_EQ(LearningRate(c, 110), 1e-3);
}

TEST(ScheduleTest, LinearDecaysToTheFloorAtTheLastStep) {
  const ScheduleConfig c = Make(ScheduleKind::kLinear);
  // Progress (s - 10) / 100; floor 1e-4.
  EXPECT_NEAR(LearningRate(c, 11), 1e-3 - 0.01 * 9e-4, 1e-15);
  EXPECT_NEAR(LearningRate(c, 60), 5.5e-4, 1e-15);
  EXPECT_NEAR(LearningRate(c, 110), 1e-4, 1e-15);
  EXPECT_NEAR(LearningRate(c, 500), 1e-4, 1e-15);  // past the end: the last value
}

TEST(ScheduleTest, CosineDecaysToTheFloorAtTheLastStep) {
  const ScheduleConfig c = Make(ScheduleKind::kCosine);
  EXPECT_NEAR(LearningRate(c, 60), 1e-4 + 9e-4 * 0.5, 1e-15);  // half way: the mean
  EXPECT_NEAR(LearningRate(c, 35), 1e-4 + 9e-4 * 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-15);
  EXPECT_NEAR(LearningRate(c, 110), 1e-4, 1e-15);
}

TEST(ScheduleTest, NoWarmupStartsAtThePeak) {
  ScheduleConfig c = Make(ScheduleKind::kCosine);
  c.warmup_steps = 0;
  c.total_steps = 3;
  c.min_lr_ratio = 0.0;
  EXPECT_NEAR(LearningRate(c, 1), 1e-3 * 0.5 * (1 + std::cos(M_PI / 3)), 1e-15);
  EXPECT_NEAR(LearningRate(c, 3), 0.0, 1e-15);
}

TEST(ScheduleTest, FromSpecMapsNamesAndRejectsUnknown) {
  v1::TrainingSpec t;
  t.set_schedule("linear");
  t.set_lr(3e-4);
  t.set_steps(200);
  t.set_warmup_steps(20);
  t.set_min_lr_ratio(0.1);
  absl::StatusOr<ScheduleConfig> c = ScheduleFromSpec(t);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kind, ScheduleKind::kLinear);
  EXPECT_EQ(c->total_steps, 200);
  EXPECT_EQ(c->warmup_steps, 20);
  t.set_schedule("step");
  const absl::Status s = ScheduleFromSpec(t).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("training.schedule: unknown 'step'"));
}

}  // namespace
}  // namespace boulder::engine
