// The commands against an in-process fake coordinator (JobService and WorkerService on
// 127.0.0.1, gRPC callback API), and against an address where nothing listens.
#include "client/commands.h"

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/fake_coordinator_test_util.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace boulder::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSpec[] = "name: minigpt\nmodel:\n  preset: minigpt\ntraining:\n  steps: 200\n";

TEST_F(CommandsTest, SubmitSendsTheYamlAndOverrides) {
  SubmitOptions options;
  options.file = WriteSpec(kSpec);
  options.overrides = {"training.steps=50", "model.heads=4"};
  EXPECT_EQ(RunSubmit(connect_, options, io_), kExitOk);
  EXPECT_EQ(out_.str(), "job 7 submitted (minigpt, QUEUED)\n");
  EXPECT_EQ(err_.str(), "");
  ASSERT_EQ(jobs_.submits.size(), 1u);
  EXPECT_EQ(jobs_.submits[0].spec_yaml(), kSpec);
  EXPECT_THAT(jobs_.submits[0].overrides(), ElementsAre("training.steps=50", "model.heads=4"));
}

TEST_F(CommandsTest, SubmitQuietPrintsOnlyTheId) {
  SubmitOptions options;
  options.file = WriteSpec(kSpec);
  options.quiet = true;
  EXPECT_EQ(RunSubmit(connect_, options, io_), kExitOk);
  EXPECT_EQ(out_.str(), "7\n");
}

TEST_F(CommandsTest, SubmitReportsTheInvalidFieldPath) {
  jobs_.submit_status =
      grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "model.heads: 7 does not divide hidden 768");
  SubmitOptions options;
  options.file = WriteSpec(kSpec);
  EXPECT_EQ(RunSubmit(connect_, options, io_), kExitError);
  EXPECT_EQ(err_.str(), "boulder: invalid spec: model.heads: 7 does not divide hidden 768\n");
  EXPECT_EQ(out_.str(), "");
}

TEST_F(CommandsTest, SubmitRejectsMissingAndOversizedFilesWithoutCalling) {
  SubmitOptions options;
  options.file = ::testing::TempDir() + "/no_such_spec.yaml";
  EXPECT_EQ(RunSubmit(connect_, options, io_), kExitError);
  EXPECT_EQ(err_.str(), "boulder: cannot read " + options.file + ": No such file or directory\n");

  err_.str("");
  options.file = WriteSpec(std::string((1 << 20) + 1, '#'));
  EXPECT_EQ(RunSubmit(connect_, options, io_), kExitError);
  EXPECT_EQ(err_.str(),
            "boulder: " + options.file + " is larger than 1.00 MiB, the most a job spec may be\n");

  err_.str("");
  options.file = WriteSpec(kSpec);
  options.overrides = {"training.steps"};
  EXPECT_EQ(RunSubmit(connect_, options, io_), kExitUsage);
  EXPECT_EQ(err_.str(), "boulder: --set: expected PATH=VALUE, got 'training.steps'\n");
  EXPECT_TRUE(jobs_.submits.empty());
}

TEST_F(CommandsTest, SubmitFollowWatchesTheSubmittedJob) {
  ScriptRun(4, v1::SUCCEEDED);
  SubmitOptions options;
  options.file = WriteSpec(kSpec);
  options.follow = true;
  EXPECT_EQ(RunSubmit(connect_, options, io_), kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("job 7 submitted (minigpt, QUEUED)\njob 7 QUEUED\n"));
  EXPECT_THAT(out_.str(), HasSubstr("job 7 SUCCEEDED\n"));
}

TEST_F(CommandsTest, GetJsonIsTheJobMessage) {
  jobs_.job.mutable_generation()->add_prompt(5);
  jobs_.job.mutable_generation()->add_tokens(9);
  GetOptions options;
  options.job_id = 7;
  options.format = OutputFormat::kJson;
  EXPECT_EQ(RunGet(connect_, options, io_), kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("\"state\": \"SUCCEEDED\""));
  v1::Job parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_.str(), &parsed).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(parsed, jobs_.job));
}

