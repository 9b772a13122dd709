// BF16 and FP8 GEMMs through cuBLASLt with fused epilogues (bias, GELU with aux output), FP32
// accumulation. FP8 operands (a_type/b_type E4M3 or E5M2) come with device scale pointers
// (the dequantisation factors) and give BF16 outputs. Matmul descriptors, layouts and the
// heuristic's algorithm are cached per shape; one workspace (32 MiB) serves every call.
//
// Not thread-safe: one LtMatmul per backend, used from its thread, on its stream.
#ifndef BOULDER_KERNELS_CUDA_MATMUL_H_
#define BOULDER_KERNELS_CUDA_MATMUL_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace boulder::kernels::cuda {

// A column-major GEMM: D[m×n] = alpha·op(A)·op(B) + beta·D, then the epilogue.
struct GemmShape {
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0;
  int lda = 0, ldb = 0, ldd = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  bool accumulate = false;  // beta = 1 (else 0)
  cudaDataType_t a_type = CUDA_R_16BF, b_type = CUDA_R_16BF;
  bool fast_accum = false;  // FP8 only: CUBLASLT_MATMUL_DESC_FAST_ACCUM
  auto Tie() const {
    return std::make_tuple(trans_a, trans_b, m, n, k, lda, ldb, ldd, static_cast<int>(epilogue),
                           accumulate, static_cast<int>(a_type), static_cast<int>(b_type),
                           fast_accum);
  }
  bool operator==(const GemmShape& o) const { return Tie() == o.Tie(); }
  template <typename H>
  friend H AbslHashValue(H h, const GemmShape& s) {
    return H::combine(std::move(h), s.Tie());
  }
};

class LtMatmul {
 public:
  static constexpr size_t kWorkspaceBytes = 32 << 20;
  static absl::StatusOr<std::unique_ptr<LtMatmul>> Create();
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // A, B of shape.a_type / b_type, D BF16; bias (length m) and aux (m×n, ld m) BF16, used
  // when the epilogue needs them. a_scale / b_scale: FP32 device scalars multiplying A and B
  // (FP8 operands only; null otherwise). INTERNAL when cuBLASLt has no algorithm.
  absl::Status Run(const GemmShape& shape, const void* A, const void* B, void* D, const void* bias,
                   void* aux, cudaStream_t stream, const float* a_scale = nullptr,
                   const float* b_scale = nullptr);

  size_t cached_plans() const { return plans_.size(); }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo;
  };
  LtMatmul() = default;
  absl::StatusOr<Plan*> GetPlan(const GemmShape& shape);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  absl::flat_hash_map<GemmShape, std::unique_ptr<Plan>> plans_;
};

}  // namespace boulder::kernels::cuda

#endif  // BOULDER_KERNELS_CUDA_MATMUL_H_
