// The agent against a fake coordinator (a WorkerService on 127.0.0.1) and the fake trainer.
#include "worker/agent/agent.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "worker/agent/capabilities.h"
#include "worker/agent/gpu_probe.h"

namespace boulder::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr absl::Duration kDeadline = absl::Seconds(30);

// What the fake coordinator saw and will answer; `seq` orders every call.
struct State {
  std::vector<v1::RegisterWorkerRequest> registrations;
  std::vector<v1::HeartbeatRequest> heartbeats;
  std::vector<std::pair<int, v1::ReportStepsRequest>> report_steps;  // (seq, request)
  std::vector<std::pair<int, v1::ReportExitRequest>> exits;          // acknowledged ones
  int exit_calls = 0;
  int seq = 0;

  std::vector<v1::Assignment> pending;      // handed out by the next heartbeat
  std::vector<v1::Assignment> every_time;   // handed out by every heartbeat
  std::vector<v1::RunningTrainer> cancels;  // handed out by the next heartbeat
  bool cancel_on_report_steps = false;
  bool forget_worker = false;   // answer the next heartbeat with NOT_FOUND
  int exit_failures_left = 0;   // answer ReportExit with UNAVAILABLE this many times
  int steps_failures_left = 0;  // answer ReportSteps with UNAVAILABLE this many times
  int steps_calls = 0;

  std::vector<v1::StepReport> Steps() const {
    std::vector<v1::StepReport> steps;
    for (const auto& [seq, request] : report_steps) {
      steps.insert(steps.end(), request.steps().begin(), request.steps().end());
    }
    return steps;
  }
  std::vector<std::string> Logs() const {
    std::vector<std::string> logs;
    for (const auto& [seq, request] : report_steps) {
      for (const v1::LogLine& log : request.logs()) logs.push_back(log.text());
    }
    return logs;
  }
};

class FakeCoordinator final : public v1::WorkerService::CallbackService {
 public:
  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override {
    Update([&](State& s) {
      ++s.seq;
      s.registrations.push_back(*request);
      response->set_worker_id(request->requested_id().empty() ? "w-1" : request->requested_id());
      response->set_heartbeat_interval_ms(50);
    });
    return Finish(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override {
    grpc::Status status;
    Update([&](State& s) {
      ++s.seq;
      s.heartbeats.push_back(*request);
      if (s.forget_worker) {
        s.forget_worker = false;
        status = grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown worker");
        return;
      }
      for (auto& a : s.pending) *response->add_assignments() = a;
      for (auto& a : s.every_time) *response->add_assignments() = a;
      for (auto& c : s.cancels) *response->add_cancel() = c;
      s.pending.clear();
      s.cancels.clear();
    });
    return Finish(context, status);
  }

  grpc::ServerUnaryReactor* ReportSteps(grpc::CallbackServerContext* context,
                                        const v1::ReportStepsRequest* request,
                                        v1::ReportStepsResponse* response) override {
    grpc::Status status;
    Update([&](State& s) {
      ++s.steps_calls;
      if (s.steps_failures_left > 0) {
        --s.steps_failures_left;
        status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "restarting");
        return;
      }
      s.report_steps.emplace_back(++s.seq, *request);
      response->set_cancel(s.cancel_on_report_steps);
    });
    return Finish(context, status);
  }

  grpc::ServerUnaryReactor* ReportExit(grpc::CallbackServerContext* context,
                                       const v1::ReportExitRequest* request,
                                       v1::ReportExitResponse*) override {
    grpc::Status status;
    Update([&](State& s) {
      ++s.exit_calls;
      if (s.exit_failures_left > 0) {
        --s.exit_failures_left;
        status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "restarting");
        return;
      }
      s.exits.emplace_back(++s.seq, *request);
    });
    return Finish(context, status);
  }

  void Update(const std::function<void(State&)>& change) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      change(state_);
    }
    cv_.notify_all();
  }
  bool WaitFor(const std::function<bool(const State&)>& done) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, absl::ToChronoTime(absl::Now() + kDeadline),
                          [&] { return done(state_); });
  }
  State Snapshot() {
    std::lock_guard<std::mutex> lock(mu_);
    return state_;
  }

 private:
  static grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                          const grpc::Status& status) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(status);
    return reactor;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  State state_;
};

