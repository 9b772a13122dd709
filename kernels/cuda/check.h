// Error checking for CUDA, cuBLAS(Lt) and NCCL calls in library code: each macro turns a
// failed call into an absl::Status that carries the call, file and line, and returns it from
// the enclosing function (which must return absl::Status or absl::StatusOr<T>).
//
// Kernel launches inside the Backend's void ops can't return: they record the first error in
// the backend's sticky status (see CudaBackend::Check), reported by Synchronize().
#ifndef BOULDER_KERNELS_CUDA_CHECK_H_
#define BOULDER_KERNELS_CUDA_CHECK_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace boulder::kernels::cuda {

inline absl::Status CudaStatus(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string msg = absl::StrCat(what, " failed at ", file, ":", line, ": ",
                                 cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

inline absl::Status CublasStatus(cublasStatus_t err, const char* what, const char* file,
                                 int line) {
  if (err == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  std::string msg = absl::StrCat(what, " failed at ", file, ":", line, ": cuBLAS status ",
                                 static_cast<int>(err), " (", cublasLtGetStatusName(err), ")");
  if (err == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

}  // namespace boulder::kernels::cuda

#define CUDA_CHECK(call)                                                                  \
  do {                                                                                    \
    absl::Status _s = ::boulder::kernels::cuda::CudaStatus((call), #call, __FILE__, __LINE__); \
    if (!_s.ok()) return _s;                                                              \
  } while (0)

#define CUBLAS_CHECK(call)                                                                  \
  do {                                                                                      \
    absl::Status _s = ::boulder::kernels::cuda::CublasStatus((call), #call, __FILE__, __LINE__); \
    if (!_s.ok()) return _s;                                                                \
  } while (0)

#endif  // BOULDER_KERNELS_CUDA_CHECK_H_
