// The coordinator over gRPC, in process: a server on 127.0.0.1:0 with a temp database, a fake
// worker agent and a client, both speaking through the generated stubs.
#include "server/server.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "boulder/v1/job.grpc.pb.h"
#include "boulder/v1/worker.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/test_util.h"
#include "server/watch_job.h"

namespace boulder::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using testing::SmallSpecYaml;
using ::testing::StartsWith;
using testing::TempDir;

// Generous: a loaded 2-core machine must never fail these, and passing tests never wait it.
constexpr absl::Duration kDeadline = absl::Seconds(20);

std::chrono::system_clock::time_point Deadline() {
  return absl::ToChronoTime(absl::Now() + kDeadline);
}

std::string Describe(const v1::JobEvent& e) {
  if (e.has_state_change()) return v1::JobState_Name(e.state_change().state());
  if (e.has_step()) return "step " + std::to_string(e.step().step());
  if (e.has_log()) return "log";
  if (e.has_generation()) return "generation";
  return "?";
}

// One WatchJob stream, read an event at a time.
class Watch {
 public:
  Watch(v1::JobService::Stub* stub, int64_t job_id, int64_t after_seq = 0) {
    context_.set_deadline(Deadline());
    v1::WatchJobRequest r;
    r.set_job_id(job_id);
    r.set_after_seq(after_seq);
    reader_ = stub->WatchJob(&context_, r);
  }
  // The next event's description, or "" at the end of the stream.
  std::string Next() {
    v1::JobEvent e;
    if (!reader_->Read(&e)) return "";
    last_ = e;
    return Describe(e);
  }
  const v1::JobEvent& last() const { return last_; }
  grpc::Status Finish() { return reader_->Finish(); }
  void Cancel() { context_.TryCancel(); }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader_;
  v1::JobEvent last_;
};

