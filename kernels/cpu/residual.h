// Residual connection: out = a + b over n elements, parallel over contiguous ranges.
// out may alias a or b (element-wise, so in-place updates are safe).
#ifndef BOULDER_KERNELS_CPU_RESIDUAL_H_
#define BOULDER_KERNELS_CPU_RESIDUAL_H_

#include <cstddef>

namespace boulder::kernels::cpu {

template <typename S>
void ResidualForward(int threads, S* out, const S* a, const S* b, size_t n);

}  // namespace boulder::kernels::cpu

#endif  // BOULDER_KERNELS_CPU_RESIDUAL_H_
