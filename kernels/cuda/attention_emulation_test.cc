// The flash attention kernels (attention_fwd.cuh, attention_bwd.cuh and their sm_90a wgmma
// versions) on the emulated GPU (emulated_gpu.h), against a float64 reference; the wgmma
// forward's FP8 cast of its output against the CPU's CastFp8.
// clang-format off
#include "kernels/cuda/emulated_gpu.h"  // first: it defines the CUDA built-ins the kernels use
// clang-format on

#include "gtest/gtest.h"
#include "kernels/cuda/attention_bwd.cuh"
#include "kernels/cuda/attention_bwd_sm90.cuh"
#include "kernels/cuda/attention_fwd.cuh"
#include "kernels/cuda/attention_fwd_sm90.cuh"
#include "kernels/cuda/attention_fwd_sm90_pipelined.cuh"

namespace boulder::kernels::cuda::attn {
namespace {

// Runs kernel(args...) over a grid, one block at a time.
template <typename F>
void Launch(dim3 grid, int threads, size_t smem_bytes, F kernel) {
  if (smem_bytes > emu::kMaxSmem) Die("dynamic shared memory over the device limit");
  gridDim = grid;
  blockDim = dim3(threads, 1, 1);
  emu::g_block.smem_bytes = smem_bytes;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = make_uint3(x, y, z);
        std::memset(smem, 0xff, emu::kMaxSmem);  // NaN in BF16 and in FP32
        emu::RunBlock(threads, kernel);
      }
    }
  }
}

float RoundBF16(float f) { return __bfloat162float(__float2bfloat16(f)); }

struct Problem {
  int B, T, NH, HS;
  int C() const { return NH * HS; }
};

// float64 causal attention: out, lse (natural log of the scaled scores' sum of exponentials)
// and the gradient of qkv given dout.
void Reference(const Problem& pr, const std::vector<float>& qkv, const std::vector<float>& dout,
               std::vector<double>* out, std::vector<double>* lse, std::vector<double>* dqkv) {
  const int B = pr.B, T = pr.T, NH = pr.NH, HS = pr.HS, C = pr.C();
  const double scale = 1.0 / std::sqrt(double(HS));
  out->assign(size_t(B) * T * C, 0.0);
  lse->assign(size_t(B) * NH * T, 0.0);
  dqkv->assign(qkv.size(), 0.0);
  auto at = [&](int b, int t, int part, int h, int c) {
    return size_t(b) * T * 3 * C + size_t(t) * 3 * C + part * C + h * HS + c;
  };
  std::vector<double> p(T), dp(T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int q = 0; q < T; ++q) {
        double mx = -INFINITY;
        for (int k = 0; k <= q; ++k) {
          double s = 0;
          for (int c = 0; c < HS; ++c) s += double(qkv[at(b, q, 0, h, c)]) * qkv[at(b, k, 1, h, c)];
          p[k] = s * scale;
          mx = std::max(mx, p[k]);
        }
        double sum = 0;
        for (int k = 0; k <= q; ++k) sum += std::exp(p[k] - mx);
        (*lse)[(size_t(b) * NH + h) * T + q] = mx + std::log(sum);
        for (int k = 0; k <= q; ++k) p[k] = std::exp(p[k] - mx) / sum;
        double D = 0;
        for (int c = 0; c < HS; ++c) {
          double o = 0;
          for (int k = 0; k <= q; ++k) o += p[k] * qkv[at(b, k, 2, h, c)];
          (*out)[(size_t(b) * T + q) * C + h * HS + c] = o;
          D += o * dout[(size_t(b) * T + q) * C + h * HS + c];
        }
        for (int k = 0; k <= q; ++k) {
          double d = 0;
          for (int c = 0; c < HS; ++c)
            d += double(dout[(size_t(b) * T + q) * C + h * HS + c]) * qkv[at(b, k, 2, h, c)];
          dp[k] = p[k] * (d - D);  // dS
        }
        for (int k = 0; k <= q; ++k) {
          for (int c = 0; c < HS; ++c) {
            const double g = dout[(size_t(b) * T + q) * C + h * HS + c];
            (*dqkv)[at(b, q, 0, h, c)] += scale * dp[k] * qkv[at(b, k, 1, h, c)];
            (*dqkv)[at(b, k, 1, h, c)] += scale * dp[k] * qkv[at(b, q, 0, h, c)];
            (*dqkv)[at(b, k, 2, h, c)] += p[k] * g;
          }
        }
      }
    }
  }
}

