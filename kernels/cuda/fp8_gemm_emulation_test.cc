// Our Hopper FP8 GEMM (fp8_gemm_sm90.cuh: both tiles, the ping-pong kernel, the fused GELU
// cast of fc2's input) on the emulated GPU (emulated_gpu.h, emulated_gpu_tma.h: TMA, mbarriers,
// bulk groups and FP8 wgmma), against float64 products and, for the GELU cast, GELU of the
// kernel's own output.
// clang-format off
#include "kernels/cuda/emulated_gpu.h"  // first: it defines the CUDA built-ins the kernels use
#include "kernels/cuda/emulated_gpu_tma.h"
// clang-format on

#include "gtest/gtest.h"
#include "kernels/cuda/fp8_gemm_sm90.cuh"

namespace boulder::kernels::cuda::fp8gemm {
namespace {

// The schedules every test runs, all with late products (emulated_gpu.h): lockstep and greedy
// with TMA loads landing at issue, and greedy with loads landing only at the wait on their
// barrier (g_late_loads).
struct Schedule {
  bool greedy, late_loads;
  void Apply() const {
    emu::g_late_products = true;
    emu::g_greedy = greedy;
    g_late_loads = late_loads;
  }
};
constexpr Schedule kSchedules[] = {{false, false}, {true, false}, {true, true}};

// Mirrors Launch in fp8_gemm_sm90.cu: a persistent grid of min(tiles, sms) CTAs (sms small,
// so every CTA walks several tiles), one CTA at a time.
// kPingPong: Fp8GemmSm90PingPongKernel (BN 128, fast accumulation). kGelu: the fused cast of
// fc2's input into gelu_out (M × N codes) with gelu's scale and statistics.
template <int BN, bool kFast, bool kAE4, bool kBE4, bool kPingPong = false, bool kGelu = false>
void RunGemm(bf16* out, const uint8_t* a, const float* sa, const uint8_t* b, const float* sb,
             const bf16* bias, int M, int N, int K, bool accumulate, int sms,
             uint8_t* gelu_out = nullptr, GeluCastArgs gelu = {nullptr, nullptr, nullptr}) {
  using Cfg = std::conditional_t<kPingPong, PingPongCfg, GemmCfg<BN, kFast>>;
  if (Cfg::kSmemBytes > int(emu::kMaxSmem)) Die("dynamic shared memory over the device limit");
  CUtensorMap map_a, map_b, map_out, map_gelu;
  EncodeEmulatedMap(&map_a, a, K, M, 1, kBK, kBM);
  EncodeEmulatedMap(&map_b, b, K, N, 1, kBK, BN);
  EncodeEmulatedMap(&map_out, out, N, M, 2, 64, 64);
  if (kGelu) {
    EncodeEmulatedMap(&map_gelu, gelu_out, N, M, 1, 128, 64);
  } else {
    map_gelu = map_out;
  }
  const int tiles = (M / kBM) * (N / BN);
  gridDim = dim3(std::min(tiles, sms), 1, 1);
  blockDim = dim3(kThreads, 1, 1);
  emu::g_block.smem_bytes = Cfg::kSmemBytes;
  for (unsigned x = 0; x < gridDim.x; ++x) {
    blockIdx = make_uint3(x, 0, 0);
    std::memset(attn::smem, 0xff, emu::kMaxSmem);
    g_mbars.clear();
    emu::RunBlock(kThreads, [&] {
      if constexpr (kPingPong) {
        Fp8GemmSm90PingPongKernel<kAE4, kBE4, kGelu>(map_a, map_b, map_out, out, bias, sa, sb, M, N,
                                                     K, accumulate ? 1 : 0, map_gelu, gelu);
      } else {
        Fp8GemmSm90Kernel<BN, kFast, kAE4, kBE4, kGelu>(map_a, map_b, map_out, out, bias, sa, sb, M,
                                                        N, K, accumulate ? 1 : 0, map_gelu, gelu);
      }
    });
  }
}

struct GemmCase {
  int M, N, K;
  bool a_e4m3, b_e4m3, bias, accumulate;
};

// out = sa·sb·a·bᵀ (+ bias) (+ out) on FP8 codes of N(0, 1) values, against float64.
template <int BN, bool kFast, bool kAE4, bool kBE4, bool kPingPong = false>
void CheckGemm(const GemmCase& c, int sms, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << c.M << "x" << c.N << "x" << c.K << " BN " << BN
                                  << (kFast ? " fast" : " split") << (c.bias ? " bias" : "")
                                  << (c.accumulate ? " accumulate" : "") << " sms " << sms
                                  << (kPingPong ? " ping-pong" : ""));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const Fp8Format fa = kAE4 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
  const Fp8Format fb = kBE4 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
  std::vector<uint8_t> a(size_t(c.M) * c.K), b(size_t(c.N) * c.K);
  for (auto& x : a) x = cpu::EncodeFp8(nd(rng) * 4.f, fa);
  for (auto& x : b) x = cpu::EncodeFp8(nd(rng) * 4.f, fb);
  std::vector<bf16> bias(c.N), out(size_t(c.M) * c.N);
  for (auto& x : bias) x = __float2bfloat16(nd(rng));
  for (auto& x : out) x = c.accumulate ? __float2bfloat16(nd(rng)) : __float2bfloat16(NAN);
  const std::vector<bf16> init = out;
  const float sa = 0.125f, sb = 0.03f;
  RunGemm<BN, kFast, kAE4, kBE4, kPingPong>(out.data(), a.data(), &sa, b.data(), &sb,
                                            c.bias ? bias.data() : nullptr, c.M, c.N, c.K,
                                            c.accumulate, sms);
  double num = 0, den = 0, worst = 0, scale = 0;
  std::vector<double> want(out.size());
  for (int m = 0; m < c.M; ++m) {
    for (int n = 0; n < c.N; ++n) {
      double s = 0;
      for (int k = 0; k < c.K; ++k) {
        s += double(cpu::DecodeFp8(a[size_t(m) * c.K + k], fa)) *
             cpu::DecodeFp8(b[size_t(n) * c.K + k], fb);
      }
      double w = double(sa) * sb * s;
      if (c.bias) w += __bfloat162float(bias[n]);
      if (c.accumulate) w += __bfloat162float(init[size_t(m) * c.N + n]);
      want[size_t(m) * c.N + n] = w;
      scale = std::max(scale, std::fabs(w));
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    const double got = __bfloat162float(out[i]), e = got - want[i];
    if (!std::isfinite(got)) {
      ADD_FAILURE() << "output " << i / c.N << "," << i % c.N << " not written (" << got << ")";
      return;
    }
    num += e * e;
    den += want[i] * want[i];
    worst = std::max(worst, std::fabs(e) - std::fabs(want[i]) / 128);  // past BF16's rounding
  }
  EXPECT_LT(std::sqrt(num / den), 4e-3) << "relative L2 error";
  EXPECT_LT(worst, 1e-6 * scale) << "an element beyond BF16 rounding of the exact value";
}

// Tiles of 128 × 256 (fast accumulation) and 128 × 128; 1 to 3 CTAs, so a CTA walks one or
// several tiles and the stage ring (3 stages at 256, 5 at 128) wraps inside and across tiles.
TEST(Fp8GemmEmulationTest, WideTilesFastAccumulation) {
  for (const Schedule& sched : kSchedules) {
    sched.Apply();
    CheckGemm<256, true, true, true>({256, 512, 384, true, true, true, false}, 3, 21);
    CheckGemm<256, true, true, true>({128, 256, 128, true, true, false, false}, 1, 22);
  }
}

TEST(Fp8GemmEmulationTest, NarrowTilesSplitAccumulationAndAccumulate) {
  for (const Schedule& sched : kSchedules) {
    sched.Apply();
    CheckGemm<128, false, false, true>({128, 256, 768, false, true, false, false}, 1, 23);
    CheckGemm<128, false, true, false>({128, 256, 256, true, false, false, true}, 3, 24);
    CheckGemm<128, true, true, true>({256, 128, 640, true, true, true, false}, 1, 25);
  }
}

// The ping-pong kernel: the warpgroups' turns with an odd and an even number of tiles per CTA
// (6, 2, 2 and 1, 3 tiles), the stage ring (5 stages) wrapping inside and across tiles.
TEST(Fp8GemmEmulationTest, PingPongTiles) {
  for (const Schedule& sched : kSchedules) {
    sched.Apply();
    CheckGemm<128, true, true, true, true>({256, 384, 768, true, true, true, false}, 1, 26);
    CheckGemm<128, true, true, true, true>({128, 256, 384, true, true, false, false}, 1, 27);
    CheckGemm<128, true, true, false, true>({384, 128, 256, true, false, false, true}, 2, 28);
    CheckGemm<128, true, true, true, true>({384, 128, 128, true, true, true, false}, 1, 29);
  }
}

// The fused cast of fc2's input (kGelu): the BF16 output as CheckGemm checks it, and the
// codes and statistics exactly as GeluCastFp8 makes them from that output: g = bf16(GeluTanh(x))
// (common.cuh's, here on the host), E4M3 of g · scale (satfinite, the CPU backend's encoding),
// amax the largest |g|, saturated |g · scale| > 448, underflow non-zero g with a zero code. The
// scale is chosen so that some values saturate and some flush to zero.
template <int BN, bool kPingPong>
void CheckGeluGemm(int M, int N, int K, int sms, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << M << "x" << N << "x" << K << " BN " << BN << " sms " << sms
                                  << (kPingPong ? " ping-pong" : "") << " GELU cast");
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint8_t> a(size_t(M) * K), b(size_t(N) * K);
  for (auto& x : a) x = cpu::EncodeFp8(nd(rng) * 4.f, Fp8Format::kE4M3);
  for (auto& x : b) x = cpu::EncodeFp8(nd(rng) * 4.f, Fp8Format::kE4M3);
  std::vector<bf16> bias(N), out(size_t(M) * N, __float2bfloat16(NAN));
  for (auto& x : bias) x = __float2bfloat16(nd(rng));
  const float sa = 0.125f, sb = 0.03f;
  // The largest output, in float64, sets the scale: values above 0.7 of it saturate.
  double top = 0;
  for (int m = 0; m < M; ++m) {
    for (int n = 0; n < N; ++n) {
      double acc = 0;
      for (int k = 0; k < K; ++k) {
        acc += double(cpu::DecodeFp8(a[size_t(m) * K + k], Fp8Format::kE4M3)) *
               cpu::DecodeFp8(b[size_t(n) * K + k], Fp8Format::kE4M3);
      }
      top = std::max(top, double(sa) * sb * acc + __bfloat162float(bias[n]));
    }
  }
  const float scale = float(448.0 / (0.7 * top));
  std::vector<uint8_t> codes(size_t(M) * N, 0x7f);  // NaN codes: unwritten shows
  float amax = 0;
  unsigned long long counts[3] = {0, 0, 0};
  RunGemm<BN, true, true, true, kPingPong, true>(out.data(), a.data(), &sa, b.data(), &sb,
                                                 bias.data(), M, N, K, false, sms, codes.data(),
                                                 {&scale, &amax, counts});
  unsigned want_amax = 0;
  unsigned long long want[3] = {0, 0, 0};
  for (size_t i = 0; i < out.size(); ++i) {
    const float x = __bfloat162float(out[i]);
    ASSERT_TRUE(std::isfinite(x)) << "output " << i / N << "," << i % N << " not written";
    const float g = __bfloat162float(__float2bfloat16(GeluTanh(x)));
    const float y = g * scale;
    const uint8_t q = cpu::EncodeFp8(y, Fp8Format::kE4M3);
    ASSERT_EQ(codes[i], q) << "code " << i / N << "," << i % N << " of GELU(" << x << ")";
    unsigned bits;
    std::memcpy(&bits, &g, 4);
    want_amax = std::max(want_amax, bits & 0x7fffffffu);
    if (std::fabs(y) > 448.f) ++want[0];
    if (g != 0.f && (q & 0x7f) == 0) ++want[1];
  }
  unsigned got_amax;
  std::memcpy(&got_amax, &amax, 4);
  EXPECT_EQ(got_amax, want_amax) << "amax";
  EXPECT_EQ(counts[0], want[0]) << "saturated";
  EXPECT_EQ(counts[1], want[1]) << "underflow";
  EXPECT_EQ(counts[2], 0u) << "non-finite";
  EXPECT_GT(want[0], 0u) << "the test's scale saturates nothing";
  EXPECT_GT(want[1], 0u) << "the test's scale flushes nothing";
}

// Both tiles and the ping-pong kernel with the GELU cast: one CTA walking several tiles (the
// staging reused by the BF16 and the FP8 stores of each), and several CTAs.
TEST(Fp8GemmEmulationTest, FusedGeluCast) {
  for (const Schedule& sched : kSchedules) {
    sched.Apply();
    CheckGeluGemm<256, false>(256, 512, 256, 1, 30);
    CheckGeluGemm<128, false>(256, 256, 384, 3, 31);
    CheckGeluGemm<128, true>(384, 256, 256, 2, 32);
  }
}

}  // namespace
}  // namespace boulder::kernels::cuda::fp8gemm
