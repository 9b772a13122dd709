// The Coordinator's state machine, driven directly (no gRPC) with a fake clock.
#include "server/coordinator.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/test_util.h"

namespace boulder::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using testing::SmallSpecYaml;
using ::testing::StartsWith;
using testing::TempDir;

constexpr absl::Duration kTimeout = absl::Seconds(10);

v1::RunningTrainer Trainer(int64_t job_id, int32_t attempt) {
  v1::RunningTrainer t;
  t.set_job_id(job_id);
  t.set_attempt(attempt);
  return t;
}

// A compact description of an event: "QUEUED", "step 3", "log", "generation".
std::string Describe(const v1::JobEvent& e) {
  if (e.has_state_change()) return v1::JobState_Name(e.state_change().state());
  if (e.has_step()) return "step " + std::to_string(e.step().step());
  if (e.has_log()) return "log";
  if (e.has_generation()) return "generation";
  return "?";
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(); }

  void Open() {
    auto store = JobStore::Open(dir_.File("boulder.db"));
    ASSERT_TRUE(store.ok()) << store.status();
    CoordinatorOptions options;
    options.heartbeat_timeout = kTimeout;
    options.heartbeat_interval = absl::Milliseconds(500);
    options.clock = [this] { return now_; };
    auto c = Coordinator::Create(*std::move(store), &metrics_, options);
    ASSERT_TRUE(c.ok()) << c.status();
    c_ = *std::move(c);
  }

  // A coordinator crash and restart on the same database.
  void Restart() {
    c_.reset();
    Open();
  }

  int64_t Submit(std::vector<std::string> overrides = {}) {
    v1::SubmitJobRequest r;
    r.set_spec_yaml(SmallSpecYaml());
    for (const std::string& o : overrides) r.add_overrides(o);
    auto job = c_->SubmitJob(r);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : 0;
  }

  std::string Register(const std::string& backend = "cpu", const std::string& id = "",
                       std::vector<v1::RunningTrainer> running = {}) {
    v1::RegisterWorkerRequest r;
    r.mutable_capabilities()->set_backend(backend);
    r.set_requested_id(id);
    for (const auto& t : running) *r.add_running() = t;
    auto resp = c_->RegisterWorker(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->worker_id() : "";
  }

  absl::StatusOr<v1::HeartbeatResponse> Beat(const std::string& id,
                                             std::vector<v1::RunningTrainer> running = {}) {
    v1::HeartbeatRequest r;
    r.set_worker_id(id);
    for (const auto& t : running) *r.add_running() = t;
    return c_->Heartbeat(r);
  }

  absl::StatusOr<v1::ReportStepsResponse> Step(const std::string& worker, int64_t job,
                                               int32_t attempt, int64_t step, double loss) {
    v1::ReportStepsRequest r;
    r.set_worker_id(worker);
    r.set_job_id(job);
    r.set_attempt(attempt);
    v1::StepReport* s = r.add_steps();
    s->set_step(step);
    s->set_loss(loss);
    return c_->ReportSteps(r);
  }

  absl::Status Exit(const std::string& worker, int64_t job, int32_t attempt, int code,
                    int signal = 0, const std::string& message = "", bool cancelled = false) {
    v1::ReportExitRequest r;
    r.set_worker_id(worker);
    r.set_job_id(job);
    r.set_attempt(attempt);
    r.set_exit_code(code);
    r.set_signal(signal);
    r.set_message(message);
    r.set_cancelled(cancelled);
    return c_->ReportExit(r);
  }

  v1::Job Job(int64_t id) {
    auto job = c_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  v1::Worker WorkerInfo(const std::string& id) {
    for (const v1::Worker& w : c_->ListWorkers()) {
      if (w.id() == id) return w;
    }
    ADD_FAILURE() << "no worker " << id;
    return v1::Worker();
  }

  std::vector<std::string> Events(int64_t job) {
    std::vector<std::string> out;
    auto page = c_->ReadEvents(job, 0, 0);
    EXPECT_TRUE(page.ok()) << page.status();
    if (!page.ok()) return out;
    int64_t seq = 0;
    for (const v1::JobEvent& e : page->events) {
      EXPECT_EQ(e.seq(), ++seq) << "events are gap-free from 1";
      out.push_back(Describe(e));
    }
    return out;
  }

  // Submits a job and drives it to RUNNING on a fresh cpu worker.
  void StartRunning(int64_t* job, std::string* worker) {
    *job = Submit();
    *worker = Register();
    auto hb = Beat(*worker);
    ASSERT_TRUE(hb.ok()) << hb.status();
    ASSERT_THAT(hb->assignments(), SizeIs(1));
    ASSERT_TRUE(Step(*worker, *job, 1, 1, 4.5).ok());
    ASSERT_EQ(Job(*job).state(), v1::RUNNING);
  }

  TempDir dir_;
  ServerMetrics metrics_;
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
  std::unique_ptr<Coordinator> c_;
};

TEST_F(CoordinatorTest, SubmitStoresTheResolvedJobQueued) {
  v1::SubmitJobRequest r;
  r.set_spec_yaml(SmallSpecYaml());
  r.add_overrides("training.steps=7");
  auto job = c_->SubmitJob(r);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->id(), 1);
  EXPECT_EQ(job->state(), v1::QUEUED);
  EXPECT_EQ(job->name(), "small");
  EXPECT_EQ(job->spec().training().steps(), 7);
  EXPECT_EQ(job->spec().model().vocab_size(), 96);  // filled in from the preset
  EXPECT_EQ(job->attempt(), 0);
  EXPECT_EQ(Job(1).state(), v1::QUEUED);
  EXPECT_THAT(Events(1), ElementsAre("QUEUED"));
  EXPECT_EQ(Submit(), 2);
}

