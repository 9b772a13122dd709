// The BF16 GEMM of bf16_gemm_sm90.h: tensor maps and launcher (the kernel:
// bf16_gemm_sm90.cuh).
#include "kernels/cuda/bf16_gemm_sm90.cuh"
#include "kernels/cuda/bf16_gemm_sm90.h"
#include "kernels/cuda/fp8_gemm_sm90.h"
#include "kernels/cuda/tma_map.h"

#include <type_traits>

namespace boulder::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using bf16gemm::Bf16GemmSm90Kernel;
using bf16gemm::Cfg;
using bf16gemm::kBM;
using bf16gemm::kThreads;

// kPingPong: Bf16GemmSm90PingPongKernel (BN 128).
template <int BN, bool kGelu, bool kPingPong = false>
cudaError_t Launch(bf16* out, bf16* gelu_out, const bf16* a, const bf16* b, const bf16* bias,
                   int M, int N, int K, cudaStream_t s) {
  static_assert(!kPingPong || BN == 128, "ping-pong: 128-column tiles");
  using C = std::conditional_t<kPingPong, bf16gemm::PingPongCfg, Cfg<BN>>;
  auto kernel = kPingPong ? bf16gemm::Bf16GemmSm90PingPongKernel<kGelu>
                          : Bf16GemmSm90Kernel<BN, kGelu>;
  static int per_sm = [&] {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             C::kSmemBytes) != cudaSuccess) {
      return 0;
    }
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads,
                                                      C::kSmemBytes) != cudaSuccess) {
      return 0;
    }
    return blocks;
  }();
  if (per_sm <= 0) return cudaErrorInvalidConfiguration;
  // The operands as bytes: rows of 2K, k-blocks of 128 bytes (64 values).
  CUtensorMap map_a, map_b, map_out, map_gelu;
  if (!tma::EncodeMap(&map_a, reinterpret_cast<const uint8_t*>(a), M, 2 * K, kBM) ||
      !tma::EncodeMap(&map_b, reinterpret_cast<const uint8_t*>(b), N, 2 * K, BN) ||
      !tma::EncodeOutMap(&map_out, out, M, N)) {
    return cudaErrorInvalidValue;
  }
  if constexpr (kGelu) {
    if (!tma::EncodeOutMap(&map_gelu, gelu_out, M, N)) return cudaErrorInvalidValue;
  } else {
    map_gelu = map_out;  // unused
  }
  const int tiles = (M / kBM) * (N / BN);
  const int sms = tma::SmCount();
  const int grid = tiles < per_sm * sms ? tiles : per_sm * sms;
  kernel<<<grid, kThreads, C::kSmemBytes, s>>>(map_a, map_b, map_out, map_gelu, bias, M, N,
                                                     2 * K);
  return cudaGetLastError();
}

}  // namespace

bool Bf16GemmSm90Available() {
  static bool ok = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
      return false;
    }
    if (major != 9 || minor != 0 || tma::Encoder() == nullptr) return false;
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, Bf16GemmSm90Kernel<128, false>) != cudaSuccess) return false;
    return attr.binaryVersion == 90;  // sm_90a machine code (see AttentionWgmmaAvailable)
  }();
  return ok;
}

bool Bf16GemmSm90Supports(int M, int N, int K, const void* a, const void* b, const void* out,
                          const void* bias, const void* gelu_out) {
  auto aligned = [](const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
  return M > 0 && N > 0 && K > 0 && M % kBM == 0 && N % 128 == 0 && K % 64 == 0 &&
         a != nullptr && b != nullptr && out != nullptr && aligned(a, 16) && aligned(b, 16) &&
         aligned(out, 16) && aligned(bias, 4) && aligned(gelu_out, 16);
}

bool Bf16GemmSm90Preferred(int M, int N, int K, bool gelu) {
  // Measured on the H200 (2026-12-07, bench/bf16-gemm-2026-12-07.md): slower than cuBLASLt on
  // every Linear forward of the three workloads (e.g. GPT-2 fc1 0.1277 vs 0.1208 ms, hidden-2048
  // fc1 0.4309 vs 0.3569) but the seed model's projection (0.0261 vs 0.0276 ms, 0.006 ms per
  // step), and slower in every BF16 step: cuBLASLt everywhere.
  (void)M, (void)N, (void)K, (void)gelu;
  return false;
}

cudaError_t Bf16GemmSm90(bf16* out, bf16* gelu_out, const bf16* a, const bf16* b, const bf16* bias,
                         int M, int N, int K, cudaStream_t s, Bf16GemmTile tile) {
  if (!Bf16GemmSm90Available() || !Bf16GemmSm90Supports(M, N, K, a, b, out, bias, gelu_out)) {
    return cudaErrorInvalidValue;
  }
  if (tile == Bf16GemmTile::kN256 && N % 256 != 0) tile = Bf16GemmTile::kN128;
  if (tile == Bf16GemmTile::kAuto) {
    tile = Fp8GemmSm90AutoColumns(M, N, /*fast_accum=*/true, tma::SmCount()) == 256
               ? Bf16GemmTile::kN256
               : Bf16GemmTile::kN128;
  }
  if (tile == Bf16GemmTile::kPingPong) {
    return gelu_out != nullptr ? Launch<128, true, true>(out, gelu_out, a, b, bias, M, N, K, s)
                               : Launch<128, false, true>(out, nullptr, a, b, bias, M, N, K, s);
  }
  if (gelu_out != nullptr) {
    return tile == Bf16GemmTile::kN256 ? Launch<256, true>(out, gelu_out, a, b, bias, M, N, K, s)
                                       : Launch<128, true>(out, gelu_out, a, b, bias, M, N, K, s);
  }
  return tile == Bf16GemmTile::kN256 ? Launch<256, false>(out, nullptr, a, b, bias, M, N, K, s)
                                     : Launch<128, false>(out, nullptr, a, b, bias, M, N, K, s);
}

}  // namespace boulder::kernels::cuda
