#include "kernels/cpu/attention.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace boulder::kernels::cpu {
namespace {

template <typename S>
inline S Dot(const S* __restrict a, const S* __restrict b, int n) {
  S sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// y += alpha * x
template <typename S>
inline void Axpy(S* __restrict y, S alpha, const S* __restrict x, int n) {
  for (int i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// sc[j] = scale q·k_j for j <= t (k_j at k0 + j * stride); returns their max.
template <typename S>
inline S RowScores(S* __restrict sc, const S* q, const S* k0, int64_t stride, int t, int HS,
                   S scale) {
  S m = -INFINITY;
  for (int j = 0; j <= t; ++j) {
    const S s = scale * Dot(q, k0 + j * stride, HS);
    sc[j] = s;
    m = s > m ? s : m;
  }
  return m;
}

// log Σ_j exp(sc[j]) over j <= t, given their max m.
template <typename S>
inline S RowLogSumExp(const S* __restrict sc, int t, S m) {
  S sum = 0;
  for (int j = 0; j <= t; ++j) sum += std::exp(sc[j] - m);
  return m + std::log(sum);
}

// Scalar operations of one (b, h) pair, for the decision to start a team.
size_t PairWork(int T, int HS) { return static_cast<size_t>(T) * (T + 1) / 2 * HS * 3; }

}  // namespace

template <typename S>
void AttentionForward(int threads, S* out, float* stats, const S* qkv, int B, int T, int C,
                      int NH) {
  const int HS = C / NH;
  const int64_t C3 = 3L * C;
  const S scale = S{1} / std::sqrt(static_cast<S>(HS));
  const int pairs = B * NH;
  const bool parallel = WorthParallel(threads, PairWork(T, HS) * pairs);
#pragma omp parallel num_threads(threads) if (parallel)
  {
    std::vector<S> scores(T);
    S* __restrict sc = scores.data();
#pragma omp for schedule(static)
    for (int bh = 0; bh < pairs; ++bh) {
      const int b = bh / NH;
      const int h = bh % NH;
      const S* base = qkv + static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * HS;
      for (int t = 0; t < T; ++t) {
        const S m = RowScores(sc, base + t * C3, base + C, C3, t, HS, scale);
        S sum = 0;
        for (int j = 0; j <= t; ++j) {
          const S p = std::exp(sc[j] - m);
          sc[j] = p;
          sum += p;
        }
        S* __restrict o =
            out + (static_cast<int64_t>(b) * T + t) * C + static_cast<int64_t>(h) * HS;
        for (int i = 0; i < HS; ++i) o[i] = 0;
        for (int j = 0; j <= t; ++j) Axpy(o, sc[j], base + j * C3 + 2 * C, HS);
        const S inv = S{1} / sum;
        for (int i = 0; i < HS; ++i) o[i] *= inv;
        stats[static_cast<int64_t>(bh) * T + t] = static_cast<float>(m + std::log(sum));
      }
    }
  }
}

template <typename S>
void AttentionBackward(int threads, S* dqkv, const S* dout, const S* qkv, const S* out,
                       const float* stats, int B, int T, int C, int NH) {
  const int HS = C / NH;
  const int64_t C3 = 3L * C;
  const S scale = S{1} / std::sqrt(static_cast<S>(HS));
  const int pairs = B * NH;
  const bool parallel = WorthParallel(threads, PairWork(T, HS) * pairs * 2);
#pragma omp parallel num_threads(threads) if (parallel)
  {
    std::vector<S> scores(T);
    S* __restrict sc = scores.data();
#pragma omp for schedule(static)
    for (int bh = 0; bh < pairs; ++bh) {
      const int b = bh / NH;
      const int h = bh % NH;
      const int64_t head = static_cast<int64_t>(h) * HS;
      const S* base = qkv + static_cast<int64_t>(b) * T * C3 + head;
      S* dbase = dqkv + static_cast<int64_t>(b) * T * C3 + head;
      for (int j = 0; j < T; ++j) {
        S* dkv = dbase + j * C3 + C;
        for (int i = 0; i < HS; ++i) dkv[i] = 0;      // dk
        for (int i = 0; i < HS; ++i) dkv[C + i] = 0;  // dv
      }
      for (int t = 0; t < T; ++t) {
        const int64_t row = (static_cast<int64_t>(b) * T + t) * C + head;
        const S* q = base + t * C3;
        const S* dout_t = dout + row;
        S* dq = dbase + t * C3;
        const S D = Dot(dout_t, out + row, HS);
        const S m = RowScores(sc, q, base + C, C3, t, HS, scale);
        // FP32 stats would cap the FP64 backend's gradients at ~1e-7 relative accuracy (it
        // exists for finite-difference checks), so it recomputes the log-sum-exp instead.
        const S lse = sizeof(S) > sizeof(float) ? RowLogSumExp(sc, t, m)
                                                : stats[static_cast<int64_t>(bh) * T + t];
        for (int i = 0; i < HS; ++i) dq[i] = 0;
        for (int j = 0; j <= t; ++j) {
          const S* k = base + j * C3 + C;
          const S* v = k + C;
          const S p = std::exp(sc[j] - lse);
          const S ds = p * (Dot(dout_t, v, HS) - D);
          S* dk = dbase + j * C3 + C;
          Axpy(dq, scale * ds, k, HS);
          Axpy(dk, scale * ds, q, HS);
          Axpy(dk + C, p, dout_t, HS);
        }
      }
    }
  }
}

template void AttentionForward<float>(int, float*, float*, const float*, int, int, int, int);
template void AttentionForward<double>(int, double*, float*, const double*, int, int, int, int);
template void AttentionBackward<float>(int, float*, const float*, const float*, const float*,
                                       const float*, int, int, int, int);
template void AttentionBackward<double>(int, double*, const double*, const double*, const double*,
                                        const float*, int, int, int, int);

}  // namespace boulder::kernels::cpu
