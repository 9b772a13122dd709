#include "common/spec_cuda_graph.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::common {
namespace {

using ::testing::HasSubstr;

TEST(SpecCudaGraphTest, DefaultIsAutoAndValuesRoundTrip) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpec("{}", {});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->training().cuda_graph(), "auto");
  for (const char* mode : {"on", "off", "auto"}) {
    absl::StatusOr<v1::JobSpec> set = LoadJobSpec(
        absl::StrCat("training: {cuda_graph: ", mode, "}\nresources: {backend: cuda}\n"), {});
    ASSERT_TRUE(set.ok()) << mode << ": " << set.status();
    EXPECT_EQ(set->training().cuda_graph(), mode);
    absl::StatusOr<v1::JobSpec> back = ParseJobSpecYaml(JobSpecToYaml(*set));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->training().cuda_graph(), mode);
  }
  // The command line's overrides reach it too (bench/gpu_bench.sh times both ways so).
  absl::StatusOr<v1::JobSpec> off = LoadJobSpec("{}", {"training.cuda_graph=off"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->training().cuda_graph(), "off");
}

struct ErrorCase {
  std::string yaml;
  std::vector<std::string> overrides;
  std::string message;
};

class SpecCudaGraphErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(SpecCudaGraphErrorTest, RejectsWithFieldPath) {
  const ErrorCase& c = GetParam();
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpec(c.yaml, c.overrides);
  ASSERT_FALSE(spec.ok()) << c.yaml;
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr(c.message)) << spec.status();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SpecCudaGraphErrorTest,
    ::testing::Values(
        ErrorCase{"training: {cuda_graph: always}",
                  {},
                  "training.cuda_graph: unknown mode 'always' (one of auto, on, off)"},
        ErrorCase{"training: {cuda_graph: ''}", {}, "training.cuda_graph: unknown mode ''"},
        ErrorCase{"training: {cuda_graph: on}\nresources: {backend: cpu}",
                  {},
                  "training.cuda_graph: on needs the cuda backend, but resources.backend is cpu"},
        ErrorCase{"training: {cuda_graph: on}\nprecision: fp32",
                  {},
                  "training.cuda_graph: on needs the cuda backend, but precision fp32"},
        ErrorCase{"training: {cuda_graph: on}\nprecision: fp8\nfp8: {emulate: true}",
                  {},
                  "training.cuda_graph: on needs the cuda backend, but fp8.emulate trains on the "
                  "cpu backend"},
        ErrorCase{"{}", {"training.cuda_graph=yes"}, "training.cuda_graph: unknown mode 'yes'"}));

TEST(SpecCudaGraphTest, OnAcceptsFp8OnTheCudaBackend) {
  // FP8 steps replay from graphs too (worker/engine/step_graph.h).
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpec("training: {cuda_graph: on}\nprecision: fp8", {});
  EXPECT_TRUE(spec.ok()) << spec.status();
}

TEST(SpecCudaGraphTest, OnAcceptsDataParallelism) {
  // The all-reduces are recorded with the step's last micro-batch (worker/engine/step_graph.h).
  for (const char* accum : {"1", "4"}) {
    absl::StatusOr<v1::JobSpec> spec = LoadJobSpec(
        absl::StrCat("training: {cuda_graph: on, grad_accum_steps: ", accum,
                     "}\nresources: {workers: 2}"),
        {});
    EXPECT_TRUE(spec.ok()) << accum << ": " << spec.status();
  }
}

TEST(SpecCudaGraphTest, AutoAndOffAcceptEveryJob) {
  // auto quietly runs eagerly where graphs don't apply; off never needs anything.
  for (const char* mode : {"auto", "off"}) {
    for (const char* extra : {"resources: {backend: cpu}", "precision: fp8",
                              "resources: {workers: 2}", "precision: fp32"}) {
      absl::StatusOr<v1::JobSpec> spec =
          LoadJobSpec(absl::StrCat("training: {cuda_graph: ", mode, "}\n", extra), {});
      EXPECT_TRUE(spec.ok()) << mode << " / " << extra << ": " << spec.status();
    }
  }
}

}  // namespace
}  // namespace boulder::common
