#include "server/job_store.h"

#include <sqlite3.h>

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"
#include "server/test_util.h"

namespace boulder::server {
namespace {

using google::protobuf::util::TimeUtil;
using ::testing::ElementsAre;
using testing::EqualsProto;
using ::testing::HasSubstr;
using ::testing::SizeIs;
using testing::TempDir;

std::unique_ptr<JobStore> OpenOrDie(const std::string& path) {
  auto store = JobStore::Open(path);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

v1::Job MakeJob(const std::string& name, v1::JobState state) {
  v1::Job job;
  job.set_name(name);
  job.set_state(state);
  job.mutable_spec()->set_name(name);
  job.mutable_spec()->mutable_training()->set_steps(50);
  job.mutable_spec()->mutable_resources()->set_backend("cpu");
  *job.mutable_create_time() = TimeUtil::MicrosecondsToTimestamp(1'700'000'000'123'456);
  return job;
}

v1::JobEvent StateEvent(int64_t job_id, v1::JobState state) {
  v1::JobEvent e;
  e.set_job_id(job_id);
  *e.mutable_time() = TimeUtil::MicrosecondsToTimestamp(1'700'000'001'000'000);
  e.mutable_state_change()->set_state(state);
  return e;
}

std::vector<int64_t> Seqs(const std::vector<v1::JobEvent>& events) {
  std::vector<int64_t> seqs;
  for (const v1::JobEvent& e : events) seqs.push_back(e.seq());
  return seqs;
}

TEST(JobStoreTest, AssignsIdsFromOne) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("db"));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(*store->InsertJob(MakeJob("a", v1::QUEUED)), 1);
  EXPECT_EQ(*store->InsertJob(MakeJob("b", v1::QUEUED)), 2);
  EXPECT_EQ(*store->InsertJob(MakeJob("c", v1::QUEUED)), 3);
}

TEST(JobStoreTest, SubmittedJobSurvivesReopening) {
  TempDir dir;
  v1::Job job = MakeJob("survivor", v1::QUEUED);
  {
    auto store = OpenOrDie(dir.File("db"));
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store
                    ->Transaction([&]() -> absl::Status {
                      auto id = store->InsertJob(job);
                      if (!id.ok()) return id.status();
                      job.set_id(*id);
                      v1::JobEvent e = StateEvent(*id, v1::QUEUED);
                      return store->AppendEvent(&e);
                    })
                    .ok());
  }
  auto store = OpenOrDie(dir.File("db"));
  ASSERT_NE(store, nullptr);
  auto loaded = store->GetJob(job.id());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_THAT(*loaded, EqualsProto(job));
  auto events = store->ListEvents(job.id(), 0, 0);
  ASSERT_TRUE(events.ok());
  ASSERT_THAT(*events, SizeIs(1));
  EXPECT_EQ((*events)[0].state_change().state(), v1::QUEUED);
  // Ids keep counting after a reopen.
  EXPECT_EQ(*store->InsertJob(MakeJob("next", v1::QUEUED)), job.id() + 1);
}

TEST(JobStoreTest, EveryColumnRoundTrips) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("db"));
  ASSERT_NE(store, nullptr);
  v1::Job job = MakeJob("full", v1::QUEUED);
  job.set_id(*store->InsertJob(job));
  job.set_state(v1::FAILED);
  job.set_message("rank 0 on worker w exited with code 1: boom");
  *job.mutable_start_time() = TimeUtil::MicrosecondsToTimestamp(1'700'000'002'000'000);
  *job.mutable_end_time() = TimeUtil::MicrosecondsToTimestamp(1'700'000'003'000'000);
  job.set_attempt(2);
  job.add_workers("worker-1");
  job.add_workers("worker-2");
  job.mutable_latest_report()->set_step(7);
  job.mutable_latest_report()->set_loss(1.25);
  job.mutable_generation()->add_prompt(3);
  job.mutable_generation()->add_tokens(5);
  ASSERT_TRUE(store->UpdateJob(job).ok());
  EXPECT_THAT(*store->GetJob(job.id()), EqualsProto(job));
}

TEST(JobStoreTest, UnknownJobIsNotFound) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("db"));
  ASSERT_NE(store, nullptr);
  absl::Status s = store->GetJob(42).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "job 42 not found");
  v1::Job ghost = MakeJob("ghost", v1::QUEUED);
  ghost.set_id(42);
  EXPECT_EQ(store->UpdateJob(ghost).code(), absl::StatusCode::kNotFound);
}

TEST(JobStoreTest, EventsAreOrderedAndGapFreePerJob) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("db"));
  ASSERT_NE(store, nullptr);
  int64_t a = *store->InsertJob(MakeJob("a", v1::QUEUED));
  int64_t b = *store->InsertJob(MakeJob("b", v1::QUEUED));
  for (int i = 0; i < 5; ++i) {
    v1::JobEvent step;
    step.set_job_id(a);
    step.mutable_step()->set_step(i + 1);
    ASSERT_TRUE(store->AppendEvent(&step).ok());
    EXPECT_EQ(step.seq(), i + 1);
    v1::JobEvent log;
    log.set_job_id(b);
    log.mutable_log()->set_text("line");
    ASSERT_TRUE(store->AppendEvent(&log).ok());
    EXPECT_EQ(log.seq(), i + 1);
  }
  EXPECT_THAT(Seqs(*store->ListEvents(a, 0, 0)), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_THAT(Seqs(*store->ListEvents(a, 2, 0)), ElementsAre(3, 4, 5));
  EXPECT_THAT(Seqs(*store->ListEvents(a, 1, 2)), ElementsAre(2, 3));
  EXPECT_THAT(Seqs(*store->ListEvents(a, 5, 0)), ElementsAre());
  auto steps = store->ListEvents(a, 0, 0);
  EXPECT_EQ((*steps)[3].step().step(), 4);
  EXPECT_EQ((*steps)[3].job_id(), a);
  EXPECT_THAT(*store->ListEvents(a, 0, 0, v1::JobEvent::kLog), SizeIs(0));
  EXPECT_THAT(*store->ListEvents(b, 0, 0, v1::JobEvent::kLog), SizeIs(5));
}

