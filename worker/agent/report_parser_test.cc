#include "worker/agent/report_parser.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::agent {
namespace {

using ::testing::HasSubstr;

TEST(ParseTrainerMessageTest, ParsesAStepReport) {
  auto message = ParseTrainerMessage(
      R"({"step": {"job_id": "7", "step": "12", "total_steps": "100", "loss": 2.5,)"
      R"( "tokens_per_second": 1234.5, "memory": {"allocated_bytes": "1048576"},)"
      R"( "time": "2026-12-02T10:00:00Z"}})");
  ASSERT_TRUE(message.ok()) << message.status();
  ASSERT_EQ(message->kind_case(), v1::TrainerMessage::kStep);
  EXPECT_EQ(message->step().job_id(), 7);
  EXPECT_EQ(message->step().step(), 12);
  EXPECT_EQ(message->step().total_steps(), 100);
  EXPECT_DOUBLE_EQ(message->step().loss(), 2.5);
  EXPECT_DOUBLE_EQ(message->step().tokens_per_second(), 1234.5);
  EXPECT_EQ(message->step().memory().allocated_bytes(), 1048576);
  EXPECT_EQ(message->step().time().seconds(), 1796205600);
}

TEST(ParseTrainerMessageTest, AcceptsCamelCaseNamesAndSurroundingWhitespace) {
  auto message = ParseTrainerMessage("  {\"step\": {\"totalSteps\": 5, \"gradNorm\": 0.25}}\r");
  ASSERT_TRUE(message.ok()) << message.status();
  EXPECT_EQ(message->step().total_steps(), 5);
  EXPECT_DOUBLE_EQ(message->step().grad_norm(), 0.25);
}

TEST(ParseTrainerMessageTest, ParsesGenerationAndError) {
  auto generation = ParseTrainerMessage(R"({"generation": {"prompt": [1, 2], "tokens": [3]}})");
  ASSERT_TRUE(generation.ok()) << generation.status();
  ASSERT_EQ(generation->kind_case(), v1::TrainerMessage::kGeneration);
  EXPECT_EQ(generation->generation().prompt_size(), 2);
  EXPECT_EQ(generation->generation().tokens(0), 3);

  auto error = ParseTrainerMessage(R"({"error": "loss is NaN at step 40"})");
  ASSERT_TRUE(error.ok()) << error.status();
  EXPECT_EQ(error->error(), "loss is NaN at step 40");
}

TEST(ParseTrainerMessageTest, IgnoresFieldsFromNewerTrainers) {
  auto message = ParseTrainerMessage(R"({"step": {"step": 3, "novel_field": 1}})");
  ASSERT_TRUE(message.ok()) << message.status();
  EXPECT_EQ(message->step().step(), 3);
}

TEST(ParseTrainerMessageTest, RejectsMalformedLines) {
  for (const char* line :
       {"not json", "{\"step\": ", "[1, 2]", "{\"step\": {\"loss\": \"x\"}}", "{\"error\": 5}"}) {
    auto message = ParseTrainerMessage(line);
    EXPECT_EQ(message.status().code(), absl::StatusCode::kInvalidArgument) << line;
    EXPECT_THAT(message.status().message(), HasSubstr("report line: not a TrainerMessage")) << line;
  }
}

TEST(ParseTrainerMessageTest, RejectsLinesWithoutAKind) {
  for (const char* line : {"{}", "{\"unknown\": 1}"}) {
    auto message = ParseTrainerMessage(line);
    EXPECT_EQ(message.status().code(), absl::StatusCode::kInvalidArgument) << line;
    EXPECT_THAT(message.status().message(), HasSubstr("sets none of")) << line;
  }
  EXPECT_EQ(ParseTrainerMessage("   ").status().message(), "report line: empty");
}

}  // namespace
}  // namespace boulder::agent