// Lines the agent printed or logged, for tests to wait on.
class Lines {
 public:
  std::function<void(absl::string_view)> Sink() {
    return [this](absl::string_view line) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        lines_.emplace_back(line);
      }
      cv_.notify_all();
    };
  }
  bool WaitForCount(const std::string& needle, size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, absl::ToChronoTime(absl::Now() + kDeadline), [&] {
      size_t found = 0;
      for (const std::string& line : lines_) found += absl::StrContains(line, needle);
      return found >= n;
    });
  }
  std::vector<std::string> lines() {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> lines_;
};

// A port nothing listens on (free a moment ago); -1 if none could be found.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  if (fd >= 0) close(fd);
  return ok ? ntohs(addr.sin_port) : -1;
}

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_dir_ = absl::StrCat(::testing::TempDir(), "/agent_test_", getpid(), "_",
                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(work_dir_);
  }

  void TearDown() override {
    agent_.reset();
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    std::filesystem::remove_all(work_dir_);
  }

  void StartCoordinator(int port = 0) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&coordinator_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }

  AgentOptions Options() {
    AgentOptions options;
    options.security.insecure = true;
    options.coordinator = absl::StrCat("127.0.0.1:", port_);
    options.trainer_path = BOULDER_FAKE_TRAINER;
    options.work_dir = work_dir_;
    options.threads = 1;
    options.kill_grace = absl::Seconds(5);
    options.flush_interval = absl::Milliseconds(50);
    options.register_backoff_initial = absl::Milliseconds(50);
    options.register_backoff_max = absl::Milliseconds(200);
    options.print = printed_.Sink();
    options.log = logged_.Sink();
    return options;
  }

  void StartAgent(AgentOptions options) {
    absl::StatusOr<std::unique_ptr<Agent>> agent = Agent::Create(std::move(options));
    ASSERT_TRUE(agent.ok()) << agent.status();
    agent_ = *std::move(agent);
    agent_->Start();
  }

  static v1::Assignment Assignment(int64_t job, const std::string& mode, int steps = 3) {
    v1::Assignment assignment;
    assignment.set_job_id(job);
    assignment.set_attempt(1);
    assignment.set_rank(0);
    assignment.set_world_size(1);
    assignment.mutable_spec()->set_name(mode);
    assignment.mutable_spec()->mutable_training()->set_steps(steps);
    assignment.mutable_spec()->mutable_training()->set_batch_size(8);
    assignment.mutable_spec()->mutable_training()->set_grad_clip(0);
    return assignment;
  }

  bool WaitForExits(size_t n) {
    return coordinator_.WaitFor([n](const State& s) { return s.exits.size() >= n; });
  }
  bool WaitForSteps(size_t n) {
    return coordinator_.WaitFor([n](const State& s) { return s.Steps().size() >= n; });
  }

  FakeCoordinator coordinator_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string work_dir_;
  Lines printed_;
  Lines logged_;
  std::unique_ptr<Agent> agent_;
};

