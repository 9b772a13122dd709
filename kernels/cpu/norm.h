// Sum of squares of n elements (the global gradient norm², for clipping and reporting).
//
// Accumulated in double over fixed chunks that run in parallel; the chunk sums are added in
// chunk order, so the result does not depend on the thread count. Written to *out as FP32.
#ifndef BOULDER_KERNELS_CPU_NORM_H_
#define BOULDER_KERNELS_CPU_NORM_H_

#include <cstddef>

namespace boulder::kernels::cpu {

template <typename S>
void NormSquared(int threads, float* out, const S* x, size_t n);

}  // namespace boulder::kernels::cpu

#endif  // BOULDER_KERNELS_CPU_NORM_H_