class ServerTest : public ::testing::Test {
 protected:
  // Only the metrics test serves metrics: the HTTP server takes up to 2 s to stop.
  void StartServer(absl::Duration heartbeat_timeout = absl::Seconds(10), bool metrics = false) {
    ServerOptions options;
    options.security.insecure = true;
    options.listen = "127.0.0.1:0";
    if (metrics) options.metrics_listen = "127.0.0.1:0";
    options.db_path = dir_.File("boulder.db");
    options.heartbeat_timeout = heartbeat_timeout;
    options.heartbeat_interval = std::min(absl::Milliseconds(500), heartbeat_timeout / 4);
    options.shutdown_grace = absl::Milliseconds(300);
    auto server = CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_THAT(server_->address(), StartsWith("127.0.0.1:"));
    ASSERT_NE(server_->address(), "127.0.0.1:0");
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    jobs_ = v1::JobService::NewStub(channel_);
    workers_ = v1::WorkerService::NewStub(channel_);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  template <typename Request, typename Response, typename Stub, typename Method>
  grpc::Status Call(Stub* stub, Method method, const Request& request, Response* response) {
    grpc::ClientContext context;
    context.set_deadline(Deadline());
    return (stub->*method)(&context, request, response);
  }

  grpc::Status Submit(const std::vector<std::string>& overrides, v1::Job* job) {
    v1::SubmitJobRequest r;
    r.set_spec_yaml(SmallSpecYaml());
    for (const std::string& o : overrides) r.add_overrides(o);
    v1::SubmitJobResponse resp;
    grpc::Status s = Call(jobs_.get(), &v1::JobService::Stub::SubmitJob, r, &resp);
    *job = resp.job();
    return s;
  }

  std::string Register() {
    v1::RegisterWorkerRequest r;
    r.mutable_capabilities()->set_backend("cpu");
    r.mutable_capabilities()->set_cpu_cores(2);
    v1::RegisterWorkerResponse resp;
    grpc::Status s = Call(workers_.get(), &v1::WorkerService::Stub::RegisterWorker, r, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_GT(resp.heartbeat_interval_ms(), 0);
    return resp.worker_id();
  }

  grpc::Status Heartbeat(const std::string& id, const std::vector<std::pair<int64_t, int>>& running,
                         v1::HeartbeatResponse* resp) {
    v1::HeartbeatRequest r;
    r.set_worker_id(id);
    for (auto [job, attempt] : running) {
      v1::RunningTrainer* t = r.add_running();
      t->set_job_id(job);
      t->set_attempt(attempt);
    }
    return Call(workers_.get(), &v1::WorkerService::Stub::Heartbeat, r, resp);
  }

  grpc::Status ReportStep(const std::string& id, int64_t job, int64_t step, double loss,
                          v1::ReportStepsResponse* resp) {
    v1::ReportStepsRequest r;
    r.set_worker_id(id);
    r.set_job_id(job);
    r.set_attempt(1);
    r.add_steps()->set_step(step);
    r.mutable_steps(0)->set_loss(loss);
    r.mutable_steps(0)->set_total_steps(20);
    return Call(workers_.get(), &v1::WorkerService::Stub::ReportSteps, r, resp);
  }

  grpc::Status ReportExit(const std::string& id, int64_t job, int code, bool cancelled) {
    v1::ReportExitRequest r;
    r.set_worker_id(id);
    r.set_job_id(job);
    r.set_attempt(1);
    r.set_exit_code(code);
    r.set_cancelled(cancelled);
    v1::ReportExitResponse resp;
    return Call(workers_.get(), &v1::WorkerService::Stub::ReportExit, r, &resp);
  }

  v1::Job GetJob(int64_t id) {
    v1::GetJobRequest r;
    r.set_job_id(id);
    v1::Job job;
    grpc::Status s = Call(jobs_.get(), &v1::JobService::Stub::GetJob, r, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }

  std::vector<v1::Worker> ListWorkers() {
    v1::ListWorkersResponse resp;
    grpc::Status s = Call(workers_.get(), &v1::WorkerService::Stub::ListWorkers,
                          v1::ListWorkersRequest(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return {resp.workers().begin(), resp.workers().end()};
  }

  // Submits a job and has the fake worker start it (one step reported).
  void StartJob(std::string* worker, int64_t* job_id) {
    *worker = Register();
    v1::Job job;
    ASSERT_TRUE(Submit({}, &job).ok());
    *job_id = job.id();
    v1::HeartbeatResponse hb;
    ASSERT_TRUE(Heartbeat(*worker, {}, &hb).ok());
    ASSERT_THAT(hb.assignments(), SizeIs(1));
    v1::ReportStepsResponse steps;
    ASSERT_TRUE(ReportStep(*worker, *job_id, 1, 4.5, &steps).ok());
  }

  TempDir dir_;
  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
};

TEST(ServerStartTest, RejectsBadOptions) {
  TempDir dir;
  ServerOptions options;
  options.security.insecure = true;
  options.db_path = dir.File("db");
  options.listen = "localhost";
  absl::Status s = CoordinatorServer::Start(options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "listen: expected HOST:PORT, got 'localhost'");
  options.listen = "127.0.0.1:0";
  options.metrics_listen = ":9090";
  s = CoordinatorServer::Start(options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "metrics_listen: expected HOST:PORT, got ':9090'");
  options.metrics_listen.clear();
  options.db_path.clear();
  s = CoordinatorServer::Start(options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "db: a path is required");
}

TEST_F(ServerTest, SubmitScheduleRunWatchSucceed) {
  StartServer();
  std::string worker = Register();
  EXPECT_EQ(worker, "worker-1");
  v1::HeartbeatResponse hb;
  ASSERT_TRUE(Heartbeat(worker, {}, &hb).ok());
  EXPECT_THAT(hb.assignments(), IsEmpty());

  v1::Job job;
  grpc::Status bad = Submit({"model.heads=7"}, &job);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), StartsWith("model.heads: 7 does not divide hidden 64"));

  ASSERT_TRUE(Submit({}, &job).ok());
  EXPECT_EQ(job.id(), 1);
  EXPECT_EQ(job.state(), v1::QUEUED);
  EXPECT_EQ(job.spec().resources().backend(), "cpu");

  Watch watch(jobs_.get(), job.id());
  EXPECT_EQ(watch.Next(), "QUEUED");  // backlog

  ASSERT_TRUE(Heartbeat(worker, {}, &hb).ok());
  ASSERT_THAT(hb.assignments(), SizeIs(1));
  EXPECT_EQ(hb.assignments(0).job_id(), job.id());
  EXPECT_EQ(hb.assignments(0).rank(), 0);
  EXPECT_EQ(hb.assignments(0).world_size(), 1);
  EXPECT_EQ(watch.Next(), "SCHEDULED");  // live from here on
  EXPECT_EQ(watch.last().state_change().message(), "scheduled on worker-1");

  ASSERT_TRUE(Heartbeat(worker, {{job.id(), 1}}, &hb).ok());
  EXPECT_THAT(hb.assignments(), IsEmpty());
  v1::ReportStepsResponse steps;
  ASSERT_TRUE(ReportStep(worker, job.id(), 1, 4.5, &steps).ok());
  EXPECT_FALSE(steps.cancel());
  EXPECT_EQ(GetJob(job.id()).state(), v1::RUNNING);
  EXPECT_EQ(watch.Next(), "RUNNING");
  EXPECT_EQ(watch.Next(), "step 1");
  EXPECT_DOUBLE_EQ(watch.last().step().loss(), 4.5);
  ASSERT_TRUE(ReportStep(worker, job.id(), 2, 0.5, &steps).ok());
  EXPECT_EQ(watch.Next(), "step 2");

  ASSERT_TRUE(ReportExit(worker, job.id(), 0, false).ok());
  EXPECT_EQ(watch.Next(), "SUCCEEDED");
  EXPECT_EQ(watch.Next(), "");
  EXPECT_TRUE(watch.Finish().ok());

  v1::Job done = GetJob(job.id());
  EXPECT_EQ(done.state(), v1::SUCCEEDED);
  EXPECT_DOUBLE_EQ(done.latest_report().loss(), 0.5);
  ASSERT_THAT(ListWorkers(), SizeIs(1));
  EXPECT_EQ(ListWorkers()[0].state(), v1::WORKER_IDLE);

  // A late watcher replays the stored events after its cursor and ends.
  Watch replay(jobs_.get(), job.id(), /*after_seq=*/3);
  EXPECT_EQ(replay.Next(), "step 1");
  EXPECT_EQ(replay.last().seq(), 4);
  EXPECT_EQ(replay.Next(), "step 2");
  EXPECT_EQ(replay.Next(), "SUCCEEDED");
  EXPECT_EQ(replay.Next(), "");
  EXPECT_TRUE(replay.Finish().ok());
  // Past the end: nothing to write, the job is over.
  Watch past(jobs_.get(), job.id(), /*after_seq=*/100);
  EXPECT_EQ(past.Next(), "");
  EXPECT_TRUE(past.Finish().ok());

  v1::ListJobsResponse list;
  ASSERT_TRUE(
      Call(jobs_.get(), &v1::JobService::Stub::ListJobs, v1::ListJobsRequest(), &list).ok());
  ASSERT_THAT(list.jobs(), SizeIs(1));
  EXPECT_EQ(list.jobs(0).state(), v1::SUCCEEDED);
}

TEST_F(ServerTest, CancelRunningJob) {
  StartServer();
  std::string worker;
  int64_t job;
  StartJob(&worker, &job);
  Watch watch(jobs_.get(), job);

  v1::CancelJobRequest cancel;
  cancel.set_job_id(job);
  v1::Job cancelled;
  ASSERT_TRUE(Call(jobs_.get(), &v1::JobService::Stub::CancelJob, cancel, &cancelled).ok());
  EXPECT_EQ(cancelled.state(), v1::CANCELLED);
  EXPECT_EQ(cancelled.message(), "cancelled by user");

  std::vector<std::string> seen;
  for (std::string e = watch.Next(); !e.empty(); e = watch.Next()) seen.push_back(e);
  EXPECT_THAT(seen, ElementsAre("QUEUED", "SCHEDULED", "RUNNING", "step 1", "CANCELLED"));
  EXPECT_TRUE(watch.Finish().ok());

  v1::HeartbeatResponse hb;
  ASSERT_TRUE(Heartbeat(worker, {{job, 1}}, &hb).ok());
  ASSERT_THAT(hb.cancel(), SizeIs(1));
  EXPECT_EQ(hb.cancel(0).job_id(), job);
  v1::ReportStepsResponse steps;
  ASSERT_TRUE(ReportStep(worker, job, 2, 4.0, &steps).ok());
  EXPECT_TRUE(steps.cancel());
  EXPECT_EQ(ListWorkers()[0].state(), v1::WORKER_BUSY);
  ASSERT_TRUE(ReportExit(worker, job, -1, true).ok());
  EXPECT_EQ(ListWorkers()[0].state(), v1::WORKER_IDLE);
  EXPECT_EQ(GetJob(job).state(), v1::CANCELLED);

  grpc::Status again = Call(jobs_.get(), &v1::JobService::Stub::CancelJob, cancel, &cancelled);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(again.error_message(), "job 1 already CANCELLED");
}

TEST_F(ServerTest, LostWorkerFailsItsJob) {
  // Short, but long enough that a loaded machine does not lose the worker while it starts.
  StartServer(/*heartbeat_timeout=*/absl::Seconds(1));
  std::string worker;
  int64_t job;
  StartJob(&worker, &job);
  // The fake worker goes silent; the watch ends when the liveness check fails the job.
  Watch watch(jobs_.get(), job);
  std::string last;
  for (std::string e = watch.Next(); !e.empty(); e = watch.Next()) last = e;
  EXPECT_TRUE(watch.Finish().ok());
  EXPECT_EQ(last, "FAILED");
  EXPECT_EQ(watch.last().state_change().message(), "worker worker-1 lost: no heartbeat for 1.0 s");
  EXPECT_EQ(GetJob(job).message(), "worker worker-1 lost: no heartbeat for 1.0 s");
  EXPECT_EQ(ListWorkers()[0].state(), v1::WORKER_LOST);

  v1::HeartbeatResponse hb;
  grpc::Status s = Heartbeat(worker, {{job, 1}}, &hb);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("register again"));
}

TEST_F(ServerTest, LongHistoryIsReplayedInOrderWhileLiveEventsArrive) {
  StartServer();
  std::string worker;
  int64_t job;
  StartJob(&worker, &job);  // events 1..4: QUEUED, SCHEDULED, RUNNING, step 1
  auto report = [&](int first_step, int steps, int logs) {
    v1::ReportStepsRequest r;
    r.set_worker_id(worker);
    r.set_job_id(job);
    r.set_attempt(1);
    for (int i = 0; i < steps; ++i) r.add_steps()->set_step(first_step + i);
    // Large lines: more backlog than HTTP/2 flow control lets the server write ahead, so the
    // backlog is still being written when the live events below are committed.
    for (int i = 0; i < logs; ++i) r.add_logs()->set_text(std::string(16 << 10, 'x'));
    v1::ReportStepsResponse resp;
    ASSERT_TRUE(Call(workers_.get(), &v1::WorkerService::Stub::ReportSteps, r, &resp).ok());
  };
  const int pages = 3;
  for (int i = 0; i < pages * 4; ++i) report(2 + i * 10, 10, WatchJobReactor::kPageSize / 4);
  const int backlog_steps = 1 + pages * 4 * 10;
  Watch watch(jobs_.get(), job);
  EXPECT_EQ(watch.Next(), "QUEUED");
  report(backlog_steps + 1, 10, 0);
  ASSERT_TRUE(ReportExit(worker, job, 0, false).ok());
  int64_t seq = 1;
  int64_t step = 0;
  std::string last;
  for (std::string e = watch.Next(); !e.empty(); e = watch.Next()) {
    ASSERT_EQ(watch.last().seq(), ++seq) << "gap-free, no repeats";
    if (watch.last().has_step()) {
      ASSERT_EQ(watch.last().step().step(), ++step);
    }
    last = e;
  }
  EXPECT_TRUE(watch.Finish().ok());
  EXPECT_EQ(step, backlog_steps + 10);
  EXPECT_EQ(last, "SUCCEEDED");
  EXPECT_EQ(seq, 4 + (backlog_steps - 1) + pages * WatchJobReactor::kPageSize + 10 + 1);
}

TEST_F(ServerTest, UnknownJobsAreNotFound) {
  StartServer();
  v1::GetJobRequest get;
  get.set_job_id(42);
  v1::Job job;
  grpc::Status s = Call(jobs_.get(), &v1::JobService::Stub::GetJob, get, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "job 42 not found");
  Watch watch(jobs_.get(), 42);
  EXPECT_EQ(watch.Next(), "");
  s = watch.Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "job 42 not found");
  v1::GetJobLogsRequest logs;
  logs.set_job_id(42);
  v1::GetJobLogsResponse lines;
  s = Call(jobs_.get(), &v1::JobService::Stub::GetJobLogs, logs, &lines);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServerTest, ClientCancellingAWatchReleasesIt) {
  StartServer();
  v1::Job job;
  ASSERT_TRUE(Submit({}, &job).ok());
  auto watch = std::make_unique<Watch>(jobs_.get(), job.id());
  EXPECT_EQ(watch->Next(), "QUEUED");
  EXPECT_EQ(server_->coordinator().hub().size(), 1u);
  watch->Cancel();
  EXPECT_EQ(watch->Next(), "");
  EXPECT_EQ(watch->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The server side finishes on its own schedule; its subscription goes in OnDone.
  EXPECT_TRUE(server_->coordinator().hub().AwaitSize(0, kDeadline));
}

TEST_F(ServerTest, ShutdownEndsOpenWatches) {
  StartServer();
  v1::Job job;
  ASSERT_TRUE(Submit({}, &job).ok());
  Watch watch(jobs_.get(), job.id());
  EXPECT_EQ(watch.Next(), "QUEUED");
  server_->Shutdown();
  EXPECT_EQ(watch.Next(), "");
  EXPECT_FALSE(watch.Finish().ok());
}

TEST_F(ServerTest, HealthServing) {
  StartServer();
  EXPECT_EQ(server_->metrics_address(), "");
  grpc::GenericStub generic(channel_);
  grpc::ClientContext context;
  context.set_deadline(Deadline());
  // grpc.health.v1.HealthCheckRequest{service: ""} is the empty message.
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  generic.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                    &response, [&](grpc::Status s) {
                      status = s;
                      done.Notify();
                    });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(kDeadline));
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2)) << "status: SERVING";
}

