#include "client/progress.h"

#include <map>
#include <string>

#include "client/table.h"
#include "gtest/gtest.h"

namespace boulder::client {
namespace {

std::string Repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

v1::StepReport Report(int64_t step, int64_t total) {
  v1::StepReport r;
  r.set_step(step);
  r.set_total_steps(total);
  r.set_loss(0.4321);
  r.set_lr(3e-4);
  r.set_tokens_per_second(12345.4);
  return r;
}

constexpr char kTail[] = "loss 0.4321  lr 3.0e-04  12,345 tok/s  ETA 0:42";

TEST(RenderProgressBarTest, WideTerminalCapsTheBarAtFortyCells) {
  std::string line = RenderProgressBar(Report(120, 200), absl::Seconds(42), 120);
  EXPECT_EQ(line, "step 120/200 [" + Repeat("█", 24) + Repeat("░", 16) + "] " + kTail);
}

TEST(RenderProgressBarTest, EightyColumnsFillsTheLineWithEighthBlocks) {
  std::string line = RenderProgressBar(Report(120, 200), absl::Seconds(42), 80);
  // 79 usable columns leave 16 cells; 60% of 16 = 9.6 cells = 9 full + 4/8.
  EXPECT_EQ(line, "step 120/200 [" + Repeat("█", 9) + "▌" + Repeat("░", 6) + "] " + kTail);
  EXPECT_EQ(DisplayWidth(line), 79u);
}

TEST(RenderProgressBarTest, NarrowTerminalDropsDetailsBeforeTheBar) {
  std::string line = RenderProgressBar(Report(120, 200), absl::Seconds(42), 60);
  // Without lr and tok/s: 59 - 12 - 21 - 4 = 22 cells.
  EXPECT_EQ(line,
            "step 120/200 [" + Repeat("█", 13) + "▏" + Repeat("░", 8) + "] loss 0.4321  ETA 0:42");
  EXPECT_LE(DisplayWidth(line), 59u);
}

TEST(RenderProgressBarTest, VeryNarrowTerminalDropsTheBarAndTruncates) {
  std::string line = RenderProgressBar(Report(120, 200), absl::Seconds(42), 30);
  EXPECT_EQ(line, "step 120/200 loss 0.4321  ETA");
}

TEST(RenderProgressBarTest, CompleteAndEmptyBars) {
  EXPECT_EQ(
      RenderProgressBar(Report(200, 200), absl::ZeroDuration(), 120),
      "step 200/200 [" + Repeat("█", 40) + "] loss 0.4321  lr 3.0e-04  12,345 tok/s  ETA 0:00");
  // No total known: an empty bar, not a division by zero.
  EXPECT_EQ(RenderProgressBar(Report(0, 0), absl::InfiniteDuration(), 120),
            "step 0/0 [" + Repeat("░", 40) + "] loss 0.4321  lr 3.0e-04  12,345 tok/s  ETA --:--");
}

TEST(RenderProgressLineTest, PlainLineWithPercentage) {
  EXPECT_EQ(RenderProgressLine(Report(120, 200), absl::Seconds(42)),
            "step 120/200 (60%)  loss 0.4321  lr 3.0e-04  12,345 tok/s  ETA 0:42");
}

TEST(StepTimeTextTest, MillisecondsBelowASecond) {
  EXPECT_EQ(StepTimeText(0.0412), "41.2 ms");
  EXPECT_EQ(StepTimeText(0.9994), "999.4 ms");
  EXPECT_EQ(StepTimeText(1.5249), "1.52 s");
}

TEST(RankStepTimesLineTest, AllRanksWhenTheyFit) {
  EXPECT_EQ(RankStepTimesLine({{0, 0.0412}, {1, 0.043}}, 80), "rank 0: 41.2 ms  rank 1: 43.0 ms");
}

TEST(RankStepTimesLineTest, TheFirstRanksAndACountWhenNarrow) {
  const std::map<int32_t, double> times = {{0, 0.0412}, {1, 0.043}, {2, 0.0415}};
  // All three need 49 columns, two and "+1 more" 41; 39 are usable.
  EXPECT_EQ(RankStepTimesLine(times, 40), "rank 0: 41.2 ms  +2 more");
  EXPECT_EQ(RankStepTimesLine(times, 50), "rank 0: 41.2 ms  rank 1: 43.0 ms  rank 2: 41.5 ms");
  EXPECT_EQ(RankStepTimesLine(times, 11), "rank 0: 41");
}

TEST(ChartRowsForTest, AThirdOfTheRoomUpToEight) {
  EXPECT_EQ(ChartRowsFor(24), 6);
  EXPECT_EQ(ChartRowsFor(30), 8);
  EXPECT_EQ(ChartRowsFor(200), 8);
  EXPECT_EQ(ChartRowsFor(10), 2);
  EXPECT_EQ(ChartRowsFor(9), 0);
}

TEST(EtaEstimatorTest, UnknownUntilAStepTimeIsSeen) {
  EtaEstimator eta;
  EXPECT_EQ(eta.Eta(), absl::InfiniteDuration());
  v1::StepReport r = Report(1, 10);
  eta.Add(r);
  EXPECT_EQ(eta.Eta(), absl::InfiniteDuration());
}

TEST(EtaEstimatorTest, SmoothsReportedStepTimes) {
  EtaEstimator eta;
  v1::StepReport r = Report(100, 200);
  r.set_step_time_seconds(0.5);
  eta.Add(r);
  EXPECT_NEAR(absl::ToDoubleSeconds(eta.Eta()), 50.0, 1e-9);
  r.set_step(101);
  r.set_step_time_seconds(1.0);
  eta.Add(r);
  // EMA 0.3 * 1.0 + 0.7 * 0.5 = 0.65 s per step, 99 steps left.
  EXPECT_NEAR(absl::ToDoubleSeconds(eta.Eta()), 0.65 * 99, 1e-9);
  r.set_step(200);
  eta.Add(r);
  EXPECT_EQ(eta.Eta(), absl::ZeroDuration());
}

TEST(EtaEstimatorTest, FallsBackToReportTimestamps) {
  EtaEstimator eta;
  v1::StepReport r = Report(10, 110);
  r.mutable_time()->set_seconds(1000);
  eta.Add(r);
  r.set_step(20);
  r.mutable_time()->set_seconds(1020);  // 10 steps in 20 s
  eta.Add(r);
  EXPECT_NEAR(absl::ToDoubleSeconds(eta.Eta()), 2.0 * 90, 1e-9);
}

TEST(StepLineThrottleTest, FirstEverySecondEveryTenthAndLast) {
  StepLineThrottle throttle;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(throttle.ShouldPrint(1, 1000, t0));
  EXPECT_FALSE(throttle.ShouldPrint(2, 1000, t0 + absl::Milliseconds(100)));
  EXPECT_FALSE(throttle.ShouldPrint(3, 1000, t0 + absl::Milliseconds(999)));
  EXPECT_TRUE(throttle.ShouldPrint(4, 1000, t0 + absl::Seconds(1)));
  // 10% of the run since the last printed line (step 4), within the same second.
  EXPECT_FALSE(throttle.ShouldPrint(103, 1000, t0 + absl::Milliseconds(1100)));
  EXPECT_TRUE(throttle.ShouldPrint(104, 1000, t0 + absl::Milliseconds(1200)));
  // The last step always, once.
  EXPECT_TRUE(throttle.ShouldPrint(1000, 1000, t0 + absl::Milliseconds(1300)));
  EXPECT_FALSE(throttle.ShouldPrint(1000, 1000, t0 + absl::Milliseconds(1400)));
}

}  // namespace
}  // namespace boulder::client