TEST_F(CoordinatorTest, SubmitFromAJobSpecMessageAppliesOverrides) {
  v1::SubmitJobRequest r;
  r.mutable_spec()->mutable_model()->set_preset("minigpt");
  r.mutable_spec()->mutable_training()->set_steps(3);
  r.add_overrides("training.steps=4");
  auto job = c_->SubmitJob(r);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().training().steps(), 4);
  EXPECT_EQ(job->spec().model().hidden(), 768);
}

TEST_F(CoordinatorTest, BadSpecIsRejectedWithTheFieldPath) {
  v1::SubmitJobRequest r;
  r.set_spec_yaml(SmallSpecYaml());
  r.add_overrides("model.heads=7");
  absl::Status s = c_->SubmitJob(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), StartsWith("model.heads: 7 does not divide hidden 64"));

  v1::SubmitJobRequest msg;
  msg.mutable_spec()->mutable_model()->set_heads(7);
  s = c_->SubmitJob(msg).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), StartsWith("model.heads: 7 does not divide hidden 768"));

  v1::SubmitJobRequest huge;
  huge.set_spec_yaml(std::string(common::kMaxSpecBytes + 1, '#'));
  s = c_->SubmitJob(huge).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              StartsWith("spec_yaml: 1048577 bytes, more than the 1048576"));

  // Nothing was stored.
  EXPECT_THAT(*c_->ListJobs(v1::ListJobsRequest()), IsEmpty());
}

TEST_F(CoordinatorTest, JobRunsToSuccess) {
  int64_t job = Submit();
  std::string w = Register();
  EXPECT_EQ(w, "worker-1");
  EXPECT_EQ(WorkerInfo(w).state(), v1::WORKER_IDLE);

  auto hb = Beat(w);
  ASSERT_TRUE(hb.ok()) << hb.status();
  ASSERT_THAT(hb->assignments(), SizeIs(1));
  const v1::Assignment& a = hb->assignments(0);
  EXPECT_EQ(a.job_id(), job);
  EXPECT_EQ(a.attempt(), 1);
  EXPECT_EQ(a.rank(), 0);
  EXPECT_EQ(a.world_size(), 1);
  EXPECT_EQ(a.spec().training().steps(), 20);
  EXPECT_EQ(Job(job).state(), v1::SCHEDULED);
  EXPECT_THAT(Job(job).workers(), ElementsAre("worker-1"));
  EXPECT_EQ(WorkerInfo(w).state(), v1::WORKER_BUSY);
  EXPECT_EQ(WorkerInfo(w).job_id(), job);

  // Repeated until the worker lists it; then no more.
  EXPECT_THAT(Beat(w)->assignments(), SizeIs(1));
  hb = Beat(w, {Trainer(job, 1)});
  EXPECT_THAT(hb->assignments(), IsEmpty());
  EXPECT_THAT(hb->cancel(), IsEmpty());
  EXPECT_THAT(Beat(w)->assignments(), IsEmpty()) << "acknowledged: not handed out again";

  now_ += absl::Seconds(3);
  auto steps = Step(w, job, 1, 1, 4.5);
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_FALSE(steps->cancel());
  EXPECT_EQ(Job(job).state(), v1::RUNNING);
  EXPECT_TRUE(Job(job).has_start_time());

  v1::ReportStepsRequest more;
  more.set_worker_id(w);
  more.set_job_id(job);
  more.set_attempt(1);
  more.add_steps()->set_step(2);
  more.mutable_steps(0)->set_loss(0.25);
  more.add_logs()->set_text("step 2 loss 0.25");
  more.mutable_generation()->add_prompt(1);
  more.mutable_generation()->add_tokens(2);
  ASSERT_TRUE(c_->ReportSteps(more).ok());
  EXPECT_EQ(Job(job).latest_report().step(), 2);
  EXPECT_DOUBLE_EQ(Job(job).latest_report().loss(), 0.25);
  EXPECT_EQ(Job(job).latest_report().job_id(), job);
  EXPECT_THAT(Job(job).generation().tokens(), ElementsAre(2));
  EXPECT_EQ(WorkerInfo(w).latest_report().step(), 2);

  ASSERT_TRUE(Exit(w, job, 1, 0).ok());
  v1::Job done = Job(job);
  EXPECT_EQ(done.state(), v1::SUCCEEDED);
  EXPECT_EQ(done.message(), "");
  EXPECT_TRUE(done.has_end_time());
  EXPECT_EQ(WorkerInfo(w).state(), v1::WORKER_IDLE);
  EXPECT_EQ(WorkerInfo(w).job_id(), 0);
  EXPECT_THAT(Events(job), ElementsAre("QUEUED", "SCHEDULED", "RUNNING", "step 1", "step 2", "log",
                                       "generation", "SUCCEEDED"));
  auto logs = c_->GetJobLogs(job);
  ASSERT_TRUE(logs.ok());
  ASSERT_THAT(*logs, SizeIs(1));
  EXPECT_EQ((*logs)[0].text(), "step 2 loss 0.25");
}