TEST_F(CommandsTest, GetFp8PrintsTheScalingTable) {
  GetOptions options;
  options.job_id = 7;
  options.fp8 = true;
  EXPECT_EQ(RunGet(connect_, options, io_), kExitOk);
  EXPECT_EQ(out_.str(), "job 7 does not train in fp8 (precision )\n");

  out_.str("");
  jobs_.job.mutable_spec()->set_precision("fp8");
  EXPECT_EQ(RunGet(connect_, options, io_), kExitOk);
  EXPECT_EQ(out_.str(), "job 7 has no FP8 statistics yet (no step reported)\n");

  out_.str("");
  v1::StepReport* r = jobs_.job.mutable_latest_report();
  r->set_skipped_steps(2);
  v1::Fp8TensorStats* t = r->add_fp8();
  t->set_layer(0);
  t->set_tensor("qkv");
  t->set_role("input");
  t->set_format("e4m3");
  t->set_scale(112);
  t->set_amax(3.5);
  t->set_amax_history_max(4);
  t->set_saturated_ratio(0.00125);
  t->set_underflow_ratio(0);
  t = r->add_fp8();
  t->set_layer(3);
  t->set_tensor("fc2");
  t->set_role("grad_output");
  t->set_format("e5m2");
  t->set_scale(1.5e7);
  t->set_amax(0.0035);
  t->set_amax_history_max(0.0038);
  t->set_saturated_ratio(0);
  t->set_underflow_ratio(0.25);
  EXPECT_EQ(RunGet(connect_, options, io_), kExitOk);
  EXPECT_EQ(out_.str(),
            "step 100 of 100, 2 skipped (non-finite loss or gradients)\n"
            "LAYER   TENSOR   ROLE          FORMAT   SCALE     AMAX     AMAX_HISTORY_MAX   "
            "SATURATED   UNDERFLOW\n"
            "0       qkv      input         e4m3     112       3.5      4                  "
            "0.125%      0\n"
            "3       fc2      grad_output   e5m2     1.5e+07   0.0035   0.0038             "
            "0           25.000%\n");
}

TEST_F(CommandsTest, GetUnknownJobPrintsTheServerMessage) {
  GetOptions options;
  options.job_id = 99;
  EXPECT_EQ(RunGet(connect_, options, io_), kExitError);
  EXPECT_EQ(err_.str(), "boulder: job 99 not found\n");
}

TEST_F(CommandsTest, WatchPlainOutputIsThrottledAndEndsWithTheGeneration) {
  ScriptRun(100, v1::SUCCEEDED);
  WatchOptions options;
  options.job_id = 7;
  EXPECT_EQ(RunWatch(connect_, options, io_), kExitOk);
  const std::string out = out_.str();
  EXPECT_THAT(out, HasSubstr("job 7 QUEUED\njob 7 RUNNING on worker w-1\n"));
  // The clock stands still: the first step, then every 10% of the run, then the last.
  std::vector<std::string> step_lines;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (absl::StartsWith(line, "step ")) step_lines.emplace_back(line);
  }
  ASSERT_EQ(step_lines.size(), 11u) << out;
  EXPECT_EQ(step_lines[0], "step 1/100 (1%)  loss 4.0000  lr 3.0e-04  2,048 tok/s  ETA 0:25");
  EXPECT_EQ(step_lines[1].substr(0, 18), "step 11/100 (11%) ");
  EXPECT_EQ(step_lines[10], "step 100/100 (100%)  loss 0.0400  lr 3.0e-04  2,048 tok/s  ETA 0:00");
  EXPECT_THAT(out, HasSubstr("step 100/100 (100%)  loss 0.0400  lr 3.0e-04  2,048 tok/s  "
                             "ETA 0:00\njob 7 SUCCEEDED\n"
                             "prompt: 5 9 13 17 21  generated: 25 29 33 (constant stride 4)\n"));
  EXPECT_EQ(err_.str(), "");
}

