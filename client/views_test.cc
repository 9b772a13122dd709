#include "client/views.h"

#include <string>

#include "absl/strings/str_split.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kNow = 1764667200;  // 2025-12-02 09:20:00 UTC

v1::Job SampleJob() {
  v1::Job job;
  job.set_id(7);
  job.set_name("minigpt");
  job.set_state(v1::SUCCEEDED);
  job.set_attempt(1);
  job.add_workers("w-1");
  job.mutable_create_time()->set_seconds(kNow - 300);
  job.mutable_start_time()->set_seconds(kNow - 290);
  job.mutable_end_time()->set_seconds(kNow - 157);
  v1::StepReport* r = job.mutable_latest_report();
  r->set_step(200);
  r->set_total_steps(200);
  r->set_loss(0.0123);
  r->set_lr(3e-5);
  r->set_grad_norm(0.412);
  r->set_tokens_per_second(12345);
  r->set_step_time_seconds(1.52);
  r->mutable_memory()->set_allocated_bytes(int64_t{1} << 30);
  r->mutable_memory()->set_peak_bytes(int64_t{3} << 29);
  r->mutable_memory()->set_reserved_bytes(int64_t{2} << 30);
  r->mutable_memory()->set_device_total_bytes(int64_t{141} << 30);
  job.mutable_spec()->set_name("minigpt");
  job.mutable_spec()->mutable_model()->set_vocab_size(96);
  job.mutable_spec()->mutable_training()->set_steps(200);
  for (int32_t t : {5, 9, 13, 17}) job.mutable_generation()->add_prompt(t);
  for (int32_t t : {21, 25, 29}) job.mutable_generation()->add_tokens(t);
  return job;
}

TEST(JobStateTest, NamesAndParsing) {
  EXPECT_EQ(JobStateName(v1::RUNNING), "RUNNING");
  EXPECT_EQ(JobStateName(v1::JOB_STATE_UNSPECIFIED), "UNSPECIFIED");
  EXPECT_EQ(WorkerStateName(v1::WORKER_IDLE), "IDLE");
  EXPECT_EQ(WorkerStateName(v1::WORKER_LOST), "LOST");
  EXPECT_EQ(*ParseJobState("running"), v1::RUNNING);
  EXPECT_EQ(*ParseJobState("Cancelled"), v1::CANCELLED);
  absl::StatusOr<v1::JobState> bad = ParseJobState("done");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("unknown job state 'done' (one of queued, scheduled, running"));
  EXPECT_TRUE(IsTerminal(v1::FAILED));
  EXPECT_FALSE(IsTerminal(v1::RESTARTING));
}

TEST(JobsTableTest, AlignedRowsWithDashesForMissingValues) {
  v1::ListJobsResponse jobs;
  *jobs.add_jobs() = SampleJob();
  v1::Job* queued = jobs.add_jobs();
  queued->set_id(12);
  queued->set_name("tiny");
  queued->set_state(v1::QUEUED);
  queued->mutable_create_time()->set_seconds(kNow - 12);
  EXPECT_EQ(JobsTable(jobs, absl::FromUnixSeconds(kNow)),
            "ID   NAME      STATE       STEP      LOSS     WORKERS   AGE\n"
            "7    minigpt   SUCCEEDED   200/200   0.0123   w-1       5m\n"
            "12   tiny      QUEUED      -         -        -         12s\n");
}

TEST(WorkersTableTest, CpuAndGpuWorkers) {
  v1::ListWorkersResponse workers;
  v1::Worker* cpu = workers.add_workers();
  cpu->set_id("w-1");
  cpu->mutable_capabilities()->set_backend("cpu");
  cpu->mutable_capabilities()->set_cpu_cores(2);
  cpu->set_state(v1::WORKER_BUSY);
  cpu->set_job_id(7);
  cpu->mutable_last_heartbeat()->set_seconds(kNow - 3);
  v1::Worker* gpu = workers.add_workers();
  gpu->set_id("w-2");
  gpu->mutable_capabilities()->set_backend("cuda");
  gpu->mutable_capabilities()->set_cpu_cores(16);
  gpu->mutable_capabilities()->set_gpu_name("NVIDIA H200");
  gpu->mutable_capabilities()->set_compute_capability_major(9);
  gpu->mutable_capabilities()->set_compute_capability_minor(0);
  gpu->mutable_capabilities()->set_gpu_memory_bytes(int64_t{141} << 30);
  gpu->set_state(v1::WORKER_IDLE);
  EXPECT_EQ(WorkersTable(workers, absl::FromUnixSeconds(kNow)),
            "ID    BACKEND   CORES   GPU                   MEMORY    STATE   JOB   LAST-HEARTBEAT\n"
            "w-1   cpu       2       -                     -         BUSY    7     3s ago\n"
            "w-2   cuda      16      NVIDIA H200 (sm_90)   141 GiB   IDLE    -     -\n");
}

