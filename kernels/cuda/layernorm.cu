// LayerNorm forward and backward over rows of C channels (eps 1e-5, as GPT-2 and PyTorch).
// The forward optionally forms its input as the residual add a + b first (one kernel).
//
// Forward: one warp per row; mean and variance in FP32 from two passes over the row (the
// second and third reads hit L1/L2), out = (x - mean) * rstd * w + b in BF16; mean and rstd
// saved in FP32. The FP8 forward (LayerNormFp8Kernel) runs the same per-row code and casts
// the BF16 output to FP8 (row-major and transposed) in the same pass instead of writing it.
// FP8 training's backward recomputes that FP8 output from the kept input and statistics
// (LayerNormFp8FromStats: the same kernel reading mean and rstd instead of computing them, or
// LayerNormFromStatsKernel then CastFp8): the same floats through the same LayerNormChunk give
// the same BF16 y, so the same FP8 bytes.
// Backward: one warp per row computes the input gradient and ADDS it to dinp (the residual
// stream's gradient: +=); the weight and bias gradients (+=) are deterministic column sums of
// dout * xhat and dout over the rows (see reduce.cu). For C = 256, 512, 768 one kernel does
// both in a single pass over the rows (LayerNormBackwardFusedKernel); otherwise a column-sum
// kernel (16-byte loads where aligned) and a row kernel. (A row kernel holding C = 2048 in
// registers between its two passes, 158 registers, measured no faster on the H200.)
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_cast.cuh"
#include "kernels/cuda/fp8_cast_tiles.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/fp8_recipe.h"

namespace boulder::kernels::cuda {
namespace {

constexpr float kEps = 1e-5f;

// Off (SetLayerNormReferenceKernels(true)): the kernels before rows were held in registers
// and the FP8 forward without a transpose and the recomputation had their own kernels.
bool g_ln_new_kernels = true;

// The register-held row instance for C (kCols: C = 256 * kCols): the benchmark models' widths,
// 768 and 2048; 0 (the chunk loop) for any other C.
int HeldCols(int C) { return !g_ln_new_kernels ? 0 : C == 768 ? 3 : C == 2048 ? 8 : 0; }

// One warp's row statistics. kResidual: the row is first formed as residual = bf16(a + b)
// (ResidualForward's rounding) and written out; the later passes read it back (each lane reads
// only what it wrote). The statistics see the same BF16 values in the same order as the
// unfused pair of kernels, so the results are bit-identical to ResidualForward followed by
// LayerNormForward. Returns the row to normalise (inp's or residual's).
template <bool kResidual>
__device__ __forceinline__ const bf16* LayerNormRowStats(int row, int lane, int C, const bf16* inp,
                                                         bf16* residual, const bf16* ra,
                                                         const bf16* rb, float& mean, float& rstd) {
  const bf16* x = (kResidual ? residual : inp) + size_t(row) * C;
  float sum = 0.f;
  for (int c = lane * 8; c < C; c += 256) {
    Bf16x8 v;
    if constexpr (kResidual) {
      const size_t i = size_t(row) * C + c;
      Bf16x8 av = Load8(ra + i), bv = Load8(rb + i);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        v.v[k] = __float2bfloat16(__bfloat162float(av.v[k]) + __bfloat162float(bv.v[k]));
      }
      Store8(residual + i, v);
    } else {
      v = Load8(x + c);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) sum += __bfloat162float(v.v[k]);
  }
  mean = WarpSum(sum) / C;
  float var = 0.f;
  for (int c = lane * 8; c < C; c += 256) {
    Bf16x8 v = Load8(x + c);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float d = __bfloat162float(v.v[k]) - mean;
      var += d * d;
    }
  }
  rstd = rsqrtf(WarpSum(var) / C + kEps);
  return x;
}

// LayerNormRowStats for a row of C = 256 * kCols held in registers: lane l's chunk i is
// columns 8l + 256i, and every load of the row is issued before the sums (read once, not once
// per pass). The same sums in the same order as LayerNormRowStats (per lane chunk by chunk,
// then WarpSum, divided by the runtime C as there), so the same residual, mean and rstd.
template <bool kResidual, int kCols>
__device__ __forceinline__ void LayerNormRowHeld(int row, int lane, int C, const bf16* inp,
                                                 bf16* residual, const bf16* ra, const bf16* rb,
                                                 Bf16x8 (&v)[kCols], float& mean, float& rstd) {
  const size_t base = size_t(row) * (256 * kCols) + lane * 8;
  float sum = 0.f;
  if constexpr (kResidual) {
    Bf16x8 av[kCols], bv[kCols];
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      av[i] = Load8(ra + base + 256 * i);
      bv[i] = Load8(rb + base + 256 * i);
    }
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        v[i].v[k] = __float2bfloat16(__bfloat162float(av[i].v[k]) + __bfloat162float(bv[i].v[k]));
      }
      Store8(residual + base + 256 * i, v[i]);
