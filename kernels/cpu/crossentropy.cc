#include "kernels/cpu/crossentropy.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kernels/cpu/parallel.h"

namespace boulder::kernels::cpu {

template <typename S>
void SoftmaxCrossEntropy(int threads, float* losses, S* logits, const int32_t* targets, int N,
                         int V, int Vp, float dloss) {
  const bool parallel = WorthParallel(threads, static_cast<size_t>(N) * Vp * 8);
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
  for (int n = 0; n < N; ++n) {
    S* __restrict l = logits + static_cast<int64_t>(n) * Vp;
    const int32_t target = targets[n];
    for (int j = V; j < Vp; ++j) l[j] = 0;
    if (target < 0 || target >= V) {
      losses[n] = std::numeric_limits<float>::quiet_NaN();
      for (int j = 0; j < V; ++j) l[j] = 0;
      continue;
    }
    S m = l[0];
    for (int j = 1; j < V; ++j) m = l[j] > m ? l[j] : m;
    const S target_logit = l[target];
    S sum = 0;
    for (int j = 0; j < V; ++j) {
      const S e = std::exp(l[j] - m);
      l[j] = e;
      sum += e;
    }
    // (m - target) first: with large logits, m + log(sum) would round away log(sum)'s digits.
    losses[n] = static_cast<float>((m - target_logit) + std::log(sum));
    const S k = static_cast<S>(dloss) / sum;
    for (int j = 0; j < V; ++j) l[j] *= k;
    l[target] -= static_cast<S>(dloss);
  }
}

template void SoftmaxCrossEntropy<float>(int, float*, float*, const int32_t*, int, int, int, float);
template void SoftmaxCrossEntropy<double>(int, float*, double*, const int32_t*, int, int, int,
                                          float);

}  // namespace boulder::kernels::cpu