TEST_F(CoordinatorTest, FifoOneWorker) {
  int64_t first = Submit();
  int64_t second = Submit();
  std::string w = Register();
  auto hb = Beat(w);
  ASSERT_THAT(hb->assignments(), SizeIs(1));
  EXPECT_EQ(hb->assignments(0).job_id(), first);
  EXPECT_EQ(Job(second).state(), v1::QUEUED);
  ASSERT_TRUE(Exit(w, first, 1, 0).ok());
  hb = Beat(w);
  ASSERT_THAT(hb->assignments(), SizeIs(1));
  EXPECT_EQ(hb->assignments(0).job_id(), second);
}

TEST_F(CoordinatorTest, JobWaitsForAWorkerWithItsBackend) {
  int64_t gpu_job = Submit({"resources.backend=cuda"});
  int64_t bf16_job = Submit({"resources.backend=auto", "precision=bf16"});
  int64_t cpu_job = Submit();
  std::string cpu = Register("cpu");
  auto hb = Beat(cpu);
  ASSERT_THAT(hb->assignments(), SizeIs(1));
  EXPECT_EQ(hb->assignments(0).job_id(), cpu_job) << "cuda jobs do not hold back cpu jobs";
  EXPECT_EQ(Job(gpu_job).state(), v1::QUEUED);
  EXPECT_EQ(Job(bf16_job).state(), v1::QUEUED);
  std::string gpu = Register("cuda");
  hb = Beat(gpu);
  ASSERT_THAT(hb->assignments(), SizeIs(1));
  EXPECT_EQ(hb->assignments(0).job_id(), gpu_job);
}

TEST_F(CoordinatorTest, CancelQueuedJob) {
  int64_t job = Submit();
  auto cancelled = c_->CancelJob(job);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_EQ(cancelled->message(), "cancelled by user");
  EXPECT_EQ(Job(job).state(), v1::CANCELLED);
  EXPECT_THAT(Events(job), ElementsAre("QUEUED", "CANCELLED"));
  // Not scheduled afterwards.
  std::string w = Register();
  EXPECT_THAT(Beat(w)->assignments(), IsEmpty());

  absl::Status again = c_->CancelJob(job).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(again.message(), absl::StrCat("job ", job, " already CANCELLED"));
  absl::Status missing = c_->CancelJob(99).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.message(), "job 99 not found");
}