TEST_F(AgentTest, RunsAnAssignmentAndReportsItsStepsLogsAndExit) {
  StartCoordinator();
  // A resolved spec, as the coordinator hands out: every field set.
  v1::Assignment assignment = Assignment(7, "exit:3");
  absl::StatusOr<v1::JobSpec> resolved = common::ResolveJobSpec(assignment.spec());
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  *assignment.mutable_spec() = *resolved;
  coordinator_.Update([&](State& s) { s.pending.push_back(assignment); });
  StartAgent(Options());
  ASSERT_TRUE(WaitForExits(1));
  const State state = coordinator_.Snapshot();

  ASSERT_GE(state.registrations.size(), 1u);
  const v1::WorkerCapabilities& caps = state.registrations[0].capabilities();
  EXPECT_EQ(caps.backend(), "cpu");
  EXPECT_THAT(caps.backend_note(), HasSubstr("auto: "));
  EXPECT_EQ(caps.cpu_cores(), static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_FALSE(caps.hostname().empty());
  EXPECT_EQ(state.registrations[0].requested_id(), "");
  EXPECT_THAT(printed_.lines(),
              ElementsAre(absl::StrCat("boulder-worker w-1 registered with 127.0.0.1:", port_,
                                       " (backend cpu, ", caps.cpu_cores(), " cores)")));
  EXPECT_EQ(agent_->worker_id(), "w-1");

  const std::vector<v1::StepReport> steps = state.Steps();
  ASSERT_EQ(steps.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(steps[i].step(), i + 1);
    EXPECT_EQ(steps[i].job_id(), 7);
    EXPECT_EQ(steps[i].attempt(), 1);
    EXPECT_NEAR(steps[i].loss(), 4.0 / (i + 1), 1e-12);
  }
  for (const auto& [seq, request] : state.report_steps) {
    EXPECT_EQ(request.worker_id(), "w-1");
    EXPECT_EQ(request.job_id(), 7);
    EXPECT_EQ(request.attempt(), 1);
    for (const v1::LogLine& log : request.logs()) EXPECT_EQ(log.rank(), 0);
    EXPECT_LT(seq, state.exits[0].first) << "a step report arrived after the exit";
  }
  EXPECT_THAT(state.Logs(), ::testing::Contains("fake trainer: step 2"));
  // The malformed line was skipped and logged, not fatal.
  EXPECT_TRUE(logged_.WaitForCount("skipped a malformed report line", 1));

  const v1::ReportExitRequest& exit = state.exits[0].second;
  EXPECT_EQ(exit.worker_id(), "w-1");
  EXPECT_EQ(exit.job_id(), 7);
  EXPECT_EQ(exit.attempt(), 1);
  EXPECT_EQ(exit.exit_code(), 3);
  EXPECT_EQ(exit.signal(), 0);
  EXPECT_EQ(exit.message(), "fake failure 3");
  EXPECT_FALSE(exit.cancelled());

  // The trainer read the spec the agent wrote, in protobuf JSON with proto field names.
  std::ifstream in(work_dir_ + "/job-7/attempt-1/spec.json");
  std::stringstream json;
  json << in.rdbuf();
  EXPECT_THAT(json.str(), HasSubstr("\"batch_size\""));
  EXPECT_THAT(json.str(), HasSubstr("\"grad_clip\""));
  // boulder-trainer reads it with the common spec parser.
  absl::StatusOr<v1::JobSpec> written = common::ParseJobSpecYaml(json.str());
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*written, assignment.spec()))
      << written->DebugString();

  // Once its exit is acknowledged the trainer no longer counts as running.
  const size_t seen = state.heartbeats.size();
  ASSERT_TRUE(coordinator_.WaitFor([seen](const State& s) {
    return s.heartbeats.size() > seen + 1 && s.heartbeats.back().running_size() == 0;
  }));
  const std::string metrics = agent_->metrics().Render();
  EXPECT_THAT(metrics, HasSubstr("boulder_trainer_loss{job_id=\"7\",rank=\"0\"} 1.33333"));
  EXPECT_THAT(metrics, HasSubstr("boulder_trainer_exits_total{code=\"3\"} 1"));
}

TEST_F(AgentTest, ForwardsTheGenerationAndRunsARepeatedAssignmentOnce) {
  StartCoordinator();
  coordinator_.Update([&](State& s) { s.every_time.push_back(Assignment(8, "exit:0", 2)); });
  StartAgent(Options());
  ASSERT_TRUE(WaitForExits(1));
  // Several more heartbeats hand the same assignment out again.
  const size_t seen = coordinator_.Snapshot().heartbeats.size();
  ASSERT_TRUE(
      coordinator_.WaitFor([seen](const State& s) { return s.heartbeats.size() > seen + 4; }));
  const State state = coordinator_.Snapshot();
  ASSERT_EQ(state.exits.size(), 1u);
  EXPECT_EQ(state.exits[0].second.exit_code(), 0);
  EXPECT_EQ(state.exits[0].second.message(), "fake trainer: exiting with 0");
  EXPECT_EQ(state.Steps().size(), 2u);
  int generations = 0;
  for (const auto& [seq, request] : state.report_steps) {
    if (!request.has_generation()) continue;
    ++generations;
    EXPECT_THAT(request.generation().prompt(), ElementsAre(1, 3, 5));
    EXPECT_THAT(request.generation().tokens(), ElementsAre(7, 9, 11));
  }
  EXPECT_EQ(generations, 1);
}

