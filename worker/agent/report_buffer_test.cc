#include "worker/agent/report_buffer.h"

#include "gtest/gtest.h"

namespace boulder::agent {
namespace {

v1::StepReport Step(int n) {
  v1::StepReport step;
  step.set_step(n);
  return step;
}

v1::LogLine Log(const std::string& text) {
  v1::LogLine log;
  log.set_text(text);
  return log;
}

TEST(ReportBufferTest, TakesOldestFirstInBatches) {
  ReportBuffer buffer({/*max_steps=*/10, /*max_logs=*/10});
  for (int i = 1; i <= 5; ++i) buffer.AddStep(Step(i));
  buffer.AddLog(Log("a"));
  ReportBatch first = buffer.Take(3, 3);
  ASSERT_EQ(first.steps.size(), 3u);
  EXPECT_EQ(first.steps[0].step(), 1);
  EXPECT_EQ(first.steps[2].step(), 3);
  ASSERT_EQ(first.logs.size(), 1u);
  ReportBatch second = buffer.Take(3, 3);
  ASSERT_EQ(second.steps.size(), 2u);
  EXPECT_EQ(second.steps[0].step(), 4);
  EXPECT_TRUE(buffer.empty());
}

TEST(ReportBufferTest, DropsTheOldestBeyondTheLimits) {
  ReportBuffer buffer({/*max_steps=*/3, /*max_logs=*/2});
  for (int i = 1; i <= 5; ++i) buffer.AddStep(Step(i));
  for (const char* text : {"a", "b", "c"}) buffer.AddLog(Log(text));
  EXPECT_EQ(buffer.dropped_steps(), 2);
  EXPECT_EQ(buffer.dropped_logs(), 1);
  ReportBatch batch = buffer.Take(10, 10);
  ASSERT_EQ(batch.steps.size(), 3u);
  EXPECT_EQ(batch.steps[0].step(), 3);
  EXPECT_EQ(batch.steps[2].step(), 5);
  ASSERT_EQ(batch.logs.size(), 2u);
  EXPECT_EQ(batch.logs[0].text(), "b");
}

TEST(ReportBufferTest, RestorePutsAFailedBatchBeforeNewerEntriesAndTrims) {
  ReportBuffer buffer({/*max_steps=*/4, /*max_logs=*/4});
  for (int i = 1; i <= 3; ++i) buffer.AddStep(Step(i));
  ReportBatch failed = buffer.Take(10, 10);
  buffer.AddStep(Step(4));
  buffer.AddStep(Step(5));
  buffer.Restore(std::move(failed));
  EXPECT_EQ(buffer.dropped_steps(), 1);
  ReportBatch batch = buffer.Take(10, 10);
  ASSERT_EQ(batch.steps.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(batch.steps[i].step(), i + 2);
}

TEST(ReportBufferTest, GenerationFollowsTheLastStepAndSurvivesRestore) {
  ReportBuffer buffer({/*max_steps=*/10, /*max_logs=*/10});
  buffer.AddStep(Step(1));
  buffer.AddStep(Step(2));
  v1::GenerationResult generation;
  generation.add_tokens(42);
  buffer.SetGeneration(generation);
  ReportBatch first = buffer.Take(1, 10);
  EXPECT_FALSE(first.generation.has_value());
  ReportBatch second = buffer.Take(1, 10);
  ASSERT_TRUE(second.generation.has_value());
  EXPECT_EQ(second.generation->tokens(0), 42);
  EXPECT_TRUE(buffer.empty());
  buffer.Restore(std::move(second));
  ReportBatch again = buffer.Take(10, 10);
  ASSERT_TRUE(again.generation.has_value());
  EXPECT_EQ(again.steps.size(), 1u);
}

}  // namespace
}  // namespace boulder::agent
