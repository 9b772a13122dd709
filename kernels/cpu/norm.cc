#include "kernels/cpu/norm.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace boulder::kernels::cpu {
namespace {

constexpr size_t kChunk = size_t{1} << 16;

}  // namespace

template <typename S>
void NormSquared(int threads, float* out, const S* x, size_t n) {
  const int64_t chunks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
  std::vector<double> partial(chunks, 0.0);
  const bool parallel = WorthParallel(threads, n);
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t begin = static_cast<size_t>(c) * kChunk;
    const size_t end = std::min(n, begin + kChunk);
    const S* __restrict p = x;
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (size_t i = begin; i < end; ++i) sum += static_cast<double>(p[i]) * p[i];
    partial[c] = sum;
  }
  double total = 0;
  for (double s : partial) total += s;
  *out = static_cast<float>(total);
}

template void NormSquared<float>(int, float*, const float*, size_t);
template void NormSquared<double>(int, float*, const double*, size_t);

}  // namespace boulder::kernels::cpu
