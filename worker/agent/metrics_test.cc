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
  EXPECT_THAT(text, HasSubstr("boulder_trainer_loss{job_id=\"7\",rank=\"0\"} 2.5"));
  EXPECT_THAT(text, HasSubstr("boulder_trainer_step{job_id=\"7\",rank=\"0\"} 2"));
  EXPECT_THAT(text, HasSubstr("boulder_trainer_learning_rate{job_id=\"7\",rank=\"0\"} 0.0003"));
  EXPECT_THAT(text, HasSubstr("boulder_trainer_grad_norm{job_id=\"7\",rank=\"0\"} 1.5"));
  EXPECT_THAT(text, HasSubstr("boulder_trainer_tokens_total{job_id=\"7\",rank=\"0\"} 1024"));
  EXPECT_THAT(text, HasSubstr("boulder_trainer_tokens_per_second{job_id=\"7\",rank=\"0\"} 2048"));
  EXPECT_THAT(text,
              HasSubstr("boulder_trainer_step_duration_seconds_count{job_id=\"7\",rank=\"0\"} 2"));
  EXPECT_THAT(
      text,
      HasSubstr(
          "boulder_trainer_step_duration_seconds_bucket{job_id=\"7\",rank=\"0\",le=\"0.25\"} 2"));
  EXPECT_THAT(text,
              HasSubstr("boulder_trainer_memory_allocated_bytes{job_id=\"7\",rank=\"0\"} 1000"));
  EXPECT_THAT(text, HasSubstr("boulder_trainer_memory_peak_bytes{job_id=\"7\",rank=\"0\"} 2000"));
  EXPECT_THAT(text,
              HasSubstr("boulder_trainer_memory_reserved_bytes{job_id=\"7\",rank=\"0\"} 3000"));
  EXPECT_THAT(text, HasSubstr("boulder_device_memory_total_bytes{job_id=\"7\",rank=\"0\"} 4000"));
}

TEST(AgentMetricsTest, TokensRestartCountingWhenANewAttemptStartsLower) {
  AgentMetrics metrics;
  metrics.RecordStep(3, 1, Step(1, 1.0, 600));
  metrics.RecordStep(3, 1, Step(1, 1.0, 100));
  EXPECT_THAT(metrics.Render(),
              HasSubstr("boulder_trainer_tokens_total{job_id=\"3\",rank=\"1\"} 700"));
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
  EXPECT_THAT(response, HasSubstr("boulder_trainer_loss{job_id=\"11\",rank=\"0\"} 0.125"));

  EXPECT_EQ(metrics.Serve("127.0.0.1:0").status().code(), absl::StatusCode::kFailedPrecondition);
  AgentMetrics other;
  const absl::Status taken = other.Serve(absl::StrCat("127.0.0.1:", *port)).status();
  EXPECT_EQ(taken.code(), absl::StatusCode::kUnavailable) << taken;
  EXPECT_THAT(taken.message(), HasSubstr(absl::StrCat("--metrics-listen 127.0.0.1:", *port)));
}

v1::JobSpec MiniGptSpec() {
  v1::JobSpec spec;
  spec.mutable_model()->set_vocab_size(96);
  spec.mutable_model()->set_hidden(768);
  spec.mutable_model()->set_heads(12);
  spec.mutable_model()->set_layers(4);
  spec.mutable_model()->set_ffn(3072);
  spec.mutable_model()->set_context(256);
  spec.mutable_training()->set_seq_len(256);
  return spec;
}

TEST(ModelFlopsTest, SixPerMatmulWeightPlusAttention) {
  // 6 * (4 * (4 * 768^2 + 2 * 768 * 3072) + 96 * 768) + 12 * 4 * 256 * 768.
  EXPECT_DOUBLE_EQ(ModelFlopsPerToken(MiniGptSpec()), 170311680.0 + 9437184.0);
  v1::JobSpec missing = MiniGptSpec();
  missing.mutable_training()->clear_seq_len();
  EXPECT_EQ(ModelFlopsPerToken(missing), 0.0);
}

TEST(PeakFlopsTest, CpuEstimateFromClockAndWidestFma) {
  const std::string avx512 =
      "processor\t: 0\ncpu MHz\t\t: 2000.000\nflags\t\t: fpu sse2 avx avx2 fma avx512f\n"
      "processor\t: 1\ncpu MHz\t\t: 3000.000\n";
  EXPECT_DOUBLE_EQ(CpuPeakFlops(avx512, 2), 2 * 2000e6 * 64);
  EXPECT_DOUBLE_EQ(CpuPeakFlops("cpu MHz : 1000\nflags : avx2 fma\n", 1), 1000e6 * 32);
  EXPECT_DOUBLE_EQ(CpuPeakFlops("cpu MHz : 1000\nflags : avx2\n", 1), 1000e6 * 16);
  EXPECT_DOUBLE_EQ(CpuPeakFlops("cpu MHz : 1000\nflags : sse2\n", 3), 3 * 1000e6 * 8);
  EXPECT_EQ(CpuPeakFlops("flags : avx2 fma\n", 4), 0.0);
}

