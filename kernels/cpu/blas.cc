#include "kernels/cpu/blas.h"

#include <cblas.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/parallel.h"

namespace boulder::kernels::cpu {
namespace {

// Column/row granularity of the split: 16 floats = one cache line of C, so two threads never
// write the same line.
constexpr int kSplitAlign = 16;

// BLAS rejects K == 0 (lda must be >= 1), but the product is then just beta * C.
template <typename S>
void ScaleOnly(int M, int N, S beta, S* C, int ldc) {
  for (int i = 0; i < M; ++i) {
    S* row = C + static_cast<int64_t>(i) * ldc;
    for (int j = 0; j < N; ++j) row[j] = beta == S{0} ? S{0} : beta * row[j];
  }
}

inline void Call(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}
inline void Call(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda,
                 const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename S>
void GemmImpl(int threads, bool ta, bool tb, int M, int N, int K, S alpha, const S* A, int lda,
              const S* B, int ldb, S beta, S* C, int ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return ScaleOnly(M, N, beta, C, ldc);
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  // A GEMM retires ~16 multiply-adds per cycle where the element-wise loops retire about
  // one scalar operation, hence the scaling before the common threshold.
  const size_t work = static_cast<size_t>(M) * N * K;
  if (!WorthParallel(threads, work / 16)) {
    Call(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  // Each thread packs the whole of the operand it shares, so split the dimension that leaves
  // the smaller one shared: columns of C (sharing op(A), M×K) when M < N, else rows.
  const bool split_cols = M < N;
  const int dim = split_cols ? N : M;
  const int chunk = std::max(
      kSplitAlign, (dim + threads * kSplitAlign - 1) / (threads * kSplitAlign) * kSplitAlign);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; ++t) {
    const int begin = t * chunk;
    const int end = std::min(dim, begin + chunk);
    if (begin >= end) continue;
    if (split_cols) {
      const S* b = tb ? B + static_cast<int64_t>(begin) * ldb : B + begin;
      Call(ta, tb, M, end - begin, K, alpha, A, lda, b, ldb, beta, C + begin, ldc);
    } else {
      const S* a = ta ? A + begin : A + static_cast<int64_t>(begin) * lda;
      Call(ta, tb, end - begin, N, K, alpha, a, lda, B, ldb, beta,
           C + static_cast<int64_t>(begin) * ldc, ldc);
    }
  }
}

}  // namespace

void Gemm(int threads, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
          int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  GemmImpl(threads, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void Gemm(int threads, bool trans_a, bool trans_b, int M, int N, int K, double alpha,
          const double* A, int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  GemmImpl(threads, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace boulder::kernels::cpu
