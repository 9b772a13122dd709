#include "kernels/cpu/residual.h"

#include <cstdint>

#include "kernels/cpu/parallel.h"

namespace boulder::kernels::cpu {

template <typename S>
void ResidualForward(int threads, S* out, const S* a, const S* b, size_t n) {
  const int64_t count = static_cast<int64_t>(n);
  const bool parallel = WorthParallel(threads, n);
#pragma omp parallel for simd num_threads(threads) schedule(static) if (parallel)
  for (int64_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
}

template void ResidualForward<float>(int, float*, const float*, const float*, size_t);
template void ResidualForward<double>(int, double*, const double*, const double*, size_t);

}  // namespace boulder::kernels::cpu