TEST_F(CommandsTest, WatchExitCodeFollowsTheFinalState) {
  ScriptRun(2, v1::FAILED, "trainer exited with code 1: loss is NaN");
  WatchOptions options;
  options.job_id = 7;
  EXPECT_EQ(RunWatch(connect_, options, io_), kExitError);
  EXPECT_THAT(out_.str(), HasSubstr("job 7 FAILED: trainer exited with code 1: loss is NaN\n"));
  EXPECT_THAT(out_.str(), Not(HasSubstr("prompt:")));

  jobs_.events.clear();
  out_.str("");
  ScriptRun(2, v1::CANCELLED, "cancelled by the user");
  EXPECT_EQ(RunWatch(connect_, options, io_), kExitCancelled);
  EXPECT_THAT(out_.str(), HasSubstr("step 2/2 (100%)"));
  EXPECT_THAT(out_.str(), HasSubstr("job 7 CANCELLED: cancelled by the user\n"));
}

TEST_F(CommandsTest, WatchResumesAfterTheLastSeenEventWhenTheStreamBreaks) {
  ScriptRun(5, v1::SUCCEEDED);
  jobs_.fail_calls = 1;
  jobs_.fail_after_events = 4;  // QUEUED, RUNNING, steps 1 and 2
  WatchOptions options;
  options.job_id = 7;
  options.reconnect_timeout = absl::Seconds(20);
  EXPECT_EQ(RunWatch(connect_, options, io_), kExitOk);
  EXPECT_THAT(jobs_.watch_after_seqs, ElementsAre(0, 4));
  EXPECT_EQ(err_.str(), "boulder: lost the coordinator at " + connect_.address +
                            " (connection reset); reconnecting for up to 20 s\n");
  // Every step exactly once, in order.
  const std::string out = out_.str();
  for (int s = 1; s <= 5; ++s) {
    const std::string prefix = absl::StrCat("step ", s, "/5 ");
    size_t first = out.find(prefix);
    ASSERT_NE(first, std::string::npos) << prefix << "\n" << out;
    EXPECT_EQ(out.find(prefix, first + 1), std::string::npos) << prefix << "\n" << out;
  }
  EXPECT_THAT(out, HasSubstr("job 7 SUCCEEDED\nprompt: 5 9 13 17 21  generated: 25 29 33"));
}

TEST_F(CommandsTest, WatchGivesUpWhenReconnectingFailsForTheTimeout) {
  ScriptRun(5, v1::SUCCEEDED);
  jobs_.fail_calls = 1000;
  jobs_.fail_after_events = 0;
  WatchOptions options;
  options.job_id = 7;
  options.reconnect_timeout = absl::Seconds(1);
  EXPECT_EQ(RunWatch(connect_, options, io_), kExitError);
  EXPECT_THAT(err_.str(), HasSubstr("boulder: lost the event stream of job 7 from the "
                                    "coordinator at " +
                                    connect_.address +
                                    " (connection reset) and could not reconnect within 1 s\n"));
}

TEST_F(CommandsTest, JobsSendsTheStateFilterAndPrintsATable) {
  JobsOptions options;
  options.states = {"running", "Queued"};
  EXPECT_EQ(RunJobs(connect_, options, io_), kExitOk);
  ASSERT_EQ(jobs_.list_requests.size(), 1u);
  EXPECT_THAT(jobs_.list_requests[0].states(), ElementsAre(v1::RUNNING, v1::QUEUED));
  EXPECT_EQ(out_.str(),
            "ID   NAME      STATE       STEP      LOSS     WORKERS   AGE\n"
            "7    minigpt   SUCCEEDED   100/100   0.0400   w-1       -\n");
}

