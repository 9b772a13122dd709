#include "worker/agent/capabilities.h"

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::agent {
namespace {

using ::testing::HasSubstr;

GpuProbeResult OneGpu(int major, int minor) {
  GpuProbeResult probe;
  probe.built_with_cuda = true;
  probe.gpus.push_back({"NVIDIA H200", major, minor, int64_t{150} << 30});
  return probe;
}

GpuProbeResult NoCuda() {
  GpuProbeResult probe;
  probe.note = "built without CUDA";
  return probe;
}

TEST(ChooseBackendTest, AutoExplainsWhyItChoseCpu) {
  auto no_cuda = ChooseBackend("auto", NoCuda(), /*cuda_backend_built=*/false);
  ASSERT_TRUE(no_cuda.ok());
  EXPECT_EQ(no_cuda->backend, "cpu");
  EXPECT_EQ(no_cuda->note, "auto: no GPU found (built without CUDA)");

  auto old_gpu = ChooseBackend("auto", OneGpu(7, 5), /*cuda_backend_built=*/true);
  ASSERT_TRUE(old_gpu.ok());
  EXPECT_EQ(old_gpu->backend, "cpu");
  EXPECT_EQ(old_gpu->note,
            "auto: GPU NVIDIA H200, compute capability 7.5 is below the required 8.0");

  auto no_backend = ChooseBackend("auto", OneGpu(9, 0), /*cuda_backend_built=*/false);
  ASSERT_TRUE(no_backend.ok());
  EXPECT_EQ(no_backend->backend, "cpu");
  EXPECT_EQ(no_backend->note,
            "auto: this build has no CUDA backend yet (found NVIDIA H200, compute capability "
            "9.0)");
}

TEST(ChooseBackendTest, AutoChoosesCudaOnASuitableGpuWhenTheBackendExists) {
  auto choice = ChooseBackend("auto", OneGpu(9, 0), /*cuda_backend_built=*/true);
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->backend, "cuda");
}

TEST(ChooseBackendTest, ExplicitChoices) {
  auto cpu = ChooseBackend("cpu", OneGpu(9, 0), /*cuda_backend_built=*/true);
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->backend, "cpu");

  auto cuda = ChooseBackend("cuda", OneGpu(9, 0), /*cuda_backend_built=*/false);
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda.status().message(), "--backend cuda: this build has no CUDA backend");

  auto no_gpu = ChooseBackend("cuda", NoCuda(), /*cuda_backend_built=*/true);
  EXPECT_EQ(no_gpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_gpu.status().message(), HasSubstr("--backend cuda: no GPU found"));

  auto bad = ChooseBackend("tpu", NoCuda(), /*cuda_backend_built=*/false);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "--backend: expected auto, cpu or cuda, got 'tpu'");
}

TEST(BuildCapabilitiesTest, ReportsCoresHostAndTheFirstGpu) {
  const GpuProbeResult probe = OneGpu(9, 0);
  const v1::WorkerCapabilities caps = BuildCapabilities({"cpu", "why"}, probe);
  EXPECT_EQ(caps.backend(), "cpu");
  EXPECT_EQ(caps.backend_note(), "why");
  EXPECT_EQ(caps.cpu_cores(), static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_FALSE(caps.hostname().empty());
  EXPECT_EQ(caps.gpu_name(), "NVIDIA H200");
  EXPECT_EQ(caps.compute_capability_major(), 9);
  EXPECT_EQ(caps.gpu_memory_bytes(), int64_t{150} << 30);

  const v1::WorkerCapabilities cpu_only = BuildCapabilities({"cpu", ""}, NoCuda());
  EXPECT_EQ(cpu_only.gpu_name(), "");
  EXPECT_EQ(cpu_only.gpu_memory_bytes(), 0);
}

TEST(ProbeGpusTest, SaysWhyItFoundNoGpu) {
  const GpuProbeResult probe = ProbeGpus();
  if (!probe.built_with_cuda) {
    EXPECT_TRUE(probe.gpus.empty());
    EXPECT_EQ(probe.note, "built without CUDA");
    return;
  }
  EXPECT_EQ(probe.gpus.empty(), !probe.note.empty()) << probe.note;
  for (const GpuInfo& gpu : probe.gpus) {
    EXPECT_FALSE(gpu.name.empty());
    EXPECT_GT(gpu.compute_capability_major, 0);
    EXPECT_GT(gpu.memory_bytes, 0);
  }
}

}  // namespace
}  // namespace boulder::agent