TEST_F(AgentTest, ACancelInAHeartbeatStopsTheTrainer) {
  StartCoordinator();
  coordinator_.Update([&](State& s) { s.pending.push_back(Assignment(9, "sleep")); });
  StartAgent(Options());
  ASSERT_TRUE(WaitForSteps(3));
  ASSERT_TRUE(coordinator_.WaitFor([](const State& s) {
    return !s.heartbeats.empty() && s.heartbeats.back().running_size() == 1;
  }));
  EXPECT_EQ(coordinator_.Snapshot().heartbeats.back().running(0).job_id(), 9);
  coordinator_.Update([](State& s) {
    v1::RunningTrainer cancel;
    cancel.set_job_id(9);
    cancel.set_attempt(1);
    s.cancels.push_back(cancel);
  });
  ASSERT_TRUE(WaitForExits(1));
  const v1::ReportExitRequest exit = coordinator_.Snapshot().exits[0].second;
  EXPECT_EQ(exit.exit_code(), 143);
  EXPECT_EQ(exit.signal(), 0);
  EXPECT_TRUE(exit.cancelled());
  EXPECT_EQ(exit.message(), "fake trainer: got SIGTERM");
}

TEST_F(AgentTest, ACancelFromReportStepsKillsATrainerThatIgnoresSigterm) {
  StartCoordinator();
  coordinator_.Update([&](State& s) {
    s.pending.push_back(Assignment(10, "ignore-term"));
    s.cancel_on_report_steps = true;
  });
  AgentOptions options = Options();
  options.kill_grace = absl::Milliseconds(300);
  StartAgent(std::move(options));
  ASSERT_TRUE(WaitForExits(1));
  const v1::ReportExitRequest exit = coordinator_.Snapshot().exits[0].second;
  EXPECT_EQ(exit.exit_code(), -1);
  EXPECT_EQ(exit.signal(), SIGKILL);
  EXPECT_TRUE(exit.cancelled());
  EXPECT_EQ(exit.message(), "fake trainer: step 3");
}

TEST_F(AgentTest, RegistersAgainWithItsRunningTrainersWhenTheCoordinatorForgetsIt) {
  StartCoordinator();
  coordinator_.Update([&](State& s) { s.pending.push_back(Assignment(11, "sleep")); });
  AgentOptions options = Options();
  options.id = "node-a";
  StartAgent(std::move(options));
  ASSERT_TRUE(WaitForSteps(3));
  coordinator_.Update([](State& s) { s.forget_worker = true; });
  ASSERT_TRUE(coordinator_.WaitFor([](const State& s) { return s.registrations.size() == 2; }));
  State state = coordinator_.Snapshot();
  EXPECT_EQ(state.registrations[0].requested_id(), "node-a");
  const v1::RegisterWorkerRequest& again = state.registrations[1];
  EXPECT_EQ(again.requested_id(), "node-a");
  ASSERT_EQ(again.running_size(), 1);
  EXPECT_EQ(again.running(0).job_id(), 11);
  EXPECT_EQ(again.running(0).attempt(), 1);
  // The trainer kept running; it ends only when the agent shuts down.
  const size_t seen = state.heartbeats.size();
  ASSERT_TRUE(
      coordinator_.WaitFor([seen](const State& s) { return s.heartbeats.size() > seen + 1; }));
  EXPECT_THAT(coordinator_.Snapshot().exits, IsEmpty());
  agent_->Shutdown();
  state = coordinator_.Snapshot();
  ASSERT_EQ(state.exits.size(), 1u);
  const v1::ReportExitRequest& exit = state.exits[0].second;
  EXPECT_EQ(exit.worker_id(), "node-a");
  EXPECT_EQ(exit.exit_code(), 143);
  EXPECT_FALSE(exit.cancelled());
  EXPECT_EQ(exit.message(), "stopped: the worker agent is shutting down");
}

