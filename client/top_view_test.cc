#include "client/top_view.h"

#include <string>

#include "absl/time/civil_time.h"
#include "gtest/gtest.h"

namespace boulder::client {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

v1::ListWorkersResponse Workers() {
  v1::ListWorkersResponse r;
  v1::Worker* gpu = r.add_workers();
  gpu->set_id("w-1");
  gpu->mutable_capabilities()->set_backend("cuda");
  gpu->mutable_capabilities()->set_gpu_name("NVIDIA H200");
  gpu->mutable_capabilities()->set_compute_capability_major(9);
  gpu->mutable_capabilities()->set_compute_capability_minor(0);
  gpu->mutable_capabilities()->set_gpu_memory_bytes(140 * kGiB);
  gpu->set_state(v1::WORKER_BUSY);
  gpu->set_job_id(7);
  gpu->mutable_latest_report()->set_job_id(7);
  gpu->mutable_latest_report()->set_step_time_seconds(0.0412);
  gpu->mutable_latest_report()->mutable_memory()->set_allocated_bytes(19 * kGiB / 2);

  v1::Worker* cpu = r.add_workers();
  cpu->set_id("w-2");
  cpu->mutable_capabilities()->set_backend("cpu");
  cpu->set_state(v1::WORKER_IDLE);
  // The report of a job it ran before: not shown for an idle worker.
  cpu->mutable_latest_report()->set_job_id(5);
  cpu->mutable_latest_report()->set_step_time_seconds(0.5);
  return r;
}

v1::Job* AddJob(v1::ListJobsResponse* r, int64_t id, const std::string& name, v1::JobState state,
                int64_t step, double loss) {
  v1::Job* j = r->add_jobs();
  j->set_id(id);
  j->set_name(name);
  j->set_state(state);
  if (step > 0) {
    j->mutable_latest_report()->set_step(step);
    j->mutable_latest_report()->set_total_steps(200);
    j->mutable_latest_report()->set_loss(loss);
  }
  return j;
}

v1::ListJobsResponse Jobs() {
  v1::ListJobsResponse r;
  AddJob(&r, 3, "old", v1::SUCCEEDED, 200, 0.04);
  AddJob(&r, 5, "", v1::FAILED, 3, 4.1);
  AddJob(&r, 7, "minigpt", v1::RUNNING, 120, 0.4321);
  AddJob(&r, 8, "big", v1::QUEUED, 0, 0);
  return r;
}

TopViewOptions Options() {
  TopViewOptions o;
  o.coordinator = "127.0.0.1:7070";
  o.now = absl::FromCivil(absl::CivilSecond(2026, 12, 2, 10, 15, 3), absl::UTCTimeZone());
  o.zone = absl::UTCTimeZone();
  o.ended_jobs = 1;
  return o;
}

TEST(RenderTopTest, WorkersAndActiveJobsThenTheNewestEnded) {
  EXPECT_EQ(RenderTop(Workers(), Jobs(), Options()),
            "boulder top  127.0.0.1:7070  10:15:03  workers 2 (1 busy)  jobs 1 running, 1 queued\n"
            "\n"
            "WORKERS\n"
            "ID    BACKEND   GPU                   MEMORY               STATE   JOB   STEP-TIME\n"
            "w-1   cuda      NVIDIA H200 (sm_90)   9.50 GiB / 140 GiB   BUSY    7     41.2 ms\n"
            "w-2   cpu       -                     -                    IDLE    -     -\n"
            "\n"
            "JOBS\n"
            "ID   NAME      STATE     STEP      LOSS\n"
            "8    big       QUEUED    -         -\n"
            "7    minigpt   RUNNING   120/200   0.4321\n"
            "5    -         FAILED    3/200     4.1000\n");
}

TEST(RenderTopTest, FitsTheTerminalKeepingTheFooter) {
  TopViewOptions o = Options();
  o.width = 30;
  o.height = 8;
  o.footer = "q or Ctrl-C to quit";
  // 8 lines: 7 without the last (where the cursor rests), 2 of them the footer.
  EXPECT_EQ(RenderTop(Workers(), Jobs(), o),
            "boulder top  127.0.0.1:7070  \n"
            "\n"
            "WORKERS\n"
            "ID    BACKEND   GPU          \n"
            "w-1   cuda      NVIDIA H200 (\n"
            "\n"
            "q or Ctrl-C to quit\n");
}

TEST(RenderTopTest, NoticeLostWorkersAndEmptyLists) {
  TopViewOptions o = Options();
  o.notice = "boulder: cannot reach the coordinator";
  v1::ListWorkersResponse workers;
  v1::Worker* lost = workers.add_workers();
  lost->set_id("w-9");
  lost->set_state(v1::WORKER_LOST);
  EXPECT_EQ(RenderTop(workers, v1::ListJobsResponse(), o),
            "boulder top  127.0.0.1:7070  10:15:03  workers 1 (0 busy, 1 lost)  jobs 0 running, "
            "0 queued\n"
            "boulder: cannot reach the coordinator\n"
            "\n"
            "WORKERS\n"
            "ID    BACKEND   GPU   MEMORY   STATE   JOB   STEP-TIME\n"
            "w-9   -         -     -        LOST    -     -\n"
            "\n"
            "JOBS\n"
            "no jobs\n");
}

TEST(RenderTopTest, GpuWorkerWithoutAReportShowsItsTotalMemory) {
  v1::ListWorkersResponse workers = Workers();
  workers.mutable_workers(0)->set_state(v1::WORKER_IDLE);
  workers.mutable_workers(0)->set_job_id(0);
  const std::string screen = RenderTop(workers, Jobs(), Options());
  EXPECT_NE(screen.find("w-1   cuda      NVIDIA H200 (sm_90)   - / 140 GiB   IDLE    -     -\n"),
            std::string::npos)
      << screen;
}

}  // namespace
}  // namespace boulder::client