#pragma unroll
      for (int k = 0; k < 8; ++k) sum += __bfloat162float(v[i].v[k]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kCols; ++i) v[i] = Load8(inp + base + 256 * i);
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
#pragma unroll
      for (int k = 0; k < 8; ++k) sum += __bfloat162float(v[i].v[k]);
    }
  }
  mean = WarpSum(sum) / C;
  float var = 0.f;
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float d = __bfloat162float(v[i].v[k]) - mean;
      var += d * d;
    }
  }
  rstd = rsqrtf(WarpSum(var) / C + kEps);
}

// Columns c..c+7 of a normalised row whose values there are v: bf16((v - mean) * rstd * w + b).
// (LayerNormFromStatsOp computes the same through this function: the same bits.)
__device__ __forceinline__ Bf16x8 LayerNormChunkOf(const Bf16x8& v, const Bf16x8& wv,
                                                   const Bf16x8& bv, float mean, float rstd) {
  Bf16x8 r;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    float n = (__bfloat162float(v.v[k]) - mean) * rstd;
    r.v[k] = __float2bfloat16(n * __bfloat162float(wv.v[k]) + __bfloat162float(bv.v[k]));
  }
  return r;
}
__device__ __forceinline__ Bf16x8 LayerNormChunkOf(const Bf16x8& v, const bf16* w, const bf16* b,
                                                   int c, float mean, float rstd) {
  return LayerNormChunkOf(v, Load8(w + c), Load8(b + c), mean, rstd);
}

// Columns c..c+7 of a normalised row x.
__device__ __forceinline__ Bf16x8 LayerNormChunk(const bf16* x, const bf16* w, const bf16* b, int c,
                                                 float mean, float rstd) {
  return LayerNormChunkOf(Load8(x + c), w, b, c, mean, rstd);
}

// LayerNormForwardKernel's out from the mean and rstd it saved (the FP8 backward's unfused
// recomputation): LayerNormChunk on the same floats, bit-identical.
__global__ void LayerNormFromStatsKernel(bf16* out, const bf16* inp, const float* mean_in,
                                         const float* rstd_in, const bf16* w, const bf16* b, int N,
                                         int C) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float mean = mean_in[row], rstd = rstd_in[row];
  const bf16* x = inp + size_t(row) * C;
  bf16* o = out + size_t(row) * C;
  for (int c = lane * 8; c < C; c += 256) Store8(o + c, LayerNormChunk(x, w, b, c, mean, rstd));
}

// kCols > 0: C == 256 * kCols, the row held in registers (LayerNormRowHeld); 0: any C.
template <bool kResidual, int kCols>
__global__ void LayerNormForwardKernel(bf16* out, float* mean_out, float* rstd_out, const bf16* inp,
                                       const bf16* w, const bf16* b, int N, int C, bf16* residual,
                                       const bf16* ra, const bf16* rb) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= N) return;
  float mean, rstd;
  bf16* o = out + size_t(row) * C;
  if constexpr (kCols > 0) {
    Bf16x8 v[kCols];
    LayerNormRowHeld<kResidual, kCols>(row, lane, C, inp, residual, ra, rb, v, mean, rstd);
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const int c = lane * 8 + 256 * i;
      Store8(o + c, LayerNormChunkOf(v[i], w, b, c, mean, rstd));
    }
  } else {
    const bf16* x = LayerNormRowStats<kResidual>(row, lane, C, inp, residual, ra, rb, mean, rstd);
    for (int c = lane * 8; c < C; c += 256) Store8(o + c, LayerNormChunk(x, w, b, c, mean, rstd));
  }
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// LayerNorm + FP8 cast (Backend::ResidualLayerNormFp8Forward). A block of kWarps warps owns a
// tile of kFp8Rows rows x all C columns; each warp normalises its rows exactly as
// LayerNormForwardKernel (same functions, same order: bit-identical residual, mean, rstd and
// BF16 y), casts y with CastOne (fp8_cast.cuh: CastFp8's encoding and statistics) and writes
// the row-major FP8 as 8-byte words. The tile's FP8 rows also go to shared memory
// ([kFp8Rows][C + 8] bytes, dynamic), from which the block writes the transpose: each thread
// gathers 8 rows of one column into an 8-byte word of out_t's row (32-byte runs per column).
// The BF16 y is never written. kWarps is 8 (4 rows per warp), or 16 where 8-warp blocks would
// leave the GPU short of warps (see Fp8BlockWarps). kFromStats (Backend::LayerNormFp8FromStats):
// the rows are inp's as they stand and their mean and rstd are read from kept_mean and
// kept_rstd (nothing is written but the FP8 outputs and the statistics of the cast).
constexpr int kFp8Rows = 32;

