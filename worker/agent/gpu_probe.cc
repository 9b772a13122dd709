#include "worker/agent/gpu_probe.h"

#include <string>
#include <utility>

#ifdef BOULDER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace boulder::agent {

#ifdef BOULDER_HAVE_CUDA

GpuProbeResult ProbeGpus() {
  GpuProbeResult result;
  result.built_with_cuda = true;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    result.note = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
    // A failed runtime call leaves a sticky "last error"; clear it for later CUDA users.
    cudaGetLastError();
    return result;
  }
  if (count == 0) {
    result.note = "no CUDA device found";
    return result;
  }
  for (int device = 0; device < count; ++device) {
    cudaDeviceProp prop;
    err = cudaGetDeviceProperties(&prop, device);
    if (err != cudaSuccess) {
      result.gpus.clear();
      result.note =
          "cudaGetDeviceProperties(" + std::to_string(device) + "): " + cudaGetErrorString(err);
      cudaGetLastError();
      return result;
    }
    GpuInfo info;
    info.name = prop.name;
    info.compute_capability_major = prop.major;
    info.compute_capability_minor = prop.minor;
    info.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    result.gpus.push_back(std::move(info));
  }
  return result;
}

#else  // !BOULDER_HAVE_CUDA

GpuProbeResult ProbeGpus() {
  GpuProbeResult result;
  result.note = "built without CUDA";
  return result;
}

#endif  // BOULDER_HAVE_CUDA

}  // namespace boulder::agent
