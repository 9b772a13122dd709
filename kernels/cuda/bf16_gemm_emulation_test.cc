// Our Hopper BF16 GEMM (bf16_gemm_sm90.cuh: both tiles, with and without the GELU epilogue) on
// the emulated GPU (emulated_gpu.h, emulated_gpu_tma.h: TMA, mbarriers, bulk groups and BF16
// wgmma), against float64 products of the BF16 operands and, for GELU, GELU of the kernel's
// own pre-activation output.
// clang-format off
#include "kernels/cuda/emulated_gpu.h"  // first: it defines the CUDA built-ins the kernels use
#include "kernels/cuda/emulated_gpu_tma.h"
// clang-format on

#include "gtest/gtest.h"
#include "kernels/cuda/bf16_gemm_sm90.cuh"

namespace boulder::kernels::cuda::bf16gemm {
namespace {

using fp8gemm::EncodeEmulatedMap;
using fp8gemm::g_late_loads;
using fp8gemm::g_mbars;
using fp8gemm::PingPongCfg;

// Lockstep and greedy with TMA loads landing at issue, and greedy with loads landing only at
// the wait on their barrier; all with late products (as fp8_gemm_emulation_test).
struct Schedule {
  bool greedy, late_loads;
  void Apply() const {
    emu::g_late_products = true;
    emu::g_greedy = greedy;
    g_late_loads = late_loads;
  }
};
constexpr Schedule kSchedules[] = {{false, false}, {true, false}, {true, true}};

// Mirrors Launch in bf16_gemm_sm90.cu: byte maps of rows of 2K, a persistent grid of
// min(tiles, sms) CTAs, one CTA at a time.
// kPingPong: Bf16GemmSm90PingPongKernel (BN 128).
template <int BN, bool kGelu, bool kPingPong = false>
void RunGemm(bf16* out, bf16* gelu, const bf16* a, const bf16* b, const bf16* bias, int M, int N,
             int K, int sms) {
  using C = std::conditional_t<kPingPong, PingPongCfg, Cfg<BN>>;
  if (C::kSmemBytes > int(emu::kMaxSmem)) emu::Die("dynamic shared memory over the device limit");
  CUtensorMap map_a, map_b, map_out, map_gelu;
  EncodeEmulatedMap(&map_a, a, 2 * K, M, 1, kBK, kBM);
  EncodeEmulatedMap(&map_b, b, 2 * K, N, 1, kBK, BN);
  EncodeEmulatedMap(&map_out, out, N, M, 2, 64, 64);
  if (kGelu) {
    EncodeEmulatedMap(&map_gelu, gelu, N, M, 2, 64, 64);
  } else {
    map_gelu = map_out;
  }
  const int tiles = (M / kBM) * (N / BN);
  gridDim = dim3(std::min(tiles, sms), 1, 1);
  blockDim = dim3(kThreads, 1, 1);
  emu::g_block.smem_bytes = C::kSmemBytes;
  for (unsigned x = 0; x < gridDim.x; ++x) {
    blockIdx = make_uint3(x, 0, 0);
    std::memset(attn::smem, 0xff, emu::kMaxSmem);
    g_mbars.clear();
    emu::RunBlock(kThreads, [&] {
      if constexpr (kPingPong) {
        Bf16GemmSm90PingPongKernel<kGelu>(map_a, map_b, map_out, map_gelu, bias, M, N, 2 * K);
      } else {
        Bf16GemmSm90Kernel<BN, kGelu>(map_a, map_b, map_out, map_gelu, bias, M, N, 2 * K);
      }
    });
  }
}

// out = a·bᵀ (+ bias) on BF16 N(0, 1) values against float64; with kGelu also gelu = the BF16
// of GeluTanh (common.cuh's, here on the host) of each output, exactly.
template <int BN, bool kGelu, bool kPingPong = false>
void CheckGemm(int M, int N, int K, bool with_bias, int sms, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << M << "x" << N << "x" << K << " BN " << BN
                                  << (kPingPong ? " ping-pong" : "")
                                  << (with_bias ? " bias" : "") << (kGelu ? " GELU" : "")
                                  << " sms " << sms);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<bf16> a(size_t(M) * K), b(size_t(N) * K), bias(N);
  for (auto& x : a) x = __float2bfloat16(nd(rng));
  for (auto& x : b) x = __float2bfloat16(nd(rng));
  for (auto& x : bias) x = __float2bfloat16(nd(rng));
  std::vector<bf16> out(size_t(M) * N, __float2bfloat16(NAN)), gelu(out);
  RunGemm<BN, kGelu, kPingPong>(out.data(), gelu.data(), a.data(), b.data(), with_bias ? bias.data() : nullptr,
                     M, N, K, sms);
  double num = 0, den = 0, worst = 0, scale = 0;
  std::vector<double> want(out.size());
  for (int m = 0; m < M; ++m) {
    for (int n = 0; n < N; ++n) {
      double s = 0;
      for (int k = 0; k < K; ++k) {
        s += double(__bfloat162float(a[size_t(m) * K + k])) * __bfloat162float(b[size_t(n) * K + k]);
      }
      if (with_bias) s += __bfloat162float(bias[n]);
      want[size_t(m) * N + n] = s;
      scale = std::max(scale, std::fabs(s));
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    const double got = __bfloat162float(out[i]), e = got - want[i];
    ASSERT_TRUE(std::isfinite(got)) << "output " << i / N << "," << i % N << " not written";
    num += e * e;
    den += want[i] * want[i];
    worst = std::max(worst, std::fabs(e) - std::fabs(want[i]) / 128);  // past BF16's rounding
    if (kGelu) {
      const float g = __bfloat162float(__float2bfloat16(GeluTanh(float(got))));
      ASSERT_EQ(__bfloat162float(gelu[i]), g)
          << "GELU " << i / N << "," << i % N << " of " << got;
    }
  }
  EXPECT_LT(std::sqrt(num / den), 4e-3) << "relative L2 error";
  EXPECT_LT(worst, 1e-5 * scale) << "an element beyond BF16 rounding of the exact value";
}

// 128 × 256 tiles (3 stages) and 128 × 128 (5 stages); one CTA walking several tiles (the
// stage ring wrapping inside and across tiles, the staging reused) and several CTAs.
TEST(Bf16GemmEmulationTest, WideTiles) {
  for (const Schedule& sched : kSchedules) {
    sched.Apply();
    CheckGemm<256, false>(256, 512, 192, true, 3, 41);
    CheckGemm<256, false>(128, 256, 64, false, 1, 42);
  }
}

TEST(Bf16GemmEmulationTest, NarrowTiles) {
  for (const Schedule& sched : kSchedules) {
    sched.Apply();
    CheckGemm<128, false>(256, 256, 384, true, 1, 43);
    CheckGemm<128, false>(384, 128, 128, false, 2, 44);
  }
}

TEST(Bf16GemmEmulationTest, GeluEpilogue) {
  for (const Schedule& sched : kSchedules) {
    sched.Apply();
    CheckGemm<256, true>(256, 512, 128, true, 1, 45);
    CheckGemm<128, true>(256, 256, 192, true, 3, 46);
    CheckGemm<128, true>(128, 384, 64, false, 1, 47);
  }
}

// The ping-pong kernel: the warpgroups' turns with an odd and an even number of tiles per CTA
// (6; 2, 2; 3), the stage ring (5 stages) wrapping inside and across tiles, with and without
// GELU.
TEST(Bf16GemmEmulationTest, PingPong) {
  for (const Schedule& sched : kSchedules) {
    sched.Apply();
    CheckGemm<128, false, true>(256, 384, 384, true, 1, 48);
    CheckGemm<128, true, true>(256, 256, 192, true, 2, 49);
    CheckGemm<128, true, true>(384, 128, 64, false, 1, 50);
  }
}

}  // namespace
}  // namespace boulder::kernels::cuda::bf16gemm