__host__ __device__ constexpr int Fp8TilePitch(int C) { return C + 8; }

template <bool kResidual, bool kFromStats, int kWarps>
__global__ void __launch_bounds__(32 * kWarps)
    LayerNormFp8Kernel(uint8_t* q_out, uint8_t* q_out_t, float* mean_out, float* rstd_out,
                       const float* kept_mean, const float* kept_rstd, const bf16* inp,
                       const bf16* w, const bf16* b, int N, int C, bf16* residual, const bf16* ra,
                       const bf16* rb, bool e4m3, const float* scale_p, float* amax,
                       unsigned long long* counts) {
  static_assert(!(kResidual && kFromStats), "the kept rows are already the residual");
  extern __shared__ __align__(16) uint8_t tile[];  // [kFp8Rows][Fp8TilePitch(C)]
  __shared__ BlockCastStats s_stats;
  InitBlockCastStats(s_stats, threadIdx.x);
  const int pitch = Fp8TilePitch(C);
  const float scale = *scale_p;
  const float fp8_max = e4m3 ? kFp8E4M3Max : kFp8E5M2Max;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = blockIdx.x * kFp8Rows;
  CastStats st;
  for (int i = warp; i < kFp8Rows && r0 + i < N; i += kWarps) {
    const int row = r0 + i;
    float mean, rstd;
    const bf16* x;
    if constexpr (kFromStats) {
      mean = kept_mean[row];
      rstd = kept_rstd[row];
      x = inp + size_t(row) * C;
    } else {
      x = LayerNormRowStats<kResidual>(row, lane, C, inp, residual, ra, rb, mean, rstd);
    }
    for (int c = lane * 8; c < C; c += 256) {
      const Bf16x8 y = LayerNormChunk(x, w, b, c, mean, rstd);
      uint2 packed;
      uint8_t* q = reinterpret_cast<uint8_t*>(&packed);
#pragma unroll
      for (int k = 0; k < 8; ++k)
        q[k] = CastOne(__bfloat162float(y.v[k]), scale, fp8_max, e4m3, st);
      if (q_out != nullptr) *reinterpret_cast<uint2*>(q_out + size_t(row) * C + c) = packed;
      *reinterpret_cast<uint2*>(tile + i * pitch + c) = packed;
    }
    if (!kFromStats && lane == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
  }
  __syncthreads();
  if (q_out_t != nullptr) {
    constexpr int kGroups = kFp8Rows / 8;  // 8-row words per column
    for (int idx = threadIdx.x; idx < C * kGroups; idx += 32 * kWarps) {
      const int cc = idx / kGroups, g = idx % kGroups;
      const int rr = r0 + g * 8;
      if (rr < N) {  // N % 8 == 0: all 8 rows are in range
        uint2 packed;
        uint8_t* q = reinterpret_cast<uint8_t*>(&packed);
#pragma unroll
        for (int j = 0; j < 8; ++j) q[j] = tile[(g * 8 + j) * pitch + cc];
        *reinterpret_cast<uint2*>(q_out_t + size_t(cc) * N + rr) = packed;
      }
    }
  }
  FlushCastStats(st, s_stats, threadIdx.x, amax, counts);
}

// ResidualLayerNormFp8Forward without a transpose (what training's forward asks for): one warp
// per row as LayerNormForwardKernel (8 rows per block, no shared tile), each 8 outputs cast
// with Cast8 (fp8_cast.cuh: CastOne's bytes and counts) and written as an 8-byte word. The
// same functions in the same order as LayerNormFp8Kernel: the same residual, statistics and
// bytes.
template <bool kResidual, bool kE4M3, int kCols>
__global__ void __launch_bounds__(256)
    LayerNormFp8RowsKernel(uint8_t* q_out, float* mean_out, float* rstd_out, const bf16* inp,
                           const bf16* w, const bf16* b, int N, int C, bf16* residual,
                           const bf16* ra, const bf16* rb, const float* scale_p, float* amax,
                           unsigned long long* counts) {
  __shared__ BlockCastStats s_stats;
  InitBlockCastStats(s_stats, threadIdx.x);
  __syncthreads();
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  CastStats st;
  if (row < N) {  // no early return: FlushCastStats synchronises the block
    const float scale = *scale_p;
    float mean, rstd;
    uint8_t* q = q_out + size_t(row) * C;
    if constexpr (kCols > 0) {
      Bf16x8 v[kCols];
      LayerNormRowHeld<kResidual, kCols>(row, lane, C, inp, residual, ra, rb, v, mean, rstd);
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        const int c = lane * 8 + 256 * i;
        const Bf16x8 y = LayerNormChunkOf(v[i], w, b, c, mean, rstd);
        float f[8];
        *reinterpret_cast<uint2*>(q + c) =
            Cast8<kE4M3>(*reinterpret_cast<const uint4*>(&y), scale, st, f);
      }
    } else {
      const bf16* x = LayerNormRowStats<kResidual>(row, lane, C, inp, residual, ra, rb, mean, rstd);
      for (int c = lane * 8; c < C; c += 256) {
        const Bf16x8 y = LayerNormChunk(x, w, b, c, mean, rstd);
        float f[8];
        *reinterpret_cast<uint2*>(q + c) =
            Cast8<kE4M3>(*reinterpret_cast<const uint4*>(&y), scale, st, f);
      }
    }
    if (lane == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
  }
  FlushCastStats(st, s_stats, threadIdx.x, amax, counts);
}

template <bool kResidual, bool kE4M3>
auto Fp8RowsKernelFor(int held) {
  return held == 3   ? LayerNormFp8RowsKernel<kResidual, kE4M3, 3>
         : held == 8 ? LayerNormFp8RowsKernel<kResidual, kE4M3, 8>
                     : LayerNormFp8RowsKernel<kResidual, kE4M3, 0>;
}
template <bool kResidual>
auto Fp8RowsKernel(bool e4m3, int held) {
  return e4m3 ? Fp8RowsKernelFor<kResidual, true>(held) : Fp8RowsKernelFor<kResidual, false>(held);
}

// LayerNormFp8FromStats on the cast-transpose tile kernel (fp8_cast_tiles.cuh): the Op
// normalises 8 values of a kept row with its kept mean and rstd, LayerNormChunkOf's
// arithmetic: the forward's BF16 y, so the forward's bytes and statistics.
struct LayerNormFromStatsOp {
  static constexpr bool kReadsPre = false;
  static constexpr bool kRowCol = true;
  const float* mean;
  const float* rstd;
  const bf16* w;
  const bf16* b;
  struct Row {  // a row's kept statistics, loaded with the row's values
    float mean, rstd;
  };
  struct Cols {  // the weight and bias of a thread's 8 columns, loaded once
    Bf16x8 w, b;
  };
  __device__ __forceinline__ Row LoadRow(int row) const { return {mean[row], rstd[row]}; }
  __device__ __forceinline__ Cols LoadCols(int col) const { return {Load8(w + col), Load8(b + col)}; }
  __device__ __forceinline__ uint4 Apply(uint4 x, const Row& r, const Cols& c) const {
    const Bf16x8 y = LayerNormChunkOf(*reinterpret_cast<const Bf16x8*>(&x), c.w, c.b, r.mean, r.rstd);
    return *reinterpret_cast<const uint4*>(&y);
  }
};

int MaxDynamicSmem() {
  static const int bytes = [] {
    int dev = 0, optin = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    // Leave room for the static shared memory (the block's statistics).
    return optin - 64;
  }();
  return bytes;
}

size_t Fp8TileBytes(int C) { return size_t(kFp8Rows) * Fp8TilePitch(C); }

// Warps per block: 8 unless that gives fewer than about 3 blocks per SM, as on 8192 rows (seed,
// hidden-2048: 256 blocks on the H200's 132 SMs, 16 warps per SM); then 16 (twice the warps on
// the same tiles: 2 rows per warp, the transpose still written in 32-byte runs).
int Fp8BlockWarps(int N) {
  static const int min_blocks = [] {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    return 3 * sms;
  }();
  return CeilDiv(N, kFp8Rows) >= unsigned(min_blocks) ? 8 : 16;
}

// The LayerNormFp8Kernel instance for `warps` warps per block (Fp8BlockWarps: 8 or 16).
template <bool kResidual, bool kFromStats>
auto Fp8Kernel(int warps) {
  return warps == 8 ? LayerNormFp8Kernel<kResidual, kFromStats, 8>
                    : LayerNormFp8Kernel<kResidual, kFromStats, 16>;
}

// Lets every LayerNormFp8Kernel take the device's whole opt-in shared memory (once).
cudaError_t AllowFp8TileSmem() {
  static const cudaError_t err = [] {
    const int bytes = MaxDynamicSmem();
    for (const int warps : {8, 16}) {
      for (const void* k : {reinterpret_cast<const void*>(Fp8Kernel<true, false>(warps)),
                            reinterpret_cast<const void*>(Fp8Kernel<false, false>(warps)),
                            reinterpret_cast<const void*>(Fp8Kernel<false, true>(warps))}) {
        cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        if (e != cudaSuccess) return e;
      }
    }
    return cudaSuccess;
  }();
  return err;
}

bool Aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) % bytes) == 0;
}

