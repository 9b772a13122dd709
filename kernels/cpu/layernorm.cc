#include "kernels/cpu/layernorm.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace boulder::kernels::cpu {
namespace {

// Rows per partial of the weight/bias gradient. Fixed (not per thread) so that the order of
// the sum does not depend on the thread count.
constexpr int kRowChunk = 32;

template <typename S>
struct RowStats {
  S mean;
  S rstd;  // 1/sqrt(var + eps)
};

// Mean, then the variance about it (two passes: no cancellation).
template <typename S>
inline RowStats<S> ComputeRowStats(const S* __restrict x, int C) {
  S sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int c = 0; c < C; ++c) sum += x[c];
  const S m = sum / C;
  S sq = 0;
#pragma omp simd reduction(+ : sq)
  for (int c = 0; c < C; ++c) sq += (x[c] - m) * (x[c] - m);
  return {m, S{1} / std::sqrt(sq / C + static_cast<S>(kLayerNormEps))};
}

// out = (x - mean) * rstd * weight + bias: the one expression both LayerNormForward and
// LayerNormFromStats evaluate, so their outputs agree bit for bit.
template <typename S>
inline void NormalizeRow(S* __restrict o, const S* __restrict x, S m, S s, const S* __restrict w,
                         const S* __restrict bi, int C) {
  for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * w[c] + bi[c];
}

}  // namespace

template <typename S>
void LayerNormForward(int threads, S* out, float* mean, float* rstd, const S* inp, const S* weight,
                      const S* bias, int N, int C) {
  const bool parallel = WorthParallel(threads, static_cast<size_t>(N) * C * 4);
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
  for (int n = 0; n < N; ++n) {
    // Pointers declared in the loop body: shared ones are reloaded through OpenMP's closure
    // on every access, which stops the vectoriser.
    const S* __restrict w = weight;
    const S* __restrict bi = bias;
    const S* __restrict x = inp + static_cast<int64_t>(n) * C;
    S* __restrict o = out + static_cast<int64_t>(n) * C;
    const RowStats<S> st = ComputeRowStats(x, C);
    NormalizeRow(o, x, st.mean, st.rstd, w, bi, C);
    mean[n] = static_cast<float>(st.mean);
    rstd[n] = static_cast<float>(st.rstd);
  }
}

template <typename S>
void LayerNormFromStats(int threads, S* out, const S* inp, const float* mean, const float* rstd,
                        const S* weight, const S* bias, int N, int C) {
  const bool parallel = WorthParallel(threads, static_cast<size_t>(N) * C * 2);
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
  for (int n = 0; n < N; ++n) {
    const S* __restrict x = inp + static_cast<int64_t>(n) * C;
    // FP32: the saved statistics are the forward's exactly (float m, s stored as float).
    const RowStats<S> st = sizeof(S) > sizeof(float)
                               ? ComputeRowStats(x, C)
                               : RowStats<S>{static_cast<S>(mean[n]), static_cast<S>(rstd[n])};
    NormalizeRow(out + static_cast<int64_t>(n) * C, x, st.mean, st.rstd, weight, bias, C);
  }
}

template <typename S>
void LayerNormBackward(int threads, S* dinp, S* dweight, S* dbias, const S* dout, const S* inp,
                       const S* weight, const float* mean, const float* rstd, int N, int C) {
  const int chunks = (N + kRowChunk - 1) / kRowChunk;
  // Per chunk: C weight-grad partials, then C bias-grad partials.
  std::vector<S> partial(static_cast<size_t>(chunks) * 2 * C, S{0});
  const bool parallel = WorthParallel(threads, static_cast<size_t>(N) * C * 6);
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const S* __restrict w = weight;
    S* __restrict pw = partial.data() + static_cast<size_t>(chunk) * 2 * C;
    S* __restrict pb = pw + C;
    const int n1 = std::min(N, (chunk + 1) * kRowChunk);
    for (int n = chunk * kRowChunk; n < n1; ++n) {
      const S* __restrict x = inp + static_cast<int64_t>(n) * C;
      const S* __restrict d = dout + static_cast<int64_t>(n) * C;
      S* __restrict dx = dinp + static_cast<int64_t>(n) * C;
      // FP32 mean/rstd would cap the FP64 backend's gradients at ~1e-7 relative accuracy
      // (it exists for finite-difference checks), so it recomputes them instead.
      const RowStats<S> st = sizeof(S) > sizeof(float)
                                 ? ComputeRowStats(x, C)
                                 : RowStats<S>{static_cast<S>(mean[n]), static_cast<S>(rstd[n])};
      const S m = st.mean;
      const S s = st.rstd;
      S g_sum = 0, gn_sum = 0;
#pragma omp simd reduction(+ : g_sum, gn_sum)
      for (int c = 0; c < C; ++c) {
        const S g = w[c] * d[c];
        g_sum += g;
        gn_sum += g * (x[c] - m) * s;
      }
      const S g_mean = g_sum / C;
      const S gn_mean = gn_sum / C;
      // Six streams are too many for the vectoriser's runtime alias checks; they are distinct.
#pragma omp simd
      for (int c = 0; c < C; ++c) {
        const S norm = (x[c] - m) * s;
        pw[c] += norm * d[c];
        pb[c] += d[c];
        dx[c] += s * (w[c] * d[c] - g_mean - norm * gn_mean);
      }
    }
  }
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
  for (int c = 0; c < C; ++c) {
    S sw = 0, sb = 0;
    for (int chunk = 0; chunk < chunks; ++chunk) {
      sw += partial[static_cast<size_t>(chunk) * 2 * C + c];
      sb += partial[static_cast<size_t>(chunk) * 2 * C + C + c];
    }
    dweight[c] += sw;
    dbias[c] += sb;
  }
}

template void LayerNormForward<float>(int, float*, float*, float*, const float*, const float*,
                                      const float*, int, int);
template void LayerNormForward<double>(int, double*, float*, float*, const double*, const double*,
                                       const double*, int, int);
template void LayerNormFromStats<float>(int, float*, const float*, const float*, const float*,
                                        const float*, const float*, int, int);
template void LayerNormFromStats<double>(int, double*, const double*, const float*, const float*,
                                         const double*, const double*, int, int);
template void LayerNormBackward<float>(int, float*, float*, float*, const float*, const float*,
                                       const float*, const float*, const float*, int, int);
template void LayerNormBackward<double>(int, double*, double*, double*, const double*,
                                        const double*, const double*, const float*, const float*,
                                        int, int);

}  // namespace boulder::kernels::cpu