TEST_F(CoordinatorTest, CancelRunningJobStopsTheTrainerAndFreesTheWorkerOnExit) {
  int64_t job;
  std::string w;
  StartRunning(&job, &w);
  auto cancelled = c_->CancelJob(job);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_EQ(Job(job).state(), v1::CANCELLED);

  auto hb = Beat(w, {Trainer(job, 1)});
  ASSERT_TRUE(hb.ok());
  ASSERT_THAT(hb->cancel(), SizeIs(1));
  EXPECT_EQ(hb->cancel(0).job_id(), job);
  EXPECT_EQ(WorkerInfo(w).state(), v1::WORKER_BUSY) << "busy until the trainer exits";
  auto steps = Step(w, job, 1, 2, 4.0);
  ASSERT_TRUE(steps.ok());
  EXPECT_TRUE(steps->cancel());

  ASSERT_TRUE(Exit(w, job, 1, -1, 15, "", /*cancelled=*/true).ok());
  EXPECT_EQ(Job(job).state(), v1::CANCELLED);
  EXPECT_EQ(Job(job).message(), "cancelled by user");
  EXPECT_EQ(WorkerInfo(w).state(), v1::WORKER_IDLE);
  EXPECT_THAT(Events(job), ElementsAre("QUEUED", "SCHEDULED", "RUNNING", "step 1", "CANCELLED"));
}

TEST_F(CoordinatorTest, CancelledAssignmentNeverStartedFreesTheWorker) {
  int64_t job = Submit();
  std::string w = Register();
  ASSERT_THAT(Beat(w)->assignments(), SizeIs(1));
  ASSERT_TRUE(c_->CancelJob(job).ok());
  auto hb = Beat(w);  // not running it: nothing to stop, nothing to wait for
  EXPECT_THAT(hb->assignments(), IsEmpty());
  EXPECT_THAT(hb->cancel(), IsEmpty());
  EXPECT_EQ(WorkerInfo(w).state(), v1::WORKER_IDLE);
}

TEST_F(CoordinatorTest, FailedExitsExplainThemselves) {
  int64_t job;
  std::string w;
  StartRunning(&job, &w);
  ASSERT_TRUE(Exit(w, job, 1, 1, 0, "CUDA error: out of memory").ok());
  EXPECT_EQ(Job(job).state(), v1::FAILED);
  EXPECT_EQ(Job(job).message(),
            "rank 0 on worker worker-1 exited with code 1: CUDA error: out of memory");
  EXPECT_EQ(WorkerInfo(w).state(), v1::WORKER_IDLE);

  int64_t killed = Submit();
  ASSERT_THAT(Beat(w)->assignments(), SizeIs(1));
  ASSERT_TRUE(Exit(w, killed, 1, -1, 9).ok());
  EXPECT_EQ(Job(killed).message(), "rank 0 on worker worker-1 killed by signal 9");
  EXPECT_EQ(Events(killed).back(), "FAILED");
}

TEST_F(CoordinatorTest, StaleReportsAreIgnored) {
  int64_t job;
  std::string w;
  StartRunning(&job, &w);
  auto steps = Step(w, job, /*attempt=*/7, 2, 1.0);
  ASSERT_TRUE(steps.ok());
  EXPECT_TRUE(steps->cancel());
  EXPECT_TRUE(Exit(w, job, 7, 1).ok());
  EXPECT_EQ(Job(job).state(), v1::RUNNING);
  EXPECT_THAT(Events(job), SizeIs(4));
  // A trainer for a job this worker does not run is cancelled.
  auto hb = Beat(w, {Trainer(job, 1), Trainer(55, 1)});
  ASSERT_THAT(hb->cancel(), SizeIs(1));
  EXPECT_EQ(hb->cancel(0).job_id(), 55);
}

TEST_F(CoordinatorTest, LostWorkerFailsItsJobAndMustRegisterAgain) {
  int64_t job;
  std::string w;
  StartRunning(&job, &w);
  now_ += absl::Seconds(9);
  ASSERT_TRUE(c_->CheckLiveness().ok());
  EXPECT_EQ(WorkerInfo(w).state(), v1::WORKER_BUSY) << "not yet past the timeout";
  now_ += absl::Seconds(2);
  ASSERT_TRUE(c_->CheckLiveness().ok());
  EXPECT_EQ(WorkerInfo(w).state(), v1::WORKER_LOST);
  EXPECT_EQ(Job(job).state(), v1::FAILED);
  EXPECT_EQ(Job(job).message(), "worker worker-1 lost: no heartbeat for 10.0 s");

  absl::Status s = Beat(w).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("register again"));

  // It comes back with the trainer still running: the trainer is stopped, then it is free.
  EXPECT_EQ(Register("cpu", w, {Trainer(job, 1)}), w);
  auto hb = Beat(w, {Trainer(job, 1)});
  ASSERT_TRUE(hb.ok());
  ASSERT_THAT(hb->cancel(), SizeIs(1));
  ASSERT_TRUE(Exit(w, job, 1, -1, 15, "", true).ok());
  EXPECT_EQ(Job(job).state(), v1::FAILED);
  EXPECT_EQ(WorkerInfo(w).state(), v1::WORKER_IDLE);
}

