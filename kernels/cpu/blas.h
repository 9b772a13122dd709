// A tiny overloaded wrapper over OpenBLAS's row-major GEMM, so the ops are written once for
// float and double.
//
// Threading: OpenBLAS runs single-threaded and the product is split across the backend's
// OpenMP team instead (each thread one slice of C's columns or rows, rounded to cache
// lines). With OpenBLAS's own pthreads next to the OpenMP team, a GEMM that follows an
// OpenMP loop shares its cores with that team's still-spinning threads (measured: ~14%
// slower on 2 cores); one pool of exactly `threads` threads avoids that. The split depends
// only on the shape and `threads`, so results are bit-identical run to run for a fixed
// thread count (not across counts: OpenBLAS's edge kernels sum in another order).
#ifndef BOULDER_KERNELS_CPU_BLAS_H_
#define BOULDER_KERNELS_CPU_BLAS_H_

namespace boulder::kernels::cpu {

// Row-major C[M,N] = alpha * op(A)[M,K] · op(B)[K,N] + beta * C, op(X) = Xᵀ when trans_x,
// on `threads` threads. Sets OpenBLAS's (process-wide) thread count to 1.
// Handles empty shapes (M, N or K zero) without calling OpenBLAS.
void Gemm(int threads, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
          int lda, const float* B, int ldb, float beta, float* C, int ldc);
void Gemm(int threads, bool trans_a, bool trans_b, int M, int N, int K, double alpha,
          const double* A, int lda, const double* B, int ldb, double beta, double* C, int ldc);

}  // namespace boulder::kernels::cpu

#endif  // BOULDER_KERNELS_CPU_BLAS_H_