__global__ void LayerNormBackwardInputKernel(bf16* dinp, const bf16* dout, const bf16* inp,
                                             const bf16* w, const float* mean_in,
                                             const float* rstd_in, int N, int C) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= N) return;
  const bf16* x = inp + size_t(row) * C;
  const bf16* dy = dout + size_t(row) * C;
  float mean = mean_in[row], rstd = rstd_in[row];
  float s1 = 0.f, s2 = 0.f;
  for (int c = lane * 8; c < C; c += 256) {
    Bf16x8 xv = Load8(x + c), dv = Load8(dy + c), wv = Load8(w + c);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float dn = __bfloat162float(wv.v[k]) * __bfloat162float(dv.v[k]);
      float xh = (__bfloat162float(xv.v[k]) - mean) * rstd;
      s1 += dn;
      s2 += dn * xh;
    }
  }
  float dn_mean = WarpSum(s1) / C, dn_xh_mean = WarpSum(s2) / C;
  bf16* dx = dinp + size_t(row) * C;
  for (int c = lane * 8; c < C; c += 256) {
    Bf16x8 xv = Load8(x + c), dv = Load8(dy + c), wv = Load8(w + c), gv = Load8(dx + c), r;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float dn = __bfloat162float(wv.v[k]) * __bfloat162float(dv.v[k]);
      float xh = (__bfloat162float(xv.v[k]) - mean) * rstd;
      float g = (dn - dn_mean - xh * dn_xh_mean) * rstd;
      r.v[k] = __float2bfloat16(__bfloat162float(gv.v[k]) + g);
    }
    Store8(dx + c, r);
  }
}