TEST(JobDetailsTest, ShowsStateTimesReportSpecAndGeneration) {
  v1::Job job = SampleJob();
  std::string text = JobDetails(job, absl::FromUnixSeconds(kNow), absl::UTCTimeZone());
  EXPECT_THAT(text, HasSubstr("ID:           7\n"));
  EXPECT_THAT(text, HasSubstr("State:        SUCCEEDED\n"));
  EXPECT_THAT(text, Not(HasSubstr("Message:")));
  EXPECT_THAT(text, HasSubstr("Created:      2025-12-02 09:15:00 UTC (5m ago)\n"));
  EXPECT_THAT(text, HasSubstr("Ended:        2025-12-02 09:17:23 UTC (ran 2m13s)\n"));
  EXPECT_THAT(text, HasSubstr("Workers:      w-1\n"));
  EXPECT_THAT(text, HasSubstr("Latest step:  200/200\n"));
  EXPECT_THAT(text, HasSubstr("  Loss:       0.0123\n"));
  EXPECT_THAT(text, HasSubstr("  LR:         3.00e-05\n"));
  EXPECT_THAT(text, HasSubstr("  Tokens/s:   12,345\n"));
  EXPECT_THAT(text, HasSubstr("  Step time:  1.52 s\n"));
  EXPECT_THAT(text, HasSubstr("  Memory:     allocated 1.00 GiB, peak 1.50 GiB, reserved 2.00 GiB, "
                              "device 141 GiB\n"));
  // The spec exactly as common/ renders it, indented under "Spec:".
  std::string spec_block = "Spec:\n";
  for (absl::string_view line :
       absl::StrSplit(common::JobSpecToYaml(job.spec()), '\n', absl::SkipEmpty())) {
    spec_block += "  " + std::string(line) + "\n";
  }
  EXPECT_THAT(text, HasSubstr(spec_block));
  EXPECT_THAT(text, HasSubstr("Generation:\n  Prompt:     5 9 13 17\n"
                              "  Generated:  21 25 29\n  constant stride 4: yes\n"));
}

TEST(JobDetailsTest, FailedJobWithoutReportShowsMessageAndDashes) {
  v1::Job job;
  job.set_id(8);
  job.set_state(v1::FAILED);
  job.set_message("trainer exited with code 1: loss is NaN");
  std::string text = JobDetails(job, absl::FromUnixSeconds(kNow), absl::UTCTimeZone());
  EXPECT_THAT(text, HasSubstr("State:        FAILED\n"
                              "Message:      trainer exited with code 1: loss is NaN\n"));
  EXPECT_THAT(text, HasSubstr("Started:      -\n"));
  EXPECT_THAT(text, HasSubstr("Latest step:  -\n"));
  EXPECT_THAT(text, Not(HasSubstr("Generation:")));
}

TEST(JobDetailsTest, CpuMemoryShowsOnlyTheReportedFigures) {
  v1::Job job;
  job.mutable_latest_report()->set_step(3);
  job.mutable_latest_report()->set_total_steps(10);
  job.mutable_latest_report()->mutable_memory()->set_allocated_bytes(int64_t{118} << 20);
  std::string text = JobDetails(job, absl::FromUnixSeconds(kNow), absl::UTCTimeZone());
  EXPECT_THAT(text, HasSubstr("  Memory:     allocated 118 MiB\n"));
}

}  // namespace
}  // namespace boulder::client