TEST_F(CoordinatorTest, TrainerGoneWithoutExitReportFailsAfterTheTimeout) {
  int64_t job;
  std::string w;
  StartRunning(&job, &w);
  ASSERT_TRUE(Beat(w).ok());  // no longer lists it
  now_ += absl::Seconds(5);
  ASSERT_TRUE(Beat(w).ok());
  EXPECT_EQ(Job(job).state(), v1::RUNNING) << "the exit report may still be on its way";
  now_ += absl::Seconds(6);
  ASSERT_TRUE(Beat(w).ok());
  EXPECT_EQ(Job(job).state(), v1::FAILED);
  EXPECT_THAT(Job(job).message(), HasSubstr("trainer stopped without an exit report"));
  EXPECT_EQ(WorkerInfo(w).state(), v1::WORKER_IDLE);
}

TEST_F(CoordinatorTest, SubmittedJobSurvivesARestart) {
  int64_t job = Submit();
  Restart();
  v1::Job loaded = Job(job);
  EXPECT_EQ(loaded.state(), v1::QUEUED);
  EXPECT_EQ(loaded.spec().training().steps(), 20);
  EXPECT_EQ(Submit(), job + 1);
}

TEST_F(CoordinatorTest, RestartedCoordinatorReattachesRunningJobs) {
  int64_t job;
  std::string w;
  StartRunning(&job, &w);
  Restart();
  EXPECT_EQ(WorkerInfo(w).state(), v1::WORKER_BUSY) << "listed from the store";
  EXPECT_EQ(Beat(w).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Step(w, job, 1, 2, 3.0).status().code(), absl::StatusCode::kNotFound);

  EXPECT_EQ(Register("cpu", w, {Trainer(job, 1)}), w);
  auto hb = Beat(w, {Trainer(job, 1)});
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_THAT(hb->assignments(), IsEmpty());
  EXPECT_THAT(hb->cancel(), IsEmpty());
  now_ += kTimeout + absl::Seconds(1);
  ASSERT_TRUE(Beat(w, {Trainer(job, 1)}).ok());
  ASSERT_TRUE(c_->CheckLiveness().ok());
  EXPECT_EQ(Job(job).state(), v1::RUNNING);
  ASSERT_FALSE(Step(w, job, 1, 2, 3.0)->cancel());
  ASSERT_TRUE(Exit(w, job, 1, 0).ok());
  EXPECT_EQ(Job(job).state(), v1::SUCCEEDED);
  EXPECT_EQ(Register(), "worker-2") << "new ids do not reuse stored ones";
}

TEST_F(CoordinatorTest, JobNotReclaimedAfterRestartFails) {
  int64_t job;
  std::string w;
  StartRunning(&job, &w);
  Restart();
  now_ += kTimeout - absl::Seconds(1);
  ASSERT_TRUE(c_->CheckLiveness().ok());
  EXPECT_EQ(Job(job).state(), v1::RUNNING);
  now_ += absl::Seconds(2);
  ASSERT_TRUE(c_->CheckLiveness().ok());
  EXPECT_EQ(Job(job).state(), v1::FAILED);
  EXPECT_EQ(Job(job).message(), "lost during coordinator restart");
  EXPECT_EQ(WorkerInfo(w).state(), v1::WORKER_LOST);
}

TEST_F(CoordinatorTest, WorkerBackWithoutItsTrainerAfterRestartFailsTheJob) {
  int64_t job;
  std::string w;
  StartRunning(&job, &w);
  Restart();
  EXPECT_EQ(Register("cpu", w), w);
  EXPECT_EQ(Job(job).state(), v1::FAILED);
  EXPECT_EQ(Job(job).message(), "lost during coordinator restart");
  EXPECT_EQ(WorkerInfo(w).state(), v1::WORKER_IDLE);
}

TEST_F(CoordinatorTest, RestartedAgentGetsItsUnstartedAssignmentAgain) {
  int64_t job = Submit();
  std::string w = Register();
  ASSERT_THAT(Beat(w)->assignments(), SizeIs(1));
  EXPECT_EQ(Register("cpu", w), w);
  auto hb = Beat(w);
  ASSERT_THAT(hb->assignments(), SizeIs(1));
  EXPECT_EQ(hb->assignments(0).job_id(), job);
  EXPECT_EQ(Job(job).state(), v1::SCHEDULED);
}

