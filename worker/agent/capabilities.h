// The worker's capabilities as it registers them, and the choice of compute backend.
//
// Thread-safe: plain functions over values.
#ifndef BOULDER_WORKER_AGENT_CAPABILITIES_H_
#define BOULDER_WORKER_AGENT_CAPABILITIES_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "boulder/v1/worker.pb.h"
#include "worker/agent/gpu_probe.h"

namespace boulder::agent {

// Whether this build's trainer has the CUDA backend: CMake defines BOULDER_CUDA_BACKEND_BUILT
// when it found a CUDA toolkit. Without it, "auto" resolves to cpu on every machine, with a
// note saying why.
#ifdef BOULDER_CUDA_BACKEND_BUILT
inline constexpr bool kCudaBackendBuilt = true;
#else
inline constexpr bool kCudaBackendBuilt = false;
#endif

// Oldest GPU architecture the CUDA backend supports (BF16 tensor cores: Ampere, sm_80).
inline constexpr int kMinComputeCapabilityMajor = 8;

struct BackendChoice {
  std::string backend;  // "cpu" | "cuda"
  std::string note;     // why, e.g. "auto: no GPU found (built without CUDA)"
};

// Resolves --backend. `requested` is "auto", "cpu" or "cuda"; `cuda_backend_built` is
// kCudaBackendBuilt outside tests.
// INVALID_ARGUMENT: an unknown name ("--backend: expected auto, cpu or cuda, got 'x'"), or
// "cuda" where it cannot run ("--backend cuda: this build has no CUDA backend", or no
// suitable GPU).
absl::StatusOr<BackendChoice> ChooseBackend(absl::string_view requested,
                                            const GpuProbeResult& probe, bool cuda_backend_built);

// Backend, note, CPU cores, hostname, and the first GPU's facts when there is one.
v1::WorkerCapabilities BuildCapabilities(const BackendChoice& choice, const GpuProbeResult& probe);

}  // namespace boulder::agent

#endif  // BOULDER_WORKER_AGENT_CAPABILITIES_H_