TEST_F(CommandsTest, JobsRejectsAnUnknownStateAsUsage) {
  JobsOptions options;
  options.states = {"finished"};
  EXPECT_EQ(RunJobs(connect_, options, io_), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("boulder: --state: unknown job state 'finished'"));
  EXPECT_TRUE(jobs_.list_requests.empty());
}

TEST_F(CommandsTest, JobsJsonIsTheListJobsResponse) {
  JobsOptions options;
  options.format = OutputFormat::kJson;
  EXPECT_EQ(RunJobs(connect_, options, io_), kExitOk);
  v1::ListJobsResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_.str(), &parsed).ok());
  ASSERT_EQ(parsed.jobs_size(), 1);
  EXPECT_EQ(parsed.jobs(0).id(), 7);
}

TEST_F(CommandsTest, CancelPrintsTheNewState) {
  CancelOptions options;
  options.job_id = 7;
  EXPECT_EQ(RunCancel(connect_, options, io_), kExitOk);
  EXPECT_EQ(out_.str(), "job 7 CANCELLED\n");
  EXPECT_THAT(jobs_.cancelled, ElementsAre(7));
}

TEST_F(CommandsTest, LogsPrintsLinesAndFollows) {
  ScriptRun(1, v1::SUCCEEDED);
  jobs_.events.insert(jobs_.events.end() - 1, LogEvent(100, "step 1 done"));
  jobs_.events.back().set_seq(101);
  LogsOptions options;
  options.job_id = 7;
  EXPECT_EQ(RunLogs(connect_, options, io_), kExitOk);
  EXPECT_EQ(out_.str(), "step 1 done\n");
  out_.str("");
  options.follow = true;
  EXPECT_EQ(RunLogs(connect_, options, io_), kExitOk);
  EXPECT_EQ(out_.str(), "step 1 done\n");
}

TEST_F(CommandsTest, WorkersTableAndJson) {
  WorkersOptions options;
  EXPECT_EQ(RunWorkers(connect_, options, io_), kExitOk);
  EXPECT_EQ(out_.str(),
            "ID    BACKEND   CORES   GPU   MEMORY   STATE   JOB   LAST-HEARTBEAT\n"
            "w-1   cpu       2       -     -        BUSY    7     -\n");
  out_.str("");
  options.format = OutputFormat::kJson;
  EXPECT_EQ(RunWorkers(connect_, options, io_), kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("\"state\": \"WORKER_BUSY\""));
}

TEST(UnreachableTest, OneLineNamingTheAddressAndTheFix) {
  ConnectOptions connect;
  connect.security.insecure = true;
  connect.address = absl::StrCat("127.0.0.1:", UnusedPort());
  std::ostringstream out, err;
  Io io;
  io.out = &out;
  io.err = &err;
  const absl::Time start = absl::Now();
  EXPECT_EQ(RunJobs(connect, JobsOptions(), io), kExitError);
  // A refused connection is reported at once, not after the connect timeout.
  EXPECT_LT(absl::Now() - start, connect.connect_timeout);
  EXPECT_EQ(err.str(), "boulder: cannot reach the coordinator at " + connect.address +
                           " (connection refused); start one with boulder-coordinator or set "
                           "--coordinator / BOULDER_COORDINATOR\n");
  EXPECT_EQ(out.str(), "");
}

TEST(UnreachableTest, MalformedAddressIsAUsageError) {
  ConnectOptions connect;
  connect.security.insecure = true;
  connect.address = "localhost";
  std::ostringstream out, err;
  Io io;
  io.out = &out;
  io.err = &err;
  EXPECT_EQ(RunWorkers(connect, WorkersOptions(), io), kExitUsage);
  EXPECT_EQ(err.str(), "boulder: --coordinator: expected HOST:PORT, got 'localhost'\n");
}

}  // namespace
}  // namespace boulder::client