// partial[chunk][c] = Σ dout·xhat, partial[chunks + chunk][c] = Σ dout over the chunk's rows.
__global__ void LayerNormParamPartialKernel(float* partial, const bf16* dout, const bf16* inp,
                                            const float* mean, const float* rstd, int N, int C,
                                            int rows_per, int chunks) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  int chunk = blockIdx.y;
  if (c >= C) return;
  int r0 = chunk * rows_per, r1 = min(N, r0 + rows_per);
  float dw = 0.f, db = 0.f;
  for (int r = r0; r < r1; ++r) {
    float d = __bfloat162float(dout[size_t(r) * C + c]);
    float xh = (__bfloat162float(inp[size_t(r) * C + c]) - mean[r]) * rstd[r];
    dw += d * xh;
    db += d;
  }
  partial[size_t(chunk) * C + c] = dw;
  partial[size_t(chunks + chunk) * C + c] = db;
}

// The same partials with 16-byte loads: block (32, kColLanes) covers 256 columns (8 per
// thread) of one chunk of rows; row lane y sums rows r0 + y, r0 + y + kColLanes, ... and the
// lanes are added in lane order (StoreColumnLaneSums, reduce.cuh: deterministic).
// REQUIRES: C % 8 == 0, dout and inp 16-byte aligned (checked by the launcher).
__global__ void __launch_bounds__(32 * kColLanes)
    LayerNormParamPartialVec8Kernel(float* partial, const bf16* dout, const bf16* inp,
                                    const float* mean, const float* rstd, int N, int C,
                                    int rows_per, int chunks) {
  __shared__ float lanes[kColLanes][32 * 8];
  const int c0 = (blockIdx.x * 32 + threadIdx.x) * 8;
  const int chunk = blockIdx.y;
  const int r0 = chunk * rows_per, r1 = min(N, r0 + rows_per);
  float dw[8], db[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) dw[k] = db[k] = 0.f;
  if (c0 < C) {
    for (int r = r0 + threadIdx.y; r < r1; r += kColLanes) {
      const Bf16x8 dv = Load8(dout + size_t(r) * C + c0), xv = Load8(inp + size_t(r) * C + c0);
      const float m = mean[r], rs = rstd[r];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float d = __bfloat162float(dv.v[k]);
        const float xh = (__bfloat162float(xv.v[k]) - m) * rs;
        dw[k] += d * xh;
        db[k] += d;
      }
    }
  }
  StoreColumnLaneSums(lanes, dw, partial + size_t(chunk) * C, C);
  StoreColumnLaneSums(lanes, db, partial + size_t(chunks + chunk) * C, C);
}

