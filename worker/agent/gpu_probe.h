// What GPUs this machine has, as the CUDA runtime sees them. The agent reports the first one
// in its capabilities and uses the result to choose a backend for --backend auto.
//
// In a build without CUDA (BOULDER_HAVE_CUDA undefined) the probe finds nothing and says so.
// Thread-safe; each call queries the runtime again.
#ifndef BOULDER_WORKER_AGENT_GPU_PROBE_H_
#define BOULDER_WORKER_AGENT_GPU_PROBE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace boulder::agent {

struct GpuInfo {
  std::string name;  // e.g. "NVIDIA H200"
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  int64_t memory_bytes = 0;  // total global memory
};

struct GpuProbeResult {
  bool built_with_cuda = false;
  std::vector<GpuInfo> gpus;  // in CUDA device order
  // Why `gpus` is empty: "built without CUDA", or the CUDA runtime's error, e.g.
  // "cudaGetDeviceCount: no CUDA-capable device is detected". Empty when GPUs were found.
  std::string note;
};

GpuProbeResult ProbeGpus();

}  // namespace boulder::agent

#endif  // BOULDER_WORKER_AGENT_GPU_PROBE_H_