TEST(JobStoreTest, FailedTransactionLeavesNothing) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("db"));
  ASSERT_NE(store, nullptr);
  absl::Status s = store->Transaction([&]() -> absl::Status {
    auto id = store->InsertJob(MakeJob("doomed", v1::QUEUED));
    EXPECT_TRUE(id.ok());
    v1::JobEvent e = StateEvent(*id, v1::QUEUED);
    EXPECT_TRUE(store->AppendEvent(&e).ok());
    return absl::AbortedError("changed my mind");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(store->GetJob(1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(*store->ListEvents(1, 0, 0), SizeIs(0));
  EXPECT_THAT(*store->ListJobs({}, 0, JobStore::Order::kNewestFirst), SizeIs(0));
}

TEST(JobStoreTest, ListJobsOrdersFiltersAndLimits) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("db"));
  ASSERT_NE(store, nullptr);
  const v1::JobState states[] = {v1::QUEUED, v1::RUNNING, v1::QUEUED, v1::SUCCEEDED, v1::QUEUED};
  for (v1::JobState s : states) ASSERT_TRUE(store->InsertJob(MakeJob("j", s)).ok());
  auto ids = [](const std::vector<v1::Job>& jobs) {
    std::vector<int64_t> out;
    for (const v1::Job& j : jobs) out.push_back(j.id());
    return out;
  };
  EXPECT_THAT(ids(*store->ListJobs({}, 0, JobStore::Order::kNewestFirst)),
              ElementsAre(5, 4, 3, 2, 1));
  EXPECT_THAT(ids(*store->ListJobs({v1::QUEUED}, 0, JobStore::Order::kOldestFirst)),
              ElementsAre(1, 3, 5));
  EXPECT_THAT(ids(*store->ListJobs({v1::RUNNING, v1::SUCCEEDED}, 0, JobStore::Order::kNewestFirst)),
              ElementsAre(4, 2));
  EXPECT_THAT(ids(*store->ListJobs({}, 2, JobStore::Order::kNewestFirst)), ElementsAre(5, 4));
  auto counts = store->CountJobsByState();
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->at(v1::QUEUED), 3);
  EXPECT_EQ(counts->at(v1::RUNNING), 1);
  EXPECT_EQ(counts->at(v1::SUCCEEDED), 1);
  EXPECT_EQ(counts->count(v1::FAILED), 0u);
}

TEST(JobStoreTest, WorkersRoundTrip) {
  TempDir dir;
  v1::Worker w;
  w.set_id("worker-2");
  w.mutable_capabilities()->set_backend("cuda");
  w.mutable_capabilities()->set_gpu_name("NVIDIA H200");
  w.set_state(v1::WORKER_BUSY);
  *w.mutable_last_heartbeat() = TimeUtil::MicrosecondsToTimestamp(1'700'000'005'000'000);
  *w.mutable_register_time() = TimeUtil::MicrosecondsToTimestamp(1'700'000'004'000'000);
  w.set_job_id(9);
  w.set_rank(1);
  {
    auto store = OpenOrDie(dir.File("db"));
    ASSERT_NE(store, nullptr);
    v1::Worker first = w;
    first.set_id("worker-1");
    first.set_state(v1::WORKER_IDLE);
    first.set_job_id(0);
    first.set_rank(0);
    ASSERT_TRUE(store->PutWorker(w).ok());
    ASSERT_TRUE(store->PutWorker(first).ok());
    w.set_state(v1::WORKER_LOST);  // overwrite
    ASSERT_TRUE(store->PutWorker(w).ok());
  }
  auto store = OpenOrDie(dir.File("db"));
  ASSERT_NE(store, nullptr);
  auto workers = store->ListWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_THAT(*workers, SizeIs(2));
  EXPECT_EQ((*workers)[0].id(), "worker-1");
  EXPECT_THAT((*workers)[1], EqualsProto(w));
}

TEST(JobStoreTest, SecondOpenWhileHeldFails) {
  TempDir dir;
  auto first = OpenOrDie(dir.File("db"));
  ASSERT_NE(first, nullptr);
  auto second = JobStore::Open(dir.File("db"));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("in use by another process"));
  first.reset();
  EXPECT_TRUE(JobStore::Open(dir.File("db")).ok());
}

TEST(JobStoreTest, NewerSchemaIsRefused) {
  TempDir dir;
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(dir.File("db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 3", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto store = JobStore::Open(dir.File("db"));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(),
              HasSubstr("schema version 3 is newer than this coordinator's (2)"));
}

TEST(JobStoreTest, UnopenableFileIsAPrecondition) {
  TempDir dir;
  auto store = JobStore::Open(dir.File("no/such/dir/db"));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr("cannot open database"));
}

}  // namespace
}  // namespace boulder::server
