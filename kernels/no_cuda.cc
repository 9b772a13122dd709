// Built instead of kernels/cuda/ when CMake found no CUDA toolkit.
#include "kernels/backend.h"

namespace boulder::kernels {

bool CudaBackendBuilt() { return false; }

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device) {
  return absl::FailedPreconditionError(
      "this build has no CUDA backend (it was built without a CUDA toolkit)");
}

}  // namespace boulder::kernels