TEST_F(CoordinatorTest, RestartedAgentWithoutItsRunningTrainerFailsTheJob) {
  int64_t job;
  std::string w;
  StartRunning(&job, &w);
  EXPECT_EQ(Register("cpu", w), w);
  EXPECT_EQ(Job(job).state(), v1::FAILED);
  EXPECT_EQ(Job(job).message(),
            "rank 0 on worker worker-1 lost: the worker registered again without its trainer");
}

TEST_F(CoordinatorTest, BadWorkerRequests) {
  v1::RegisterWorkerRequest r;
  r.mutable_capabilities()->set_backend("tpu");
  absl::Status s = c_->RegisterWorker(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "capabilities.backend: must be \"cpu\" or \"cuda\", got \"tpu\"");
  r.mutable_capabilities()->set_backend("cpu");
  r.set_requested_id("bad\nid");
  s = c_->RegisterWorker(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), StartsWith("requested_id: "));

  s = Beat("nobody").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "worker nobody is not registered");
  std::string w = Register();
  EXPECT_EQ(Step(w, 42, 1, 1, 1.0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Exit("nobody", 1, 1, 0).code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, ListJobsNewestFirstWithFilterAndLimit) {
  int64_t a = Submit();
  int64_t b = Submit();
  int64_t c = Submit();
  ASSERT_TRUE(c_->CancelJob(b).ok());
  auto ids = [](const std::vector<v1::Job>& jobs) {
    std::vector<int64_t> out;
    for (const v1::Job& j : jobs) out.push_back(j.id());
    return out;
  };
  v1::ListJobsRequest all;
  EXPECT_THAT(ids(*c_->ListJobs(all)), ElementsAre(c, b, a));
  v1::ListJobsRequest queued;
  queued.add_states(v1::QUEUED);
  EXPECT_THAT(ids(*c_->ListJobs(queued)), ElementsAre(c, a));
  v1::ListJobsRequest one;
  one.set_limit(1);
  EXPECT_THAT(ids(*c_->ListJobs(one)), ElementsAre(c));
  v1::ListJobsRequest negative;
  negative.set_limit(-1);
  absl::Status s = c_->ListJobs(negative).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "limit: must not be negative, got -1");
}

TEST_F(CoordinatorTest, SubscribersSeeTheirJobsEventsInOrder) {
  int64_t job = Submit();
  std::vector<std::string> seen;
  uint64_t sub =
      c_->hub().Subscribe(job, [&](const v1::JobEvent& e) { seen.push_back(Describe(e)); });
  std::string w = Register();
  ASSERT_TRUE(Beat(w).ok());
  ASSERT_TRUE(Step(w, job, 1, 1, 2.0).ok());
  c_->hub().Unsubscribe(sub);
  ASSERT_TRUE(Exit(w, job, 1, 0).ok());
  EXPECT_THAT(seen, ElementsAre("SCHEDULED", "RUNNING", "step 1"));
}

// --- Restarts of failed attempts (coordinator_restart.cc).

TEST_F(CoordinatorTest, FailedAttemptsRestartUpToMaxRestartsThenFail) {
  const int64_t job = Submit({"max_restarts=2"});
  const std::string w = Register();
  ASSERT_THAT(Beat(w)->assignments(), SizeIs(1));
  ASSERT_TRUE(Step(w, job, 1, 1, 4.5).ok());
  ASSERT_TRUE(Exit(w, job, 1, 1, 0, "boom").ok());
  v1::Job j = Job(job);
  EXPECT_EQ(j.state(), v1::RESTARTING);
  EXPECT_EQ(j.attempt(), 1);
  EXPECT_EQ(WorkerInfo(w).state(), v1::WORKER_IDLE);

  auto hb = Beat(w);
  ASSERT_THAT(hb->assignments(), SizeIs(1));
  EXPECT_EQ(hb->assignments(0).attempt(), 2);
  EXPECT_EQ(Job(job).state(), v1::SCHEDULED);
  ASSERT_TRUE(Step(w, job, 2, 2, 4.0).ok());
  ASSERT_TRUE(Exit(w, job, 2, -1, 9).ok());
  EXPECT_EQ(Job(job).state(), v1::RESTARTING);

  ASSERT_THAT(Beat(w)->assignments(), SizeIs(1));
  ASSERT_TRUE(Exit(w, job, 3, 1, 0, "boom again").ok());
  j = Job(job);
  EXPECT_EQ(j.state(), v1::FAILED);
  EXPECT_EQ(j.message(),
            "rank 0 on worker worker-1 exited with code 1: boom again (attempt 3; all 2 "
            "restarts used)");
  EXPECT_THAT(Events(job),
              ElementsAre("QUEUED", "SCHEDULED", "RUNNING", "step 1", "RESTARTING", "SCHEDULED",
                          "RUNNING", "step 2", "RESTARTING", "SCHEDULED", "FAILED"));
  // Every attempt is explained in the job's events.
  auto page = c_->ReadEvents(job, 0, 0);
  ASSERT_TRUE(page.ok());
  std::vector<std::string> messages;
  for (const v1::JobEvent& e : page->events) {
    if (e.has_state_change()) messages.push_back(e.state_change().message());
  }
  EXPECT_EQ(messages[3],
            "attempt 1 failed: rank 0 on worker worker-1 exited with code 1: boom; restart 1 of "
            "2 from the latest checkpoint");
  EXPECT_EQ(messages[4], "attempt 2 scheduled on worker-1");
  EXPECT_THAT(messages[6], StartsWith("attempt 2 failed: rank 0 on worker worker-1 killed by "
                                      "signal 9; restart 2 of 2"));
}

