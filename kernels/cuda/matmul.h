// BF16 and FP8 GEMMs through cuBLASLt with fused epilogues (bias, GELU with aux output), FP32
// accumulation. FP8 operands (a_type/b_type E4M3 or E5M2) come with device scale pointers
// (the dequantisation factors) and give BF16 outputs. Matmul descriptors, layouts and the
// chosen algorithm are cached per shape; one workspace (32 MiB) serves every call of a stream
// (two: the main stream's and CudaBackend's side stream's).
//
// Algorithm choice: the heuristic's first candidate, or — with autotuning on (the default) —
// the fastest of its first kCandidates, timed on the first call of each shape with the call's
// own operands. Autotuning depends on timings, so two runs may pick different algorithms and
// round differently: turn it off where results must be bit-identical from run to run.
//
// Not thread-safe: one LtMatmul per backend, used from its thread, on its stream.
#ifndef BOULDER_KERNELS_CUDA_MATMUL_H_
#define BOULDER_KERNELS_CUDA_MATMUL_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

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
  // Byte alignment of the A, B, D (= C) and bias pointers (largest power of two ≤ 256 dividing
  // the address), filled in by Run(): the heuristic only offers algorithms that accept it
  // (its default assumes 256, and an algorithm that needs more than the pointers have
  // rejects the call with CUBLAS_STATUS_NOT_SUPPORTED).
  int align_a = 256, align_b = 256, align_d = 256, align_bias = 256;
  auto Tie() const {
    return std::make_tuple(trans_a, trans_b, m, n, k, lda, ldb, ldd, static_cast<int>(epilogue),
                           accumulate, static_cast<int>(a_type), static_cast<int>(b_type),
                           fast_accum, align_a, align_b, align_d, align_bias);
  }
  bool operator==(const GemmShape& o) const { return Tie() == o.Tie(); }
  template <typename H>
  friend H AbslHashValue(H h, const GemmShape& s) {
    return H::combine(std::move(h), s.Tie());
  }
};

// The FP8 GEMM CudaBackend::MatmulFp8 runs: row-major out[M,N] = a[M,K]·b[N,K]ᵀ (both
// K-contiguous) is column-major outᵀ[N,M] = bᵀ(T)·a(N), so cuBLASLt's A is b and its B is a
// (Run(shape, b, a, out, ...)). E4M3 where *_e4m3, else E5M2; no epilogue, beta 0, no fast
// accumulation (the caller sets those).
GemmShape Fp8TnShape(int M, int N, int K, bool a_e4m3, bool b_e4m3);

class LtMatmul {
 public:
  static constexpr size_t kWorkspaceBytes = 32 << 20;
  static constexpr int kMainWorkspace = 0, kSideWorkspace = 1, kWorkspaces = 2;
  static absl::StatusOr<std::unique_ptr<LtMatmul>> Create();
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // A, B of shape.a_type / b_type, D BF16; bias (length m) and aux (m×n, ld m) BF16, used
  // when the epilogue needs them. a_scale / b_scale: FP32 device scalars multiplying A and B
  // (FP8 operands only; null otherwise). INTERNAL when cuBLASLt has no algorithm, or when
  // every candidate algorithm rejects the call; the message names the shape, types,
  // transposes, epilogue and pointer alignments.
  // workspace: which of the two cuBLASLt workspaces the call uses; calls that may run at the
  // same time on different streams must use different ones (kSideWorkspace: CudaBackend's
  // weight-gradient GEMM on its side stream).
  absl::Status Run(const GemmShape& shape, const void* A, const void* B, void* D, const void* bias,
                   void* aux, cudaStream_t stream, const float* a_scale = nullptr,
                   const float* b_scale = nullptr, int workspace = kMainWorkspace);
  // Run for callers that have an unfused fallback (an optional epilogue): false, with nothing
  // launched, when cuBLASLt has no algorithm for the shape (remembered per shape: the
  // heuristic is asked once) or every candidate rejects the call; an error only for other
  // failures. Bias-gradient epilogues (DGELU_BGRAD, BGRADA, BGRADB) write `bias` (length m for
  // DGELU_BGRAD and BGRADA, n for BGRADB; BF16), overwriting it. DGELU and DGELU_BGRAD read
  // `aux` (the GELU input, m×n, ld m).
  absl::StatusOr<bool> TryRun(const GemmShape& shape, const void* A, const void* B, void* D,
                              const void* bias, void* aux, cudaStream_t stream,
                              const float* a_scale = nullptr, const float* b_scale = nullptr,
                              int workspace = kMainWorkspace);

  size_t cached_plans() const { return plans_.size(); }
  // Applies to shapes not yet seen; call before the first Run().
  void set_autotune(bool on) { autotune_ = on; }
  // Shapes whose algorithm autotuning changed from the heuristic's first pick.
  int retuned_plans() const { return retuned_; }
  // One line per autotuned shape that moved off the heuristic's pick: the shape, how many
  // candidates the heuristic gave, which one won, and the top pick's and the winner's time
  // (ms per call: the mean of the trial's runs on the call's operands). For the profile.
  std::string TuningReport() const;
  // TryRun calls that found no algorithm (the caller ran its unfused path instead).
  int unsupported() const { return unsupported_; }
  // Calls whose algorithm rejected them (CUBLAS_STATUS_NOT_SUPPORTED) and that ran on a later
  // candidate instead.
  int fallbacks() const { return fallbacks_; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo;
    std::vector<cublasLtMatmulAlgo_t> candidates;  // heuristic order; [0] == algo until tuned;
                                                   // empty: cuBLASLt has no algorithm
    bool tuned = false;
    int chosen = 0;                    // index in candidates of algo, once tuned
    float top_ms = 0.f, best_ms = 0.f;  // the trial's times of candidates[0] and of algo
  };
  // How many of the heuristic's algorithms autotuning times. Asked for 32 (session 10, H200,
  // cuBLASLt of CUDA 13.0), the heuristic gave at most 8 on every shape of the benchmark
  // models, so 8. Asking it per algorithm id as well (CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID) added
  // a few candidates, none of which won on a large shape (bench/gpu-2026-12-04.md, runs 13-14);
  // untried: configuring each id's tiles, stages and cluster shapes by hand
  // (cublasLtMatmulAlgoCapGetAttribute, AlgoConfigSetAttribute, AlgoCheck).
  static constexpr int kCandidates = 8;
  LtMatmul() = default;
  absl::StatusOr<Plan*> GetPlan(const GemmShape& shape);
  // Times plan's candidates on these operands and keeps the fastest in plan->algo.
  absl::Status Tune(const GemmShape& s, Plan* plan, const void* A, const void* B, void* D,
                    cudaStream_t stream, void* workspace);
  static std::string Describe(const GemmShape& s);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_[kWorkspaces] = {nullptr, nullptr};  // kMainWorkspace, kSideWorkspace
  absl::flat_hash_map<GemmShape, std::unique_ptr<Plan>> plans_;
  bool autotune_ = true;
  int retuned_ = 0;
  int fallbacks_ = 0;
  int unsupported_ = 0;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace boulder::kernels::cuda

#endif  // BOULDER_KERNELS_CUDA_MATMUL_H_
