#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/parallel.h"

namespace boulder::kernels::cpu {
namespace {

// Columns per work item of the fused dGELU/dbias pass: 512 bytes of each row in float.
constexpr int kColumnBlock = 128;

// out[N,OC] += bias, per row.
template <typename S>
void AddBias(int threads, S* out, const S* bias, int N, int OC) {
  const bool parallel = WorthParallel(threads, static_cast<size_t>(N) * OC);
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
  for (int n = 0; n < N; ++n) {
    S* __restrict o = out + static_cast<int64_t>(n) * OC;
    const S* __restrict b = bias;
    for (int c = 0; c < OC; ++c) o[c] += b[c];
  }
}

// pre[N,OC] += bias (when non-null), then out = gelu(pre).
template <typename S>
void BiasGelu(int threads, S* out, S* pre, const S* bias, int N, int OC) {
  const bool parallel = WorthParallel(threads, static_cast<size_t>(N) * OC * kGeluOps);
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
  for (int n = 0; n < N; ++n) {
    S* __restrict p = pre + static_cast<int64_t>(n) * OC;
    S* __restrict o = out + static_cast<int64_t>(n) * OC;
    const S* __restrict b = bias;
    if (b != nullptr) {
      for (int c = 0; c < OC; ++c) {
        const S x = p[c] + b[c];
        p[c] = x;
        o[c] = Gelu(x);
      }
    } else {
      for (int c = 0; c < OC; ++c) o[c] = Gelu(p[c]);
    }
  }
}

// dout *= gelu'(pre) (when pre is non-null) and dbias += Σ_rows dout (when dbias is non-null).
template <typename S>
void BackwardEpilogue(int threads, S* dout, S* dbias, const S* pre, int N, int OC) {
  const int blocks = (OC + kColumnBlock - 1) / kColumnBlock;
  const size_t work = static_cast<size_t>(N) * OC * (pre != nullptr ? kGeluOps : 1);
  const bool parallel = WorthParallel(threads, work);
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kColumnBlock;
    const int width = std::min(OC, c0 + kColumnBlock) - c0;
    S acc[kColumnBlock] = {};
    for (int n = 0; n < N; ++n) {
      S* __restrict d = dout + static_cast<int64_t>(n) * OC + c0;
      if (pre != nullptr) {
        const S* __restrict p = pre + static_cast<int64_t>(n) * OC + c0;
        for (int c = 0; c < width; ++c) {
          const S g = d[c] * GeluGrad(p[c]);
          d[c] = g;
          acc[c] += g;
        }
      } else {
        for (int c = 0; c < width; ++c) acc[c] += d[c];
      }
    }
    if (dbias != nullptr) {
      for (int c = 0; c < width; ++c) dbias[c0 + c] += acc[c];
    }
  }
}

}  // namespace

template <typename S>
void MatmulForward(int threads, S* out, S* pre_gelu, const S* inp, const S* weight, const S* bias,
                   int N, int C, int OC, Epilogue epilogue) {
  if (epilogue == Epilogue::kGelu) {
    Gemm(threads, false, true, N, OC, C, S{1}, inp, C, weight, C, S{0}, pre_gelu, OC);
    BiasGelu(threads, out, pre_gelu, bias, N, OC);
  } else {
    Gemm(threads, false, true, N, OC, C, S{1}, inp, C, weight, C, S{0}, out, OC);
    if (bias != nullptr) AddBias(threads, out, bias, N, OC);
  }
}

template <typename S>
void MatmulBackward(int threads, S* dinp, S* dweight, S* dbias, S* dout, const S* pre_gelu,
                    const S* inp, const S* weight, int N, int C, int OC, bool overwrite_dweight) {
  if (pre_gelu != nullptr || dbias != nullptr) {
    BackwardEpilogue(threads, dout, dbias, pre_gelu, N, OC);
  }
  if (dinp != nullptr) {
    Gemm(threads, false, false, N, C, OC, S{1}, dout, OC, weight, C, S{0}, dinp, C);
  }
  if (dweight != nullptr) {
    Gemm(threads, true, false, OC, C, N, S{1}, dout, OC, inp, C, overwrite_dweight ? S{0} : S{1},
         dweight, C);
  }
}

template void MatmulForward<float>(int, float*, float*, const float*, const float*, const float*,
                                   int, int, int, Epilogue);
template void MatmulForward<double>(int, double*, double*, const double*, const double*,
                                    const double*, int, int, int, Epilogue);
template void MatmulBackward<float>(int, float*, float*, float*, float*, const float*, const float*,
                                    const float*, int, int, int, bool);
template void MatmulBackward<double>(int, double*, double*, double*, double*, const double*,
                                     const double*, const double*, int, int, int, bool);

}  // namespace boulder::kernels::cpu
