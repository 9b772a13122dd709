#include "worker/agent/capabilities.h"

#include <unistd.h>

#include <climits>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace boulder::agent {
namespace {

std::string DescribeGpu(const GpuInfo& gpu) {
  return absl::StrCat(gpu.name, ", compute capability ", gpu.compute_capability_major, ".",
                      gpu.compute_capability_minor);
}

// Why the first GPU cannot run the CUDA backend; empty when it can.
std::string CudaUnusableReason(const GpuProbeResult& probe, bool cuda_backend_built) {
  if (probe.gpus.empty()) {
    return absl::StrCat("no GPU found (", probe.note.empty() ? "no CUDA device" : probe.note, ")");
  }
  const GpuInfo& gpu = probe.gpus.front();
  if (gpu.compute_capability_major < kMinComputeCapabilityMajor) {
    return absl::StrCat("GPU ", DescribeGpu(gpu), " is below the required ",
                        kMinComputeCapabilityMajor, ".0");
  }
  if (!cuda_backend_built) {
    return absl::StrCat("this build has no CUDA backend yet (found ", DescribeGpu(gpu), ")");
  }
  return "";
}

}  // namespace

absl::StatusOr<BackendChoice> ChooseBackend(absl::string_view requested,
                                            const GpuProbeResult& probe, bool cuda_backend_built) {
  if (requested == "cpu") return BackendChoice{"cpu", "requested with --backend cpu"};
  if (requested == "cuda") {
    if (!cuda_backend_built) {
      return absl::InvalidArgumentError("--backend cuda: this build has no CUDA backend");
    }
    const std::string reason = CudaUnusableReason(probe, cuda_backend_built);
    if (!reason.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--backend cuda: ", reason));
    }
    return BackendChoice{
        "cuda", absl::StrCat("requested with --backend cuda; ", DescribeGpu(probe.gpus.front()))};
  }
  if (requested == "auto") {
    const std::string reason = CudaUnusableReason(probe, cuda_backend_built);
    if (!reason.empty()) return BackendChoice{"cpu", absl::StrCat("auto: ", reason)};
    return BackendChoice{"cuda", absl::StrCat("auto: ", DescribeGpu(probe.gpus.front()))};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--backend: expected auto, cpu or cuda, got '", requested, "'"));
}

v1::WorkerCapabilities BuildCapabilities(const BackendChoice& choice, const GpuProbeResult& probe) {
  v1::WorkerCapabilities caps;
  caps.set_backend(choice.backend);
  caps.set_backend_note(choice.note);
  caps.set_cpu_cores(static_cast<int32_t>(std::thread::hardware_concurrency()));
  char host[HOST_NAME_MAX + 1] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) caps.set_hostname(host);
  if (!probe.gpus.empty()) {
    const GpuInfo& gpu = probe.gpus.front();
    caps.set_gpu_name(gpu.name);
    caps.set_compute_capability_major(gpu.compute_capability_major);
    caps.set_compute_capability_minor(gpu.compute_capability_minor);
    caps.set_gpu_memory_bytes(gpu.memory_bytes);
  }
  return caps;
}

}  // namespace boulder::agent