// The backward in one pass for C = 256, 512 or 768 (GPT-2's and the seed's 768): one block
// of 8 warps per chunk of rows (the chunks of ColumnChunks), warp w taking the chunk's rows w,
// w + 8, ...; lane l owns columns 8l + 256i (i < kCols). Per row it reads x, dout and dinp
// once: the input gradient as LayerNormBackwardInputKernel computes it (the same sums in the
// same order), and dout·xhat and dout added into the lane's column accumulators in registers.
// At the end the block adds its warps' accumulators in warp order into partial[chunk] (weight)
// and partial[chunks + chunk] (bias), LayerNormParamPartialKernel's layout, for ColumnFinish:
// deterministic. (Wider rows need more accumulators than registers hold; with them in shared
// memory the kernel measured slower than the two-kernel path at C = 2048 on the H200.)
constexpr int kLnBwdWarps = 8;

template <int kCols>
__global__ void __launch_bounds__(32 * kLnBwdWarps, 2)
    LayerNormBackwardFusedKernel(bf16* dinp, float* partial, const bf16* dout, const bf16* inp,
                                 const bf16* w, const float* mean_in, const float* rstd_in, int N,
                                 int rows_per, int chunks) {
  constexpr int C = 256 * kCols;
  __shared__ float red[kLnBwdWarps][C];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = blockIdx.x * rows_per, r1 = min(N, r0 + rows_per);
  float acc_w[8 * kCols], acc_b[8 * kCols];
#pragma unroll
  for (int j = 0; j < 8 * kCols; ++j) acc_w[j] = acc_b[j] = 0.f;
  for (int row = r0 + warp; row < r1; row += kLnBwdWarps) {
    const bf16* x = inp + size_t(row) * C;
    const bf16* dy = dout + size_t(row) * C;
    bf16* dx = dinp + size_t(row) * C;
    // The weight is reloaded per row (L1-resident) to leave registers to the accumulators.
    Bf16x8 xv[kCols], dv[kCols];
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      xv[i] = Load8(x + lane * 8 + 256 * i);
      dv[i] = Load8(dy + lane * 8 + 256 * i);
    }
    const float mean = mean_in[row], rstd = rstd_in[row];
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const Bf16x8 wv = Load8(w + lane * 8 + 256 * i);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        float dn = __bfloat162float(wv.v[k]) * __bfloat162float(dv[i].v[k]);
        float xh = (__bfloat162float(xv[i].v[k]) - mean) * rstd;
        s1 += dn;
        s2 += dn * xh;
      }
    }
    const float dn_mean = WarpSum(s1) / C, dn_xh_mean = WarpSum(s2) / C;
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const Bf16x8 wv = Load8(w + lane * 8 + 256 * i), gv = Load8(dx + lane * 8 + 256 * i);
      Bf16x8 r;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float d = __bfloat162float(dv[i].v[k]);
        float dn = __bfloat162float(wv.v[k]) * d;
        float xh = (__bfloat162float(xv[i].v[k]) - mean) * rstd;
        float g = (dn - dn_mean - xh * dn_xh_mean) * rstd;
        r.v[k] = __float2bfloat16(__bfloat162float(gv.v[k]) + g);
        acc_w[8 * i + k] += d * xh;
        acc_b[8 * i + k] += d;
      }
      Store8(dx + lane * 8 + 256 * i, r);
    }
  }
  // The block's sums over its warps, in warp order: weight, then bias.
  for (int which = 0; which < 2; ++which) {
    __syncthreads();  // the previous pass has read red
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        red[warp][lane * 8 + 256 * i + k] = which == 0 ? acc_w[8 * i + k] : acc_b[8 * i + k];
      }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += 32 * kLnBwdWarps) {
      float sum = 0.f;
      for (int v = 0; v < kLnBwdWarps; ++v) sum += red[v][c];
      partial[(size_t(which) * chunks + blockIdx.x) * C + c] = sum;
    }
  }
}