TEST_F(CoordinatorTest, LostWorkersJobRestartsOnAnotherWorker) {
  const int64_t job = Submit({"max_restarts=1"});
  const std::string w1 = Register();
  now_ += absl::Seconds(1);
  const std::string w2 = Register();
  ASSERT_THAT(Beat(w1)->assignments(), SizeIs(1));
  ASSERT_TRUE(Step(w1, job, 1, 1, 4.5).ok());
  now_ += absl::Seconds(6);
  ASSERT_THAT(Beat(w2)->assignments(), IsEmpty());
  now_ += absl::Seconds(5);
  ASSERT_TRUE(c_->CheckLiveness().ok());
  EXPECT_EQ(WorkerInfo(w1).state(), v1::WORKER_LOST);
  EXPECT_EQ(Job(job).state(), v1::RESTARTING);
  auto hb = Beat(w2);
  ASSERT_THAT(hb->assignments(), SizeIs(1));
  EXPECT_EQ(hb->assignments(0).attempt(), 2);
  EXPECT_THAT(Job(job).workers(), ElementsAre(w2));
  ASSERT_TRUE(Step(w2, job, 2, 2, 4.0).ok());
  ASSERT_TRUE(Exit(w2, job, 2, 0).ok());
  EXPECT_EQ(Job(job).state(), v1::SUCCEEDED);

  // The lost worker comes back still running attempt 1: it is told to stop it, and its exit
  // does not touch the finished job.
  EXPECT_EQ(Register("cpu", w1, {Trainer(job, 1)}), w1);
  hb = Beat(w1, {Trainer(job, 1)});
  ASSERT_THAT(hb->cancel(), SizeIs(1));
  ASSERT_TRUE(Exit(w1, job, 1, -1, 15, "", true).ok());
  EXPECT_EQ(Job(job).state(), v1::SUCCEEDED);
}

TEST_F(CoordinatorTest, RestartWaitsUntilTheFailedAttemptsTrainerHasStopped) {
  const int64_t job = Submit({"max_restarts=1"});
  const std::string w = Register();
  ASSERT_THAT(Beat(w)->assignments(), SizeIs(1));
  ASSERT_TRUE(Step(w, job, 1, 1, 4.5).ok());
  now_ += kTimeout + absl::Seconds(1);
  ASSERT_TRUE(c_->CheckLiveness().ok());
  EXPECT_EQ(Job(job).state(), v1::RESTARTING);
  EXPECT_EQ(Job(job).message(), "");
  // Back with attempt 1 still running: never two attempts at once on it.
  EXPECT_EQ(Register("cpu", w, {Trainer(job, 1)}), w);
  auto hb = Beat(w, {Trainer(job, 1)});
  EXPECT_THAT(hb->assignments(), IsEmpty());
  ASSERT_THAT(hb->cancel(), SizeIs(1));
  EXPECT_EQ(hb->cancel(0).attempt(), 1);
  // A late step report of the failed attempt is refused.
  EXPECT_TRUE(Step(w, job, 1, 2, 4.0)->cancel());
  ASSERT_TRUE(Exit(w, job, 1, -1, 15, "", /*cancelled=*/true).ok());
  EXPECT_EQ(Job(job).state(), v1::RESTARTING) << "the old attempt's exit changes nothing";
  hb = Beat(w);
  ASSERT_THAT(hb->assignments(), SizeIs(1));
  EXPECT_EQ(hb->assignments(0).attempt(), 2);
}

