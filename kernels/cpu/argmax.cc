#include "kernels/cpu/argmax.h"

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/parallel.h"

namespace boulder::kernels::cpu {

template <typename S>
void Argmax(int threads, int32_t* out, const S* logits, int N, int V, int Vp) {
  const bool parallel = WorthParallel(threads, static_cast<size_t>(N) * V);
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
  for (int n = 0; n < N; ++n) {
    const S* l = logits + static_cast<int64_t>(n) * Vp;
    int best = 0;
    for (int j = 1; j < V; ++j) {
      // A NaN as the current best (only possible at index 0) gives way to the next number.
      if (l[j] > l[best] || (l[best] != l[best] && l[j] == l[j])) best = j;
    }
    out[n] = best;
  }
}

template void Argmax<float>(int, int32_t*, const float*, int, int, int);
template void Argmax<double>(int, int32_t*, const double*, int, int, int);

}  // namespace boulder::kernels::cpu