TEST_F(AgentTest, ShutdownKillsATrainerThatIgnoresSigtermAndHeartbeatsMeanwhile) {
  StartCoordinator();
  coordinator_.Update([&](State& s) { s.pending.push_back(Assignment(14, "ignore-term")); });
  AgentOptions options = Options();
  options.kill_grace = absl::Milliseconds(600);
  StartAgent(std::move(options));
  ASSERT_TRUE(WaitForSteps(3));
  const size_t heartbeats = coordinator_.Snapshot().heartbeats.size();
  agent_->Shutdown();
  const State state = coordinator_.Snapshot();
  ASSERT_EQ(state.exits.size(), 1u);
  const v1::ReportExitRequest& exit = state.exits[0].second;
  EXPECT_EQ(exit.exit_code(), -1);
  EXPECT_EQ(exit.signal(), SIGKILL);
  EXPECT_FALSE(exit.cancelled());
  EXPECT_EQ(exit.message(), "stopped: the worker agent is shutting down");
  // Heartbeats (every 50 ms) went on through the 600 ms grace, listing the trainer.
  ASSERT_GE(state.heartbeats.size(), heartbeats + 3);
  EXPECT_EQ(state.heartbeats[heartbeats + 2].running_size(), 1);
}

TEST_F(AgentTest, ShutdownGivesUpReportingToACoordinatorThatIsGone) {
  StartCoordinator();
  coordinator_.Update([&](State& s) { s.pending.push_back(Assignment(15, "sleep")); });
  AgentOptions options = Options();
  options.shutdown_report_timeout = absl::Milliseconds(300);
  StartAgent(std::move(options));
  ASSERT_TRUE(WaitForSteps(3));
  server_->Shutdown(absl::ToChronoTime(absl::Now()));
  server_.reset();
  agent_->Shutdown();
  EXPECT_THAT(coordinator_.Snapshot().exits, IsEmpty());
  EXPECT_TRUE(logged_.WaitForCount("job 15 attempt 1 rank 0: trainer exited with code 143", 1));
  EXPECT_TRUE(logged_.WaitForCount(
      "could not report 1 trainer exit(s) to the coordinator before shutting down", 1));
}

