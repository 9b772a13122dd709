// The boulder-coordinator binary as a separate process: the address line, clean shutdown on
// SIGTERM, durability of an acknowledged submit across SIGKILL, and start-up errors.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "boulder/v1/job.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/test_util.h"

namespace boulder::server {
namespace {

using ::testing::HasSubstr;
using testing::SmallSpecYaml;
using testing::TempDir;

constexpr absl::Duration kDeadline = absl::Seconds(20);

// A child process with stdout and stderr on one pipe. Killed (SIGKILL) if still running when
// destroyed.
class Child {
 public:
  explicit Child(std::vector<std::string> args) {
    int fds[2];
    EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 1);
      dup2(fds[1], 2);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    out_ = fds[0];
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(out_);
  }

  // Reads output until a line matches `pattern`; returns the match, or nullopt at EOF or the
  // deadline.
  std::optional<std::smatch> WaitLine(const std::string& pattern) {
    std::regex rx(pattern);
    absl::Time deadline = absl::Now() + kDeadline;
    while (true) {
      size_t nl;
      while ((nl = buffer_.find('\n')) != std::string::npos) {
        line_ = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        output_ += line_ + "\n";
        std::smatch m;
        if (std::regex_search(line_, m, rx)) return m;
      }
      if (!Fill(deadline)) return std::nullopt;
    }
  }

  // Sends `sig` and waits for the exit; returns the wait status, or -1 at the deadline.
  int SignalAndWait(int sig) {
    kill(pid_, sig);
    return Wait();
  }

  // Waits for the process to close its output and exit; the wait status, or -1.
  int Wait() {
    absl::Time deadline = absl::Now() + kDeadline;
    while (Fill(deadline)) {
    }
    if (!eof_) return -1;
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    output_ += buffer_;
    return status;
  }

  const std::string& output() const { return output_; }

 private:
  // Reads what is available; false at EOF or the deadline.
  bool Fill(absl::Time deadline) {
    if (eof_) return false;
    int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return false;
    pollfd p{out_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(ms)) <= 0) return false;
    char buf[4096];
    ssize_t n = read(out_, buf, sizeof(buf));
    if (n <= 0) {
      eof_ = true;
      return false;
    }
    buffer_.append(buf, n);
    return true;
  }

  pid_t pid_ = -1;
  int out_ = -1;
  bool eof_ = false;
  std::string buffer_;
  std::string line_;
  std::string output_;
};

std::vector<std::string> Args(const std::string& listen, const std::string& db,
                              std::vector<std::string> more = {}) {
  std::vector<std::string> args = {
      BOULDER_COORDINATOR_BIN, "--listen", listen, "--db", db, "--insecure"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

std::string WaitAddress(Child& c) {
  auto m = c.WaitLine(R"(^boulder-coordinator listening on (127\.0\.0\.1:\d+)$)");
  EXPECT_TRUE(m.has_value()) << c.output();
  return m.has_value() ? (*m)[1].str() : "";
}

std::unique_ptr<v1::JobService::Stub> Connect(const std::string& address) {
  return v1::JobService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

grpc::Status Submit(v1::JobService::Stub* stub, v1::Job* job) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kDeadline));
  v1::SubmitJobRequest r;
  r.set_spec_yaml(SmallSpecYaml());
  v1::SubmitJobResponse resp;
  grpc::Status s = stub->SubmitJob(&context, r, &resp);
  *job = resp.job();
  return s;
}

grpc::Status GetJob(v1::JobService::Stub* stub, int64_t id, v1::Job* job) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kDeadline));
  v1::GetJobRequest r;
  r.set_job_id(id);
  return stub->GetJob(&context, r, job);
}

TEST(CoordinatorMainTest, ServesOnAFreePortAndExitsCleanlyOnSigterm) {
  TempDir dir;
  Child c(Args("127.0.0.1:0", dir.File("db"), {"--metrics-listen", "127.0.0.1:0"}));
  std::string address = WaitAddress(c);
  ASSERT_FALSE(address.empty());
  auto metrics = c.WaitLine(R"(^metrics on (127\.0\.0\.1:\d+)$)");
  ASSERT_TRUE(metrics.has_value()) << c.output();
  auto stub = Connect(address);
  v1::Job job;
  ASSERT_TRUE(Submit(stub.get(), &job).ok());
  EXPECT_EQ(job.state(), v1::QUEUED);
  auto body = testing::HttpGet((*metrics)[1].str(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("boulder_queue_length 1"));

  // An idle client notices the server's GOAWAY only at its next poll (up to 5 s later), and
  // the server waits for its connections to close: hang up first, as the CLI does on exit.
  stub.reset();
  int status = c.SignalAndWait(SIGTERM);
  ASSERT_TRUE(WIFEXITED(status)) << status << c.output();
  EXPECT_EQ(WEXITSTATUS(status), 0) << c.output();
}

TEST(CoordinatorMainTest, AcknowledgedSubmitSurvivesSigkill) {
  TempDir dir;
  int64_t id = 0;
  {
    Child c(Args("127.0.0.1:0", dir.File("db")));
    std::string address = WaitAddress(c);
    ASSERT_FALSE(address.empty());
    auto stub = Connect(address);
    v1::Job job;
    ASSERT_TRUE(Submit(stub.get(), &job).ok());
    id = job.id();
    int status = c.SignalAndWait(SIGKILL);
    ASSERT_TRUE(WIFSIGNALED(status));
  }
  Child c(Args("127.0.0.1:0", dir.File("db")));
  std::string address = WaitAddress(c);
  ASSERT_FALSE(address.empty());
  auto stub = Connect(address);
  v1::Job job;
  grpc::Status s = GetJob(stub.get(), id, &job);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(job.state(), v1::QUEUED);
  EXPECT_EQ(job.name(), "small");
  stub.reset();
  EXPECT_EQ(c.SignalAndWait(SIGINT), 0) << c.output();
}

TEST(CoordinatorMainTest, StartUpErrorsExitWithTheReason) {
  TempDir dir;
  Child first(Args("127.0.0.1:0", dir.File("db")));
  std::string address = WaitAddress(first);
  ASSERT_FALSE(address.empty());

  // Same database: refused rather than scheduling the same jobs twice.
  Child same_db(Args("127.0.0.1:0", dir.File("db")));
  int status = same_db.Wait();
  ASSERT_TRUE(WIFEXITED(status)) << same_db.output();
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_THAT(same_db.output(), HasSubstr("in use by another process"));

  // Same port.
  Child same_port(Args(address, dir.File("other.db")));
  status = same_port.Wait();
  ASSERT_TRUE(WIFEXITED(status)) << same_port.output();
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_THAT(same_port.output(), HasSubstr("cannot listen on " + address));

  Child slow(Args("127.0.0.1:0", dir.File("slow.db"),
                  {"--heartbeat-interval-ms", "2000", "--heartbeat-timeout-ms", "1000"}));
  status = slow.Wait();
  ASSERT_TRUE(WIFEXITED(status)) << slow.output();
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_THAT(slow.output(), HasSubstr("the interval shorter than the timeout"));

  Child no_db({BOULDER_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--insecure"});
  status = no_db.Wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_THAT(no_db.output(), HasSubstr("--db"));
}

}  // namespace
}  // namespace boulder::server