TEST(PeakFlopsTest, GpuPeakFromTheTableByPrecision) {
  v1::WorkerCapabilities h200;
  h200.set_backend("cuda");
  h200.set_gpu_name("NVIDIA H200");
  h200.set_compute_capability_major(9);
  h200.set_compute_capability_minor(0);
  EXPECT_DOUBLE_EQ(PeakFlops(h200, "bf16", 0), 989.4e12);
  EXPECT_DOUBLE_EQ(PeakFlops(h200, "fp8", 0), 2 * 989.4e12);
  EXPECT_DOUBLE_EQ(PeakFlops(h200, "fp32", 0), 989.4e12 / 2);
  v1::WorkerCapabilities a100 = h200;
  a100.set_gpu_name("NVIDIA A100-SXM4-80GB");
  a100.set_compute_capability_major(8);
  EXPECT_DOUBLE_EQ(PeakFlops(a100, "fp8", 0), 312e12);
  v1::WorkerCapabilities pcie = h200;
  pcie.set_gpu_name("NVIDIA H100 PCIe");
  EXPECT_DOUBLE_EQ(PeakFlops(pcie, "bf16", 0), 756.5e12);
  v1::WorkerCapabilities unknown = h200;
  unknown.set_gpu_name("NVIDIA GeForce GTX 1080");
  EXPECT_EQ(PeakFlops(unknown, "bf16", 0), 0.0);
}

TEST(AgentMetricsTest, MfuIsTokensPerSecondTimesFlopsPerTokenOverPeak) {
  AgentMetrics metrics;
  metrics.RecordStep(4, 0, Step(1, 1.0, 2048));
  EXPECT_THAT(metrics.Render(), Not(HasSubstr("boulder_trainer_mfu_ratio{")));
  // 2048 tokens/s x 1e9 FLOPs per token over 8e12 FLOP/s.
  metrics.RecordStep(4, 0, Step(2, 1.0, 4096), MfuInputs{1e9, 8e12});
  EXPECT_THAT(metrics.Render(),
              HasSubstr("boulder_trainer_mfu_ratio{job_id=\"4\",rank=\"0\"} 0.256"));
}

TEST(AgentMetricsTest, Fp8StatisticsPerLayerTensorAndRole) {
  AgentMetrics metrics;
  v1::StepReport step = Step(1, 1.0, 512);
  v1::Fp8TensorStats* t = step.add_fp8();
  t->set_layer(3);
  t->set_tensor("fc1");
  t->set_role("weight");
  t->set_format("e4m3");
  t->set_scale(64);
  t->set_amax(6.5);
  t->set_saturated_ratio(0.125);
  t->set_underflow_ratio(0.25);
  metrics.RecordStep(9, 1, step);
  t->set_scale(32);
  metrics.RecordStep(9, 1, step);
  const std::string text = metrics.Render();
  const std::string labels = "{job_id=\"9\",layer=\"3\",rank=\"1\",role=\"weight\",tensor=\"fc1\"}";
  EXPECT_THAT(text, HasSubstr("boulder_trainer_fp8_scale" + labels + " 32\n"));
  EXPECT_THAT(text, HasSubstr("boulder_trainer_fp8_amax" + labels + " 6.5\n"));
  EXPECT_THAT(text, HasSubstr("boulder_trainer_fp8_saturated_ratio" + labels + " 0.125\n"));
  EXPECT_THAT(text, HasSubstr("boulder_trainer_fp8_underflow_ratio" + labels + " 0.25\n"));
}

// The skipped-step count appears with a job's first FP8 report (at 0, so a dashboard shows FP8
// jobs that never skipped) and follows the reports; a job without FP8 or skips has none.
TEST(AgentMetricsTest, SkippedStepsOfFp8Jobs) {
  AgentMetrics metrics;
  metrics.RecordStep(3, 0, Step(1, 1.0, 512));
  EXPECT_THAT(metrics.Render(), Not(HasSubstr("boulder_trainer_skipped_steps{")));
  v1::StepReport step = Step(1, 1.0, 512);
  step.add_fp8()->set_tensor("qkv");
  metrics.RecordStep(5, 0, step);
  EXPECT_THAT(metrics.Render(),
              HasSubstr("boulder_trainer_skipped_steps{job_id=\"5\",rank=\"0\"} 0\n"));
  step.set_skipped_steps(2);
  step.clear_fp8();  // the count is kept up to date on every report
  metrics.RecordStep(5, 0, step);
  EXPECT_THAT(metrics.Render(),
              HasSubstr("boulder_trainer_skipped_steps{job_id=\"5\",rank=\"0\"} 2\n"));
  EXPECT_THAT(metrics.Render(), Not(HasSubstr("boulder_trainer_skipped_steps{job_id=\"3\"")));
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