std::vector<bf16> ToBf16(const std::vector<float>& v) {
  std::vector<bf16> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = __float2bfloat16(v[i]);
  return r;
}

template <typename T, typename Get>
double RelErr(const std::vector<T>& got, const std::vector<double>& want, Get get, size_t begin = 0,
              size_t step = 1, size_t len = 0) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (len && (i - begin) % step >= len) continue;
    if (len && i < begin) continue;
    const double g = get(got[i]);
    if (!std::isfinite(g)) return INFINITY;
    num += (g - want[i]) * (g - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

template <int HS>
void RunForward(const Problem& pr, const std::vector<bf16>& qkv, std::vector<bf16>* out,
                std::vector<float>* stats) {
  using Cfg = FwdCfg<HS>;
  const int C = pr.C();
  const bf16* q = qkv.data();
  bf16* o = out->data();
  float* st = stats->data();
  const float scale_log2 = kLog2e / std::sqrt(float(HS));
  const int T = pr.T, NH = pr.NH;
  Launch(dim3(pr.B * NH, (T + Cfg::kBq - 1) / Cfg::kBq), Cfg::kThreads, Cfg::kSmemBytes,
         [=] { FlashForwardKernel<HS>(o, st, q, T, C, NH, scale_log2); });
}

// Mirrors Backward<HS> in attention_bwd.cu.
template <int HS>
void RunBackward(const Problem& pr, const std::vector<bf16>& qkv, const std::vector<bf16>& out,
                 const std::vector<float>& stats, const std::vector<bf16>& dout, bool deterministic,
                 std::vector<bf16>* dqkv) {
  const int B = pr.B, T = pr.T, NH = pr.NH, C = pr.C(), Tp = PaddedT(T);
  const size_t n_rows = size_t(B) * NH * Tp;
  std::vector<float> Dp(n_rows, NAN), lse2(n_rows, NAN), dq_acc(size_t(B) * T * C, 0.f);
  const float scale = 1.f / std::sqrt(float(HS)), scale_log2 = scale * kLog2e;
  float *pD = Dp.data(), *pL = lse2.data(), *pA = dq_acc.data();
  const bf16 *pq = qkv.data(), *po = out.data(), *pdo = dout.data();
  const float* ps = stats.data();
  bf16* pdq = dqkv->data();
  Launch(dim3(unsigned((n_rows + 7) / 8)), 256, 0,
         [=] { PreprocessKernel<HS>(pD, pL, pdo, po, ps, B, T, Tp, C, NH); });
  const dim3 kv_grid(B * NH, (T + 127) / 128);
  if (!deterministic) {
    using Cfg = KVCfg<HS, true>;
    Launch(kv_grid, kBwdThreads, Cfg::kSmemBytes, [=] {
      FlashBackwardKVKernel<HS, true>(pdq, pA, pdo, pq, pL, pD, T, Tp, C, NH, scale, scale_log2);
    });
    const size_t n8 = dq_acc.size() / 8;
    Launch(dim3(unsigned((n8 + 255) / 256)), 256, 0,
           [=] { ConvertDQKernel(pdq, pA, n8, C, scale); });
    return;
  }
  using Cfg = KVCfg<HS, false>;
  Launch(kv_grid, kBwdThreads, Cfg::kSmemBytes, [=] {
    FlashBackwardKVKernel<HS, false>(pdq, nullptr, pdo, pq, pL, pD, T, Tp, C, NH, scale,
                                     scale_log2);
  });
  using QC = QCfg<HS>;
  Launch(dim3(B * NH, (T + QC::kBq - 1) / QC::kBq), kBwdThreads, QC::kSmemBytes,
         [=] { FlashBackwardQKernel<HS>(pdq, pdo, pq, pL, pD, T, Tp, C, NH, scale, scale_log2); });
}

// Mirror AttentionForwardSm90 (attention_fwd_sm90.cu) and Backward<HS> (attention_bwd.cu) with
// its wgmma kernels: preprocess, dK/dV, dQ (the same in both modes). pipelined:
// attention_fwd_sm90_pipelined.cuh's forward instead (its launch bounds do not matter here).
template <int HS>
void RunForwardSm90(const Problem& pr, const std::vector<bf16>& qkv, std::vector<bf16>* out,
                    std::vector<float>* stats, bool pipelined = false) {
  using Cfg = Sm90FwdCfg<HS>;
  const int C = pr.C(), T = pr.T, NH = pr.NH;
  const bf16* q = qkv.data();
  bf16* o = out->data();
  float* st = stats->data();
  const float scale_log2 = kLog2e / std::sqrt(float(HS));
  Launch(dim3(pr.B * NH, (T + Cfg::kBq - 1) / Cfg::kBq), Cfg::kThreads, Cfg::kSmemBytes, [=] {
    if (pipelined) {
      FlashForwardSm90PipelinedKernel<HS, false, 1>(o, st, q, T, C, NH, scale_log2, nullptr,
                                                    nullptr, nullptr, nullptr);
    } else {
      FlashForwardSm90Kernel<HS>(o, st, q, T, C, NH, scale_log2, nullptr, nullptr, nullptr,
                                 nullptr);
    }
  });
}
// With the FP8 cast of out (kFp8, as AttentionForwardSm90 with an AttentionFp8Cast); pipelined:
// attention_fwd_sm90_pipelined.cuh's kernel instead.
template <int HS>
void RunForwardSm90Fp8(const Problem& pr, const std::vector<bf16>& qkv, std::vector<bf16>* out,
                       std::vector<float>* stats, std::vector<uint8_t>* codes, float scale,
                       float* amax, unsigned long long* counts, bool pipelined = false) {
  using Cfg = Sm90FwdCfg<HS>;
  const int C = pr.C(), T = pr.T, NH = pr.NH;
  const bf16* q = qkv.data();
  bf16* o = out->data();
  float* st = stats->data();
  uint8_t* c8 = codes->data();
  const float scale_log2 = kLog2e / std::sqrt(float(HS));
  const float* sc = &scale;
  Launch(dim3(pr.B * NH, (T + Cfg::kBq - 1) / Cfg::kBq), Cfg::kThreads, Cfg::kFp8SmemBytes, [=] {
    if (pipelined) {
      FlashForwardSm90PipelinedKernel<HS, true, 1>(o, st, q, T, C, NH, scale_log2, c8, sc, amax,
                                                   counts);
    } else {
      FlashForwardSm90Kernel<HS, true>(o, st, q, T, C, NH, scale_log2, c8, sc, amax, counts);
    }
  });
}

// stored_ds: the dK/dV kernel also writes dS, and dQ comes from it (AttentionDq::kStoredDs).
template <int HS>
void RunBackwardSm90(const Problem& pr, const std::vector<bf16>& qkv, const std::vector<bf16>& out,
                     const std::vector<float>& stats, const std::vector<bf16>& dout,
                     std::vector<bf16>* dqkv, bool stored_ds = false) {
  const int B = pr.B, T = pr.T, NH = pr.NH, C = pr.C(), Tp = PaddedT(T);
  const size_t n_rows = size_t(B) * NH * Tp;
  std::vector<float> Dp(n_rows, NAN), lse2(n_rows, NAN);
  const float scale = 1.f / std::sqrt(float(HS)), scale_log2 = scale * kLog2e;
  float *pD = Dp.data(), *pL = lse2.data();
  const bf16 *pq = qkv.data(), *po = out.data(), *pdo = dout.data();
  const float* ps = stats.data();
  bf16* pdq = dqkv->data();
  Launch(dim3(unsigned((n_rows + 7) / 8)), 256, 0,
         [=] { PreprocessKernel<HS>(pD, pL, pdo, po, ps, B, T, Tp, C, NH); });
  using KV = Sm90BwdCfg<HS>;
  if (stored_ds) {
    // Poisoned: a block the dQ kernel reads and the dK/dV kernel did not write gives NaN.
    std::vector<unsigned char> ds(DsBufferBytes(B, NH, T), 0xff);
    unsigned char* pds = ds.data();
    Launch(dim3(B * NH, (T + KV::kBkv - 1) / KV::kBkv), KV::kThreads, KV::kSmemBytesStoreDs, [=] {
      FlashBackwardKVSm90Kernel<HS, true>(pdq, pdo, pq, pL, pD, T, Tp, C, NH, scale, scale_log2,
                                          pds);
    });
    using DC = Sm90DqCfg<HS>;
    Launch(dim3(B * NH, (T + DC::kBq - 1) / DC::kBq), DC::kThreads, DC::kSmemBytes,
           [=] { FlashBackwardDqFromDsSm90Kernel<HS>(pdq, pq, pds, T, C, NH, scale); });
    return;
  }
  Launch(dim3(B * NH, (T + KV::kBkv - 1) / KV::kBkv), KV::kThreads, KV::kSmemBytes, [=] {
    FlashBackwardKVSm90Kernel<HS>(pdq, pdo, pq, pL, pD, T, Tp, C, NH, scale, scale_log2);
  });
  using QC = Sm90QCfg<HS>;
  Launch(dim3(B * NH, (T + QC::kBq - 1) / QC::kBq), QC::kThreads, QC::kSmemBytes, [=] {
    FlashBackwardQSm90Kernel<HS>(pdq, pdo, pq, pL, pD, T, Tp, C, NH, scale, scale_log2);
  });
}

enum class Schedule { kLockstepLazyCopies, kGreedyEagerCopies, kGreedyLazyCopies };
enum class Kernels { kMmaSync, kWgmma, kWgmmaStoredDs, kWgmmaPipelined };

template <int HS>
void Check(const Problem& pr, Schedule schedule, uint32_t seed,
           Kernels kernels = Kernels::kMmaSync) {
  const bool sm90 = kernels != Kernels::kMmaSync;
  const bool stored_ds = kernels == Kernels::kWgmmaStoredDs;
  SCOPED_TRACE(testing::Message() << "B=" << pr.B << " T=" << pr.T << " NH=" << pr.NH
                                  << " HS=" << HS << " schedule " << int(schedule)
                                  << (sm90 ? " wgmma" : " mma.sync")
                                  << (stored_ds ? " stored dS" : ""));
  emu::g_greedy = schedule != Schedule::kLockstepLazyCopies;
  emu::g_eager_copies = schedule == Schedule::kGreedyEagerCopies;
  emu::g_late_products = false;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int C = pr.C();
  std::vector<float> qkv(size_t(pr.B) * pr.T * 3 * C), dout(size_t(pr.B) * pr.T * C);
  for (auto& x : qkv) x = RoundBF16(nd(rng));
  for (auto& x : dout) x = RoundBF16(nd(rng));
  std::vector<double> ref_out, ref_lse, ref_dqkv;
  Reference(pr, qkv, dout, &ref_out, &ref_lse, &ref_dqkv);

  const bf16 nan = __float2bfloat16(NAN);
  const std::vector<bf16> qkv_b = ToBf16(qkv), dout_b = ToBf16(dout);
  std::vector<bf16> out(size_t(pr.B) * pr.T * C, nan);
  std::vector<float> stats(size_t(pr.B) * pr.NH * pr.T, NAN);
  if (kernels == Kernels::kWgmmaPipelined) {
    // The pipelined forward reorders the same operations: bit for bit the plain one's outputs,
    // with the products run when their wait retires them and run late (every other warp first,
    // so a K or V slot refilled before the products reading it retire would show).
    std::vector<bf16> plain(out.size(), nan);
    std::vector<float> plain_stats(stats.size(), NAN);
    RunForwardSm90<HS>(pr, qkv_b, &plain, &plain_stats);
    for (bool late : {false, true}) {
      SCOPED_TRACE(late ? "pipelined, late products" : "pipelined");
      emu::g_late_products = late;
      std::fill(out.begin(), out.end(), nan);
      std::fill(stats.begin(), stats.end(), NAN);
      RunForwardSm90<HS>(pr, qkv_b, &out, &stats, /*pipelined=*/true);
      EXPECT_EQ(std::memcmp(plain.data(), out.data(), out.size() * sizeof(bf16)), 0) << "out";
      EXPECT_EQ(std::memcmp(plain_stats.data(), stats.data(), stats.size() * sizeof(float)), 0)
          << "stats";
    }
    emu::g_late_products = false;
  } else if (sm90) {
    RunForwardSm90<HS>(pr, qkv_b, &out, &stats);
  } else {
    RunForward<HS>(pr, qkv_b, &out, &stats);
  }
  const auto f16 = [](bf16 x) { return double(__bfloat162float(x)); };
  const auto f32 = [](float x) { return double(x); };
  EXPECT_LT(RelErr(out, ref_out, f16), 1e-2) << "out";
  EXPECT_LT(RelErr(stats, ref_lse, f32), 1e-4) << "stats";

  for (bool deterministic : {true, false}) {
    if (sm90 && !deterministic) continue;  // one path for both modes there
    SCOPED_TRACE(deterministic ? "deterministic" : "atomic dQ");
    std::vector<bf16> dqkv(qkv.size(), nan);
    if (sm90) {
      RunBackwardSm90<HS>(pr, qkv_b, out, stats, dout_b, &dqkv, stored_ds);
    } else {
      RunBackward<HS>(pr, qkv_b, out, stats, dout_b, deterministic, &dqkv);
    }
    // At T = 1 dQ and dK are exactly zero and a relative error against them means nothing
    // (the kernels leave ~1e-7 from dP − D): such a part must be tiny on the whole gradient's
    // scale instead, as in cuda_ops_test.
    double all = 0;
    for (double x : ref_dqkv) all += x * x;
    for (int part = 0; part < 3; ++part) {
      double want = 0, got = 0;
      for (size_t r = 0; r < size_t(pr.B) * pr.T; ++r) {
        for (int c = 0; c < C; ++c) {
          const size_t i = r * 3 * C + part * C + c;
          want += ref_dqkv[i] * ref_dqkv[i];
          const double g = f16(dqkv[i]);
          got += std::isfinite(g) ? g * g : INFINITY;
        }
      }
      if (std::sqrt(want) < 1e-4 * std::sqrt(all)) {
        EXPECT_LT(std::sqrt(got), 1e-3 * std::sqrt(all)) << "d"
                                                         << "qkv"[part] << " (zero)";
      } else {
        EXPECT_LT(RelErr(dqkv, ref_dqkv, f16, part * C, 3 * C, C), 2e-2) << "d"
                                                                         << "qkv"[part];
      }
    }
  }
}

constexpr Schedule kAllSchedules[] = {Schedule::kLockstepLazyCopies, Schedule::kGreedyEagerCopies,
                                      Schedule::kGreedyLazyCopies};

TEST(AttentionEmulationTest, Head64) {
  for (Schedule s : kAllSchedules) {
    Check<64>({2, 37, 2, 64}, s, 1);
    Check<64>({1, 200, 1, 64}, s, 2);
  }
  Check<64>({1, 1, 1, 64}, Schedule::kGreedyEagerCopies, 3);
  Check<64>({1, 128, 1, 64}, Schedule::kGreedyLazyCopies, 4);
}

TEST(AttentionEmulationTest, Head128) {
  for (Schedule s : kAllSchedules) Check<128>({1, 150, 2, 128}, s, 5);
  Check<128>({1, 64, 1, 128}, Schedule::kGreedyEagerCopies, 6);
}

// The sm_90a kernels (wgmma): tiles of 128 queries / 64 keys forward and 128 keys × 128 (head
// size 64) or 64 (128) queries backward, so T covers one row, partial tiles, exact multiples and
// the backward's half-diagonal steps.
TEST(AttentionEmulationTest, Head64Wgmma) {
  for (Schedule s : kAllSchedules) Check<64>({2, 37, 2, 64}, s, 11, Kernels::kWgmma);
  Check<64>({1, 200, 1, 64}, Schedule::kGreedyLazyCopies, 12, Kernels::kWgmma);
  Check<64>({1, 1, 1, 64}, Schedule::kGreedyEagerCopies, 13, Kernels::kWgmma);
  Check<64>({1, 256, 1, 64}, Schedule::kLockstepLazyCopies, 14, Kernels::kWgmma);
}

TEST(AttentionEmulationTest, Head128Wgmma) {
  for (Schedule s : kAllSchedules) Check<128>({1, 150, 2, 128}, s, 15, Kernels::kWgmma);
  Check<128>({1, 64, 1, 128}, Schedule::kGreedyEagerCopies, 16, Kernels::kWgmma);
  Check<128>({2, 1, 1, 128}, Schedule::kGreedyLazyCopies, 17, Kernels::kWgmma);
}

// The pipelined wgmma forward (attention_fwd_sm90_pipelined.cuh): one tile, a warpgroup with
// no rows, partial and whole tiles, several query tiles (the first warpgroup's extra iteration
// past its last tile).
TEST(AttentionEmulationTest, Head64WgmmaPipelined) {
  for (Schedule s : kAllSchedules) Check<64>({2, 37, 2, 64}, s, 41, Kernels::kWgmmaPipelined);
  Check<64>({1, 1, 1, 64}, Schedule::kGreedyEagerCopies, 42, Kernels::kWgmmaPipelined);
  Check<64>({1, 200, 1, 64}, Schedule::kGreedyLazyCopies, 43, Kernels::kWgmmaPipelined);
  Check<64>({1, 256, 1, 64}, Schedule::kLockstepLazyCopies, 44, Kernels::kWgmmaPipelined);
}

TEST(AttentionEmulationTest, Head128WgmmaPipelined) {
  for (Schedule s : kAllSchedules) Check<128>({1, 150, 2, 128}, s, 45, Kernels::kWgmmaPipelined);
  Check<128>({1, 64, 1, 128}, Schedule::kGreedyEagerCopies, 46, Kernels::kWgmmaPipelined);
  Check<128>({2, 1, 1, 128}, Schedule::kGreedyLazyCopies, 47, Kernels::kWgmmaPipelined);
  Check<128>({1, 320, 1, 128}, Schedule::kLockstepLazyCopies, 48, Kernels::kWgmmaPipelined);
}

// The stored-dS backward (AttentionDq::kStoredDs): T covers one row, one partial block, the
// head-64 dK/dV kernel's half-diagonal first query tile, a dQ tile whose second warpgroup has no
// rows (T <= 64 mod 128) and exact multiples; the poisoned dS buffer catches an unwritten block.
TEST(AttentionEmulationTest, Head64WgmmaStoredDs) {
  for (Schedule s : kAllSchedules) Check<64>({2, 37, 2, 64}, s, 31, Kernels::kWgmmaStoredDs);
  Check<64>({1, 200, 1, 64}, Schedule::kGreedyLazyCopies, 32, Kernels::kWgmmaStoredDs);
  Check<64>({1, 1, 1, 64}, Schedule::kGreedyEagerCopies, 33, Kernels::kWgmmaStoredDs);
  Check<64>({1, 256, 1, 64}, Schedule::kLockstepLazyCopies, 34, Kernels::kWgmmaStoredDs);
  Check<64>({1, 320, 1, 64}, Schedule::kGreedyEagerCopies, 35, Kernels::kWgmmaStoredDs);
}

TEST(AttentionEmulationTest, Head128WgmmaStoredDs) {
  for (Schedule s : kAllSchedules) Check<128>({1, 150, 2, 128}, s, 36, Kernels::kWgmmaStoredDs);
  Check<128>({1, 64, 1, 128}, Schedule::kGreedyEagerCopies, 37, Kernels::kWgmmaStoredDs);
  Check<128>({2, 1, 1, 128}, Schedule::kGreedyLazyCopies, 38, Kernels::kWgmmaStoredDs);
  Check<128>({1, 192, 1, 128}, Schedule::kLockstepLazyCopies, 39, Kernels::kWgmmaStoredDs);
}

// The wgmma forward with the FP8 cast of its output (the projection's input in FP8 training):
// the same BF16 output and statistics as without it, and the codes, amax and counters CastFp8
// (the CPU backend's, on that output) gives. Some columns of V are tiny, so their outputs
// flush to zero; the scale saturates the largest outputs.
template <int HS>
void CheckFp8Cast(const Problem& pr, Schedule schedule, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "B=" << pr.B << " T=" << pr.T << " NH=" << pr.NH
                                  << " HS=" << HS << " schedule " << int(schedule) << " FP8 cast");
  emu::g_greedy = schedule != Schedule::kLockstepLazyCopies;
  emu::g_eager_copies = schedule == Schedule::kGreedyEagerCopies;
  emu::g_late_products = false;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int C = pr.C(), rows = pr.B * pr.T;
  std::vector<bf16> qkv(size_t(rows) * 3 * C);
  for (size_t i = 0; i < qkv.size(); ++i) {
    const bool tiny_v = int(i % (3 * C)) >= 2 * C && int(i % (3 * C)) % HS < 4;
    qkv[i] = __float2bfloat16(nd(rng) * (tiny_v ? 1e-7f : 1.f));
  }
  std::vector<bf16> plain(size_t(rows) * C), fused(plain.size());
  std::vector<float> plain_stats(size_t(pr.B) * pr.NH * pr.T), fused_stats(plain_stats.size());
  RunForwardSm90<HS>(pr, qkv, &plain, &plain_stats);
  float top = 0;
  for (const bf16& x : plain) top = std::max(top, std::fabs(__bfloat162float(x)));
  const float scale = 448.f / (0.6f * top);
  std::vector<uint8_t> codes(plain.size(), 0x7f);
  float amax = 0;
  unsigned long long counts[3] = {0, 0, 0};
  RunForwardSm90Fp8<HS>(pr, qkv, &fused, &fused_stats, &codes, scale, &amax, counts);
  ASSERT_EQ(std::memcmp(plain.data(), fused.data(), plain.size() * 2), 0) << "BF16 output";
  ASSERT_EQ(std::memcmp(plain_stats.data(), fused_stats.data(), plain_stats.size() * 4), 0);
  std::vector<float> x(plain.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = __bfloat162float(plain[i]);
  std::vector<uint8_t> want(plain.size());
  float want_amax = 0;
  uint64_t want_counts[3] = {0, 0, 0};
  cpu::CastFp8(want.data(), nullptr, x.data(), rows, C, Fp8Format::kE4M3, &scale, &want_amax,
               want_counts);
  size_t first = 0;
  while (first < want.size() && want[first] == codes[first]) ++first;
  EXPECT_EQ(first, want.size()) << "codes differ first at " << first / C << "," << first % C;
  EXPECT_EQ(amax, want_amax);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(counts[k], want_counts[k]) << "counter " << k;
  EXPECT_GT(want_counts[0], 0u) << "nothing saturated";
  EXPECT_GT(want_counts[1], 0u) << "nothing flushed to zero";
  // The pipelined forward's cast: the same bytes and statistics.
  std::vector<bf16> piped(plain.size());
  std::vector<float> piped_stats(plain_stats.size());
  std::vector<uint8_t> piped_codes(plain.size(), 0x7f);
  float piped_amax = 0;
  unsigned long long piped_counts[3] = {0, 0, 0};
  RunForwardSm90Fp8<HS>(pr, qkv, &piped, &piped_stats, &piped_codes, scale, &piped_amax,
                        piped_counts, /*pipelined=*/true);
  EXPECT_EQ(std::memcmp(plain.data(), piped.data(), plain.size() * 2), 0) << "pipelined output";
  EXPECT_EQ(std::memcmp(plain_stats.data(), piped_stats.data(), plain_stats.size() * 4), 0);
  EXPECT_EQ(std::memcmp(codes.data(), piped_codes.data(), codes.size()), 0) << "pipelined codes";
  EXPECT_EQ(piped_amax, amax);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(piped_counts[k], counts[k]) << "pipelined counter " << k;
}

TEST(AttentionEmulationTest, WgmmaForwardCastsItsOutputToFp8) {
  for (Schedule s : kAllSchedules) CheckFp8Cast<64>({2, 150, 2, 64}, s, 21);
  CheckFp8Cast<128>({1, 100, 2, 128}, Schedule::kGreedyLazyCopies, 22);
}

}  // namespace
}  // namespace boulder::kernels::cuda::attn
