// Test-only: an in-process fake coordinator (JobService and WorkerService on 127.0.0.1, gRPC
// callback API) with scripted events, and the fixture that starts it, shared by the command
// tests (commands_test.cc, commands_views_test.cc).
#ifndef BOULDER_CLIENT_FAKE_COORDINATOR_TEST_UTIL_H_
#define BOULDER_CLIENT_FAKE_COORDINATOR_TEST_UTIL_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "boulder/v1/job.grpc.pb.h"
#include "boulder/v1/worker.grpc.pb.h"
#include "client/commands.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace boulder::client {

// Serves scripted events: each WatchJob call replays `events` after the requested seq; the
// first `fail_calls` calls end with UNAVAILABLE after `fail_after_events` events.
class FakeJobService final : public v1::JobService::CallbackService {
 public:
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
                                      v1::SubmitJobResponse* response) override {
    std::lock_guard<std::mutex> lock(mu);
    submits.push_back(*request);
    *response->mutable_job() = job;
    response->mutable_job()->set_state(v1::QUEUED);
    return Done(context, submit_status);
  }

  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request, v1::Job* response) override {
    std::lock_guard<std::mutex> lock(mu);
    if (request->job_id() != job.id()) {
      return Done(context, grpc::Status(grpc::StatusCode::NOT_FOUND,
                                        absl::StrCat("job ", request->job_id(), " not found")));
    }
    *response = job;
    return Done(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override {
    std::lock_guard<std::mutex> lock(mu);
    list_requests.push_back(*request);
    *response->add_jobs() = job;
    return Done(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::Job* response) override {
    std::lock_guard<std::mutex> lock(mu);
    cancelled.push_back(request->job_id());
    *response = job;
    response->set_state(v1::CANCELLED);
    return Done(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* GetJobLogs(grpc::CallbackServerContext* context,
                                       const v1::GetJobLogsRequest* request,
                                       v1::GetJobLogsResponse* response) override {
    std::lock_guard<std::mutex> lock(mu);
    for (const v1::JobEvent& e : events) {
      if (e.has_log()) *response->add_lines() = e.log();
    }
    return Done(context, grpc::Status::OK);
  }

  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(grpc::CallbackServerContext* context,
                                                   const v1::WatchJobRequest* request) override {
    std::lock_guard<std::mutex> lock(mu);
    watch_after_seqs.push_back(request->after_seq());
    std::vector<v1::JobEvent> to_send;
    for (const v1::JobEvent& e : events) {
      if (e.seq() > request->after_seq()) to_send.push_back(e);
    }
    grpc::Status end = grpc::Status::OK;
    if (fail_calls > 0) {
      --fail_calls;
      if (to_send.size() > fail_after_events) to_send.resize(fail_after_events);
      end = grpc::Status(grpc::StatusCode::UNAVAILABLE, "Connection reset by peer");
    }
    return new EventWriter(std::move(to_send), end);
  }

  std::mutex mu;
  v1::Job job;
  std::vector<v1::JobEvent> events;
  grpc::Status submit_status;
  int fail_calls = 0;
  size_t fail_after_events = 0;
  std::vector<v1::SubmitJobRequest> submits;
  std::vector<v1::ListJobsRequest> list_requests;
  std::vector<int64_t> cancelled;
  std::vector<int64_t> watch_after_seqs;

 private:
  // Writes its events one at a time (each kept alive until written), then finishes once.
  class EventWriter final : public grpc::ServerWriteReactor<v1::JobEvent> {
   public:
    EventWriter(std::vector<v1::JobEvent> events, grpc::Status end)
        : events_(std::move(events)), end_(std::move(end)) {
      Next();
    }
    void OnWriteDone(bool ok) override {
      if (!ok) {
        FinishOnce(grpc::Status::CANCELLED);
        return;
      }
      Next();
    }
    void OnCancel() override {}
    void OnDone() override { delete this; }

   private:
    void Next() {
      if (next_ == events_.size()) {
        FinishOnce(end_);
        return;
      }
      StartWrite(&events_[next_++]);
    }
    void FinishOnce(const grpc::Status& status) {
      if (finished_) return;
      finished_ = true;
      Finish(status);
    }
    std::vector<v1::JobEvent> events_;
    grpc::Status end_;
    size_t next_ = 0;
    bool finished_ = false;
  };

  static grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context,
                                        const grpc::Status& status) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(status);
    return reactor;
  }
};

class FakeWorkerService final : public v1::WorkerService::CallbackService {
 public:
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override {
    v1::Worker* w = response->add_workers();
    w->set_id("w-1");
    w->mutable_capabilities()->set_backend("cpu");
    w->mutable_capabilities()->set_cpu_cores(2);
    w->set_state(v1::WORKER_BUSY);
    w->set_job_id(7);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

inline v1::JobEvent StateEvent(int64_t seq, v1::JobState state, const std::string& message = "") {
  v1::JobEvent e;
  e.set_job_id(7);
  e.set_seq(seq);
  e.mutable_state_change()->set_state(state);
  e.mutable_state_change()->set_message(message);
  return e;
}

inline v1::JobEvent StepEvent(int64_t seq, int64_t step, int64_t total) {
  v1::JobEvent e;
  e.set_job_id(7);
  e.set_seq(seq);
  v1::StepReport* r = e.mutable_step();
  r->set_step(step);
  r->set_total_steps(total);
  r->set_loss(4.0 / step);
  r->set_lr(3e-4);
  r->set_tokens_per_second(2048);
  r->set_step_time_seconds(0.25);
  return e;
}

inline v1::JobEvent LogEvent(int64_t seq, const std::string& text) {
  v1::JobEvent e;
  e.set_job_id(7);
  e.set_seq(seq);
  e.mutable_log()->set_text(text);
  return e;
}

// A port on 127.0.0.1 that nothing listens on: bound by the kernel, then released.
inline int UnusedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

class CommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&jobs_);
    builder.RegisterService(&workers_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    connect_.address = absl::StrCat("127.0.0.1:", port);
    connect_.security.insecure = true;

    jobs_.job.set_id(7);
    jobs_.job.set_name("minigpt");
    jobs_.job.set_state(v1::SUCCEEDED);
    jobs_.job.add_workers("w-1");
    jobs_.job.mutable_spec()->set_name("minigpt");
    jobs_.job.mutable_spec()->mutable_model()->set_vocab_size(96);
    jobs_.job.mutable_latest_report()->set_step(100);
    jobs_.job.mutable_latest_report()->set_total_steps(100);
    jobs_.job.mutable_latest_report()->set_loss(0.04);

    io_.out = &out_;
    io_.err = &err_;
    io_.clock = [] { return absl::FromUnixSeconds(1764667200); };
    io_.zone = absl::UTCTimeZone();
  }

  void TearDown() override {
    server_->Shutdown(std::chrono::system_clock::now());
    if (!spec_path_.empty()) std::remove(spec_path_.c_str());
  }

  // QUEUED, RUNNING, `steps` step reports, the generation, then `final_state`.
  void ScriptRun(int steps, v1::JobState final_state, const std::string& message = "") {
    int64_t seq = 0;
    jobs_.events.push_back(StateEvent(++seq, v1::QUEUED));
    // A coordinator's message that restates the worker is not repeated.
    jobs_.events.push_back(StateEvent(++seq, v1::RUNNING, "running on w-1"));
    for (int s = 1; s <= steps; ++s) jobs_.events.push_back(StepEvent(++seq, s, steps));
    if (final_state == v1::SUCCEEDED) {
      v1::JobEvent gen;
      gen.set_job_id(7);
      gen.set_seq(++seq);
      for (int32_t t : {5, 9, 13, 17, 21}) gen.mutable_generation()->add_prompt(t);
      for (int32_t t : {25, 29, 33}) gen.mutable_generation()->add_tokens(t);
      jobs_.events.push_back(gen);
    }
    jobs_.events.push_back(StateEvent(++seq, final_state, message));
  }

  // One file per process and test: ctest runs this binary's tests as parallel processes, which
  // with one shared name read each other's specs (a 1 MiB one, once, failing another test).
  std::string WriteSpec(const std::string& contents) {
    std::string path = ::testing::TempDir() + "/client_commands_test_spec_" +
                       std::to_string(::getpid()) + "_" +
                       ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".yaml";
    std::ofstream(path, std::ios::binary) << contents;
    spec_path_ = path;
    return path;
  }

  FakeJobService jobs_;
  FakeWorkerService workers_;
  std::unique_ptr<grpc::Server> server_;
  ConnectOptions connect_;
  std::ostringstream out_;
  std::ostringstream err_;
  Io io_;
  std::string spec_path_;  // WriteSpec's file, removed by TearDown
};

}  // namespace boulder::client

#endif  // BOULDER_CLIENT_FAKE_COORDINATOR_TEST_UTIL_H_
