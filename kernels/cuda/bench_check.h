// BENCH_CHECK(call) for the GPU micro-benchmarks' main()s (attention_bench, gemm_bench,
// fp8_gemm_bench): a CUDA runtime call that fails prints the call, where and why, and exits 1.
// Library code returns statuses instead (check.h).
#ifndef BOULDER_KERNELS_CUDA_BENCH_CHECK_H_
#define BOULDER_KERNELS_CUDA_BENCH_CHECK_H_

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define BENCH_CHECK(call)                                                                         \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

#endif  // BOULDER_KERNELS_CUDA_BENCH_CHECK_H_
