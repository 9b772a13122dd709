#include "worker/agent/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::agent {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::StepReport Step(int64_t step, double loss, int64_t tokens_processed) {
  v1::StepReport report;
  report.set_step(step);
  report.set_loss(loss);
  report.set_lr(3e-4);
  report.set_grad_norm(1.5);
  report.set_tokens_per_second(2048);
  report.set_step_time_seconds(0.25);
  report.set_tokens_processed(tokens_processed);
  report.mutable_memory()->set_allocated_bytes(1000);
  report.mutable_memory()->set_peak_bytes(2000);
  report.mutable_memory()->set_reserved_bytes(3000);
  report.mutable_memory()->set_device_total_bytes(4000);
  return report;
}

// GET /metrics from 127.0.0.1:port; the whole response, headers included.
std::string HttpGet(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "connect failed";
  }
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "write failed";
  }
  std::string response;
  char buf[4096];
  ssize_t n = 0;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, static_cast<size_t>(n));
  close(fd);
  return response;
}

TEST(AgentMetricsTest, StepReportsSetTheTrainerSeries) {
  AgentMetrics metrics;
  metrics.RecordStep(7, 0, Step(1, 3.5, 512));
  metrics.RecordStep(7, 0, Step(2, 2.5, 1024));
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("boulder_trainer_loss{job=\"7\",rank=\"0\"} 2.5"));
  EXPECT_THAT(text, HasSubstr("boulder_trainer_step{job=\"7\",rank=\"0\"} 2"));
  EXPECT_THAT(text, HasSubstr("boulder_trainer_learning_rate{job=\"7\",rank=\"0\"} 0.0003"));
  EXPECT_THAT(text, HasSubstr("boulder_trainer_grad_norm{job=\"7\",rank=\"0\"} 1.5"));
  EXPECT_THAT(text, HasSubstr("boulder_trainer_tokens_total{job=\"7\",rank=\"0\"} 1024"));
  EXPECT_THAT(text, HasSubstr("boulder_trainer_tokens_per_second{job=\"7\",rank=\"0\"} 2048"));
  EXPECT_THAT(text,
              HasSubstr("boulder_trainer_step_duration_seconds_count{job=\"7\",rank=\"0\"} 2"));
  EXPECT_THAT(
      text,
      HasSubstr(
          "boulder_trainer_step_duration_seconds_bucket{job=\"7\",rank=\"0\",le=\"0.25\"} 2"));
  EXPECT_THAT(text, HasSubstr("boulder_trainer_memory_allocated_bytes{job=\"7\",rank=\"0\"} 1000"));
  EXPECT_THAT(text, HasSubstr("boulder_trainer_memory_peak_bytes{job=\"7\",rank=\"0\"} 2000"));
  EXPECT_THAT(text, HasSubstr("boulder_trainer_memory_reserved_bytes{job=\"7\",rank=\"0\"} 3000"));
  EXPECT_THAT(text, HasSubstr("boulder_device_memory_total_bytes{job=\"7\",rank=\"0\"} 4000"));
}

TEST(AgentMetricsTest, TokensRestartCountingWhenANewAttemptStartsLower) {
  AgentMetrics metrics;
  metrics.RecordStep(3, 1, Step(1, 1.0, 600));
  metrics.RecordStep(3, 1, Step(1, 1.0, 100));
  EXPECT_THAT(metrics.Render(),
              HasSubstr("boulder_trainer_tokens_total{job=\"3\",rank=\"1\"} 700"));
}

TEST(AgentMetricsTest, CountsExitsByCodeOrSignal) {
  AgentMetrics metrics;
  metrics.RecordExit(0, 0);
  metrics.RecordExit(0, 0);
  metrics.RecordExit(-1, 9);
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("boulder_trainer_exits_total{code=\"0\"} 2"));
  EXPECT_THAT(text, HasSubstr("boulder_trainer_exits_total{code=\"signal_9\"} 1"));
}

TEST(AgentMetricsTest, HeartbeatAgeIsMeasuredAtScrapeTime) {
  AgentMetrics metrics;
  metrics.RecordHeartbeat(absl::Now() - absl::Seconds(100));
  const std::string text = metrics.Render();
  const std::string name = "\nboulder_agent_heartbeat_age_seconds ";
  const size_t at = text.find(name);
  ASSERT_NE(at, std::string::npos) << text;
  const double age = std::stod(text.substr(at + name.size()));
  EXPECT_GE(age, 100.0);
  EXPECT_LT(age, 160.0);
}

TEST(AgentMetricsTest, ServesTheExpositionOverHttp) {
  AgentMetrics metrics;
  metrics.RecordStep(11, 0, Step(5, 0.125, 2560));
  absl::StatusOr<int> port = metrics.Serve("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_GT(*port, 0);
  const std::string response = HttpGet(*port);
  EXPECT_THAT(response, HasSubstr("200 OK"));
  EXPECT_THAT(response, HasSubstr("boulder_trainer_loss{job=\"11\",rank=\"0\"} 0.125"));

  EXPECT_EQ(metrics.Serve("127.0.0.1:0").status().code(), absl::StatusCode::kFailedPrecondition);
  AgentMetrics other;
  const absl::Status taken = other.Serve(absl::StrCat("127.0.0.1:", *port)).status();
  EXPECT_EQ(taken.code(), absl::StatusCode::kUnavailable) << taken;
  EXPECT_THAT(taken.message(), HasSubstr(absl::StrCat("--metrics-listen 127.0.0.1:", *port)));
}

TEST(AgentMetricsTest, RejectsAnAddressWithoutPort) {
  AgentMetrics metrics;
  for (const char* listen : {"localhost", "127.0.0.1:http", ":", "127.0.0.1:70000"}) {
    const absl::Status status = metrics.Serve(listen).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << listen;
    EXPECT_THAT(status.message(), HasSubstr("expected HOST:PORT")) << listen;
  }
  EXPECT_THAT(metrics.Render(), Not(HasSubstr("boulder_trainer_loss{")));
}

}  // namespace
}  // namespace boulder::agent
