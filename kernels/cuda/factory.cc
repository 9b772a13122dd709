// The CUDA backend's entry points declared in kernels/backend.h.
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace boulder::kernels {

bool CudaBackendBuilt() { return true; }

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device) {
  absl::StatusOr<std::unique_ptr<cuda::CudaBackend>> b = cuda::CudaBackend::Create(device);
  if (!b.ok()) return b.status();
  return std::unique_ptr<Backend>(std::move(*b));
}

}  // namespace boulder::kernels