TEST_F(AgentTest, KeepsStepReportsWhileTheCoordinatorFailsAndSendsThemOnce) {
  StartCoordinator();
  coordinator_.Update([&](State& s) {
    s.pending.push_back(Assignment(16, "exit:0", 5));
    s.steps_failures_left = 3;
  });
  StartAgent(Options());
  ASSERT_TRUE(WaitForExits(1));
  const State state = coordinator_.Snapshot();
  EXPECT_GE(state.steps_calls, 4);
  const std::vector<v1::StepReport> steps = state.Steps();
  ASSERT_EQ(steps.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(steps[i].step(), i + 1);
}

TEST_F(AgentTest, RetriesReportExitUntilAcknowledged) {
  StartCoordinator();
  coordinator_.Update([&](State& s) {
    s.pending.push_back(Assignment(12, "exit:0", 1));
    s.exit_failures_left = 2;
  });
  StartAgent(Options());
  ASSERT_TRUE(WaitForExits(1));
  const State state = coordinator_.Snapshot();
  EXPECT_EQ(state.exit_calls, 3);
  EXPECT_EQ(state.exits[0].second.exit_code(), 0);
}

TEST_F(AgentTest, RetriesRegistrationUntilTheCoordinatorComesUp) {
  port_ = FreePort();
  ASSERT_GT(port_, 0);
  StartAgent(Options());
  const std::string failure = absl::StrCat("cannot register with 127.0.0.1:", port_);
  ASSERT_TRUE(logged_.WaitForCount(failure, 2));
  EXPECT_THAT(printed_.lines(), IsEmpty());
  StartCoordinator(port_);
  ASSERT_TRUE(printed_.WaitForCount("boulder-worker w-1 registered with", 1));
  EXPECT_EQ(agent_->worker_id(), "w-1");
}

TEST_F(AgentTest, ReportsATrainerThatCannotStart) {
  StartCoordinator();
  std::filesystem::create_directories(work_dir_);
  const std::string script = work_dir_ + "/broken-trainer";
  {
    std::ofstream out(script);
    out << "#!/nonexistent/interpreter\n";
  }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  coordinator_.Update([&](State& s) { s.pending.push_back(Assignment(13, "exit:0")); });
  AgentOptions options = Options();
  options.trainer_path = script;
  StartAgent(std::move(options));
  ASSERT_TRUE(WaitForExits(1));
  const v1::ReportExitRequest exit = coordinator_.Snapshot().exits[0].second;
  EXPECT_EQ(exit.exit_code(), 127);
  EXPECT_EQ(exit.message(), absl::StrCat("could not start the trainer: exec ", script,
                                         ": No such file or directory"));
  EXPECT_THAT(agent_->metrics().Render(), HasSubstr("boulder_trainer_exits_total{code=\"127\"} 1"));
}

// The trainer runs in its attempt directory: the agent, started with a relative work
// directory, still hands it paths it can open, the join token in a file of its own that is
// gone once the trainer has exited, and the token itself never reaches the job's log.
TEST_F(AgentTest, TrainerGetsUsablePathsAndTheTokenFileIsRemovedAtTheEnd) {
  StartCoordinator();
  const std::string token = "join-token-0123456789abcdef";
  coordinator_.Update([&](State& s) { s.pending.push_back(Assignment(21, "exit:0")); });
  AgentOptions options = Options();
  options.work_dir = std::filesystem::relative(work_dir_).string();
  ASSERT_FALSE(std::filesystem::path(options.work_dir).is_absolute());
  options.security.token = token;
  StartAgent(std::move(options));
  ASSERT_TRUE(WaitForExits(1));
  const State state = coordinator_.Snapshot();
  EXPECT_EQ(state.exits[0].second.exit_code(), 0) << state.exits[0].second.message();
  const std::string dir =
      std::filesystem::absolute(work_dir_).lexically_normal().string() + "/job-21/attempt-1";
  EXPECT_THAT(state.Logs(), ::testing::Contains(absl::StrCat("fake trainer: cwd ", dir)));
  const std::string token_file = dir + "/" + kJoinTokenFile;
  EXPECT_THAT(state.Logs(), ::testing::Contains(absl::StrCat("fake trainer: --join-token-file ",
                                                             token_file, " readable")));
  EXPECT_FALSE(std::filesystem::exists(token_file));
  EXPECT_TRUE(std::filesystem::exists(dir + "/spec.json"));
  for (const std::string& line : state.Logs()) EXPECT_THAT(line, Not(HasSubstr(token)));
  for (const std::string& line : logged_.lines()) EXPECT_THAT(line, Not(HasSubstr(token)));
}

TEST(ResolveRelativePathsTest, MakesRelativePathsAbsoluteAndKeepsTheOthers) {
  const std::filesystem::path cwd = std::filesystem::current_path();
  AgentOptions options;
  options.work_dir = "work/./w1";
  options.security.ca_file = "pki/../pki/ca.pem";
  options.security.cert_file = "/etc/boulder/client.pem";
  ASSERT_TRUE(ResolveRelativePaths(&options).ok());
  EXPECT_EQ(options.work_dir, (cwd / "work/w1").string());
  EXPECT_EQ(options.security.ca_file, (cwd / "pki/ca.pem").string());
  EXPECT_EQ(options.security.cert_file, "/etc/boulder/client.pem");
  EXPECT_EQ(options.security.key_file, "");  // unset stays unset
  EXPECT_EQ(options.checkpoint_root, "");
}

TEST_F(AgentTest, CreateRejectsBadOptionsByFlag) {
  AgentOptions options = Options();
  options.coordinator = "127.0.0.1:1";
  options.backend = "cuda";
  if (!kCudaBackendBuilt || ProbeGpus().gpus.empty()) {  // no usable GPU here: refused
    auto cuda = Agent::Create(options);
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(cuda.status().message()), HasSubstr("--backend cuda: "));
  }

  options.backend = "auto";
  options.trainer_path = work_dir_ + "/missing-trainer";
  auto trainer = Agent::Create(options);
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(trainer.status().message(),
              HasSubstr(absl::StrCat("--trainer ", work_dir_, "/missing-trainer: not an")));

  options.trainer_path = BOULDER_FAKE_TRAINER;
  options.threads = -1;
  EXPECT_EQ(Agent::Create(options).status().message(),
            "--threads: must be 0 (all cores) or more, got -1");
}

TEST_F(AgentTest, ServesMetricsOnTheRequestedAddress) {
  AgentOptions options = Options();
  options.coordinator = "127.0.0.1:1";
  options.metrics_listen = "127.0.0.1:0";
  auto agent = Agent::Create(options);
  ASSERT_TRUE(agent.ok()) << agent.status();
  ASSERT_GT((*agent)->metrics_port(), 0);
  EXPECT_THAT(printed_.lines(),
              ElementsAre(absl::StrCat("metrics on 127.0.0.1:", (*agent)->metrics_port())));
}

}  // namespace
}  // namespace boulder::agent
