#include "kernels/cpu/encoder.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/parallel.h"

namespace boulder::kernels::cpu {
namespace {

// Channels per backward work item: a few cache lines per row, enough items to share out.
constexpr int kChannelBlock = 64;

}  // namespace

template <typename S>
void EncoderForward(int threads, S* out, const int32_t* tokens, const S* wte, const S* wpe, int B,
                    int T, int C) {
  const int64_t N = static_cast<int64_t>(B) * T;
  const bool parallel = WorthParallel(threads, static_cast<size_t>(N) * C);
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
  for (int64_t n = 0; n < N; ++n) {
    S* __restrict o = out + n * C;
    const S* __restrict e = wte + static_cast<int64_t>(tokens[n]) * C;
    const S* __restrict p = wpe + (n % T) * C;
    for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

template <typename S>
void EncoderBackward(int threads, S* dwte, S* dwpe, const S* dout, const int32_t* tokens, int B,
                     int T, int C) {
  const int blocks = (C + kChannelBlock - 1) / kChannelBlock;
  const size_t work = static_cast<size_t>(B) * T * C * 2;
  const bool parallel = WorthParallel(threads, work);
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kChannelBlock;
    const int c1 = std::min(C, c0 + kChannelBlock);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const int64_t n = static_cast<int64_t>(b) * T + t;
        const S* __restrict d = dout + n * C;
        S* __restrict e = dwte + static_cast<int64_t>(tokens[n]) * C;
        S* __restrict p = dwpe + static_cast<int64_t>(t) * C;
        for (int c = c0; c < c1; ++c) {
          e[c] += d[c];
          p[c] += d[c];
        }
      }
    }
  }
}

template void EncoderForward<float>(int, float*, const int32_t*, const float*, const float*, int,
                                    int, int);
template void EncoderForward<double>(int, double*, const int32_t*, const double*, const double*,
                                     int, int, int);
template void EncoderBackward<float>(int, float*, float*, const float*, const int32_t*, int, int,
                                     int);
template void EncoderBackward<double>(int, double*, double*, const double*, const int32_t*, int,
                                      int, int);

}  // namespace boulder::kernels::cpu