TEST_F(CoordinatorTest, TrainerStoppedByItsAgentUnaskedIsRestarted) {
  const int64_t job = Submit({"max_restarts=3"});
  const std::string w = Register();
  ASSERT_THAT(Beat(w)->assignments(), SizeIs(1));
  ASSERT_TRUE(Step(w, job, 1, 1, 4.5).ok());
  ASSERT_TRUE(Exit(w, job, 1, -1, 15, "", /*cancelled=*/true).ok());
  EXPECT_EQ(Job(job).state(), v1::RESTARTING);
  auto page = c_->ReadEvents(job, 0, 0);
  ASSERT_TRUE(page.ok());
  EXPECT_THAT(page->events.back().state_change().message(),
              HasSubstr("rank 0 on worker worker-1 killed by signal 15; restart 1 of 3"));
  // A user's cancel of a restarting job ends it.
  ASSERT_TRUE(c_->CancelJob(job).ok());
  EXPECT_EQ(Job(job).state(), v1::CANCELLED);
  EXPECT_THAT(Beat(w)->assignments(), IsEmpty());
}

TEST_F(CoordinatorTest, JobNotReclaimedAfterACoordinatorRestartIsRestarted) {
  const int64_t job = Submit({"max_restarts=1"});
  const std::string w = Register();
  ASSERT_THAT(Beat(w)->assignments(), SizeIs(1));
  ASSERT_TRUE(Step(w, job, 1, 1, 4.5).ok());
  Restart();
  now_ += kTimeout + absl::Seconds(1);
  ASSERT_TRUE(c_->CheckLiveness().ok());
  EXPECT_EQ(Job(job).state(), v1::RESTARTING);
  const std::string w2 = Register();
  auto hb = Beat(w2);
  ASSERT_THAT(hb->assignments(), SizeIs(1));
  EXPECT_EQ(hb->assignments(0).attempt(), 2);
  EXPECT_THAT(Events(job),
              ElementsAre("QUEUED", "SCHEDULED", "RUNNING", "step 1", "RESTARTING", "SCHEDULED"));
}

// --- Memory estimate at submit and in placement.

TEST_F(CoordinatorTest, JobLargerThanEveryGpuIsRefusedAtSubmitWithTheEstimate) {
  v1::RegisterWorkerRequest r;
  r.mutable_capabilities()->set_backend("cuda");
  r.mutable_capabilities()->set_gpu_name("Tiny GPU");
  r.mutable_capabilities()->set_gpu_memory_bytes(int64_t{2} << 30);
  ASSERT_TRUE(c_->RegisterWorker(r).ok());
  v1::SubmitJobRequest big;
  big.set_spec_yaml("{precision: bf16, model: {preset: gpt2}, training: {batch_size: 16}}");
  auto refused = c_->SubmitJob(big);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(refused.status().message());
  EXPECT_THAT(message, StartsWith("model: this job needs an estimated "));
  EXPECT_THAT(message, HasSubstr("activations"));
  EXPECT_THAT(message, HasSubstr("has 2.00 GiB (worker-1, Tiny GPU)"));
  auto listed = c_->ListJobs(v1::ListJobsRequest());
  ASSERT_TRUE(listed.ok());
  EXPECT_THAT(*listed, IsEmpty()) << "nothing stored";

  // A smaller job fits and is accepted.
  v1::SubmitJobRequest small;
  small.set_spec_yaml(
      "{precision: bf16, model: {hidden: 64, heads: 4, layers: 2, ffn: 256, context: 32}}");
  EXPECT_TRUE(c_->SubmitJob(small).ok());
}

TEST_F(CoordinatorTest, AutoJobIsNotPlacedOnAGpuTooSmallForIt) {
  v1::RegisterWorkerRequest r;
  r.mutable_capabilities()->set_backend("cuda");
  r.mutable_capabilities()->set_gpu_memory_bytes(int64_t{1} << 30);
  auto gpu = c_->RegisterWorker(r);
  ASSERT_TRUE(gpu.ok());
  v1::SubmitJobRequest auto_job;  // backend and precision auto: cpu or cuda
  auto_job.set_spec_yaml("{model: {preset: gpt2}, training: {batch_size: 8}}");
  auto job = c_->SubmitJob(auto_job);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_THAT(Beat(gpu->worker_id())->assignments(), IsEmpty());
  const std::string cpu = Register("cpu");
  auto hb = Beat(cpu);
  ASSERT_THAT(hb->assignments(), SizeIs(1));
  EXPECT_EQ(hb->assignments(0).job_id(), job->id());
}

}  // namespace
}  // namespace boulder::server