template <int kCols>
cudaError_t LaunchLayerNormBackwardFused(bf16* dinp, float* partial, const bf16* dout,
                                         const bf16* inp, const bf16* weight, const float* mean,
                                         const float* rstd, int N, int rows_per, int chunks,
                                         cudaStream_t s) {
  LayerNormBackwardFusedKernel<kCols><<<chunks, 32 * kLnBwdWarps, 0, s>>>(
      dinp, partial, dout, inp, weight, mean, rstd, N, rows_per, chunks);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LayerNormForward(bf16* out, float* mean, float* rstd, const bf16* inp,
                             const bf16* weight, const bf16* bias, int N, int C, cudaStream_t s) {
  const int held = HeldCols(C);
  auto kernel = held == 3   ? LayerNormForwardKernel<false, 3>
                : held == 8 ? LayerNormForwardKernel<false, 8>
                            : LayerNormForwardKernel<false, 0>;
  kernel<<<CeilDiv(N, 8), 256, 0, s>>>(out, mean, rstd, inp, weight, bias, N, C, nullptr, nullptr,
                                       nullptr);
  return cudaGetLastError();
}

cudaError_t ResidualLayerNormForward(bf16* residual, bf16* out, float* mean, float* rstd,
                                     const bf16* a, const bf16* b, const bf16* weight,
                                     const bf16* bias, int N, int C, cudaStream_t s) {
  const int held = HeldCols(C);
  auto kernel = held == 3   ? LayerNormForwardKernel<true, 3>
                : held == 8 ? LayerNormForwardKernel<true, 8>
                            : LayerNormForwardKernel<true, 0>;
  kernel<<<CeilDiv(N, 8), 256, 0, s>>>(out, mean, rstd, nullptr, weight, bias, N, C, residual, a, b);
  return cudaGetLastError();
}

bool LayerNormFp8Fusable(const void* residual, const void* a, const void* b, const void* weight,
                         const void* bias, const void* fp8_out, const void* fp8_out_t, int N,
                         int C) {
  return N > 0 && C > 0 && N % 8 == 0 && C % 8 == 0 &&
         (fp8_out != nullptr || fp8_out_t != nullptr) && Aligned(residual, 16) && Aligned(a, 16) &&
         Aligned(b, 16) && Aligned(weight, 16) && Aligned(bias, 16) && Aligned(fp8_out, 8) &&
         Aligned(fp8_out_t, 8) && Fp8TileBytes(C) <= size_t(MaxDynamicSmem());
}

cudaError_t ResidualLayerNormFp8Forward(bf16* residual, float* mean, float* rstd, const bf16* a,
                                        const bf16* b, const bf16* weight, const bf16* bias, int N,
                                        int C, uint8_t* fp8_out, uint8_t* fp8_out_t, bool e4m3,
                                        const float* scale, float* amax, unsigned long long* counts,
                                        cudaStream_t s) {
  if (!LayerNormFp8Fusable(residual, a, b, weight, bias, fp8_out, fp8_out_t, N, C)) {
    return cudaErrorInvalidValue;
  }
  if (fp8_out_t == nullptr && g_ln_new_kernels) {
    const bool res = residual != nullptr;
    auto kernel = res ? Fp8RowsKernel<true>(e4m3, HeldCols(C))
                      : Fp8RowsKernel<false>(e4m3, HeldCols(C));
    kernel<<<CeilDiv(N, 8), 256, 0, s>>>(fp8_out, mean, rstd, res ? nullptr : a, weight, bias, N, C,
                                         residual, res ? a : nullptr, res ? b : nullptr, scale,
                                         amax, counts);
    return cudaGetLastError();
  }
  if (cudaError_t e = AllowFp8TileSmem(); e != cudaSuccess) return e;
  const size_t smem = Fp8TileBytes(C);
  const int blocks = CeilDiv(N, kFp8Rows), warps = Fp8BlockWarps(N);
  // With a residual the kernel forms the rows as a + b (ra, rb); else it reads a (inp).
  const bool res = residual != nullptr;
  auto kernel = res ? Fp8Kernel<true, false>(warps) : Fp8Kernel<false, false>(warps);
  kernel<<<blocks, 32 * warps, smem, s>>>(fp8_out, fp8_out_t, mean, rstd, nullptr, nullptr,
                                          res ? nullptr : a, weight, bias, N, C, residual,
                                          res ? a : nullptr, res ? b : nullptr, e4m3, scale, amax,
                                          counts);
  return cudaGetLastError();
}

void SetLayerNormReferenceKernels(bool on) { g_ln_new_kernels = !on; }

cudaError_t LayerNormFromStats(bf16* out, const bf16* inp, const float* mean, const float* rstd,
                               const bf16* weight, const bf16* bias, int N, int C, cudaStream_t s) {
  LayerNormFromStatsKernel<<<CeilDiv(N, 8), 256, 0, s>>>(out, inp, mean, rstd, weight, bias, N, C);
  return cudaGetLastError();
}

cudaError_t LayerNormFp8FromStats(const bf16* inp, const float* mean, const float* rstd,
                                  const bf16* weight, const bf16* bias, int N, int C,
                                  uint8_t* fp8_out, uint8_t* fp8_out_t, bool e4m3,
                                  const float* scale, float* amax, unsigned long long* counts,
                                  cudaStream_t s) {
  if (!LayerNormFp8Fusable(nullptr, inp, nullptr, weight, bias, fp8_out, fp8_out_t, N, C)) {
    return cudaErrorInvalidValue;
  }
  if (g_ln_new_kernels) {
    const LayerNormFromStatsOp op{mean, rstd, weight, bias};
    if (e4m3) {
      const CastTileGrid g =
          PlanCastTiles(N, C, CastTilesMaxBlocks<true, LayerNormFromStatsOp, false>());
      return LaunchCastTiles<true, LayerNormFromStatsOp, false>(
          fp8_out, fp8_out_t, inp, nullptr, nullptr, N, C, g, scale, amax, counts, s, op);
    }
    const CastTileGrid g =
        PlanCastTiles(N, C, CastTilesMaxBlocks<false, LayerNormFromStatsOp, false>());
    return LaunchCastTiles<false, LayerNormFromStatsOp, false>(
        fp8_out, fp8_out_t, inp, nullptr, nullptr, N, C, g, scale, amax, counts, s, op);
  }
  if (cudaError_t e = AllowFp8TileSmem(); e != cudaSuccess) return e;
  const int warps = Fp8BlockWarps(N);
  auto kernel = Fp8Kernel<false, true>(warps);
  kernel<<<CeilDiv(N, kFp8Rows), 32 * warps, Fp8TileBytes(C), s>>>(
      fp8_out, fp8_out_t, nullptr, nullptr, mean, rstd, inp, weight, bias, N, C, nullptr, nullptr,
      nullptr, e4m3, scale, amax, counts);
  return cudaGetLastError();
}

cudaError_t LayerNormBackward(bf16* dinp, bf16* dweight, bf16* dbias, const bf16* dout,
                              const bf16* inp, const bf16* weight, const float* mean,
                              const float* rstd, int N, int C, Scratch& scratch, cudaStream_t s) {
  int chunks = ColumnChunks(N);
  int rows_per = (N + chunks - 1) / chunks;
  float* partial = static_cast<float*>(scratch.Get(sizeof(float) * 2 * size_t(chunks) * C));
  if (!partial) return scratch.last_error();
  const bool fused = C % 256 == 0 && C <= 768 && reinterpret_cast<uintptr_t>(dinp) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(dout) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(inp) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(weight) % 16 == 0;
  if (fused) {
    cudaError_t err = C == 256 ? LaunchLayerNormBackwardFused<1>(dinp, partial, dout, inp, weight,
                                                                 mean, rstd, N, rows_per, chunks, s)
                      : C == 512
                          ? LaunchLayerNormBackwardFused<2>(dinp, partial, dout, inp, weight, mean,
                                                            rstd, N, rows_per, chunks, s)
                          : LaunchLayerNormBackwardFused<3>(dinp, partial, dout, inp, weight, mean,
                                                            rstd, N, rows_per, chunks, s);
    if (err != cudaSuccess) return err;
    return ColumnFinishPair(dweight, dbias, partial, chunks, C, s);
  }
  if (C % 8 == 0 && Aligned(dout, 16) && Aligned(inp, 16)) {
    LayerNormParamPartialVec8Kernel<<<dim3(CeilDiv(C, 256), chunks), dim3(32, kColLanes), 0, s>>>(
        partial, dout, inp, mean, rstd, N, C, rows_per, chunks);
  } else {
    LayerNormParamPartialKernel<<<dim3(CeilDiv(C, 128), chunks), 128, 0, s>>>(
        partial, dout, inp, mean, rstd, N, C, rows_per, chunks);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if ((err = ColumnFinishPair(dweight, dbias, partial, chunks, C, s)) != cudaSuccess) return err;
  LayerNormBackwardInputKernel<<<CeilDiv(N, 8), 256, 0, s>>>(dinp, dout, inp, weight, mean, rstd, N,
                                                             C);
  return cudaGetLastError();
}

}  // namespace boulder::kernels::cuda