TEST_F(ServerTest, ReflectionListsTheServices) {
  StartServer();
  grpc::GenericStub generic(channel_);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(Deadline());
  auto call = generic.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  auto step = [&](int tag) {
    void* got = nullptr;
    bool ok = false;
    EXPECT_EQ(cq.AsyncNext(&got, &ok, Deadline()), grpc::CompletionQueue::GOT_EVENT);
    EXPECT_EQ(got, reinterpret_cast<void*>(tag));
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(step(1));
  // ServerReflectionRequest{list_services: ""}: field 7, length-delimited, empty.
  grpc::Slice list_services(std::string("\x3a\x00", 2));
  grpc::ByteBuffer request(&list_services, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(step(2));
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(step(3));
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(4));
  ASSERT_TRUE(step(4));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  ASSERT_TRUE(step(5));
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  EXPECT_THAT(bytes, HasSubstr("boulder.v1.JobService"));
  EXPECT_THAT(bytes, HasSubstr("boulder.v1.WorkerService"));
  EXPECT_THAT(bytes, HasSubstr("grpc.health.v1.Health"));
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_F(ServerTest, MetricsEndpointExportsTheFamilies) {
  StartServer(absl::Seconds(10), /*metrics=*/true);
  ASSERT_THAT(server_->metrics_address(), StartsWith("127.0.0.1:"));
  std::string worker = Register();
  v1::Job job;
  ASSERT_TRUE(Submit({}, &job).ok());
  ASSERT_EQ(Submit({"model.heads=7"}, &job).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto body = testing::HttpGet(server_->metrics_address(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("boulder_jobs{state=\"QUEUED\"} 1"));
  EXPECT_THAT(*body, HasSubstr("boulder_jobs{state=\"RUNNING\"} 0"));
  EXPECT_THAT(*body, HasSubstr("boulder_queue_length 1"));
  EXPECT_THAT(*body, HasSubstr("boulder_workers{state=\"WORKER_IDLE\"} 1"));
  EXPECT_THAT(*body, HasSubstr("boulder_rpc_requests_total{code=\"OK\",method=\"SubmitJob\"} 1"));
  EXPECT_THAT(*body, HasSubstr("boulder_rpc_requests_total{code=\"INVALID_ARGUMENT\","
                               "method=\"SubmitJob\"} 1"));
  EXPECT_THAT(*body, HasSubstr("boulder_rpc_duration_seconds_count{method=\"SubmitJob\"} 2"));
  EXPECT_THAT(*body, HasSubstr("# HELP boulder_job_submit_to_running_seconds"));
  EXPECT_THAT(*body, HasSubstr("boulder_heartbeats_missed_total 0"));
}

}  // namespace
}  // namespace boulder::server
