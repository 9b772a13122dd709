// Every CUDA op against the CPU reference backend on fresh random inputs (rounded to BF16 so
// both backends see the same values), outputs poisoned with NaN first so unwritten elements
// fail. Tolerance: relative L2 error (‖cuda − cpu‖ / ‖cpu‖) below 1e-2 for BF16 outputs of
// FP32-accumulated ops (2e-2 for gradients that pass through two BF16 roundings).
// Skips, saying so, when no CUDA device is present.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/ops.h"
#include "kernels/split_master.h"

namespace boulder::kernels::cuda {
namespace {

float RoundBF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  x &= 0xffff0000u;
  std::memcpy(&f, &x, 4);
  return f;
}

std::vector<float> Random(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = RoundBF16(d(rng));
  return v;
}

double RelErr(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// A buffer on both backends, uploaded from the same host values.
struct Pair {
  Backend* cpu;
  Backend* gpu;
  size_t n;
  DType gdt;
  void* c = nullptr;
  void* g = nullptr;
  Pair(Backend* cpu_, Backend* gpu_, size_t n_, DType gdt_ = DType::kBF16)
      : cpu(cpu_), gpu(gpu_), n(n_), gdt(gdt_) {
    c = *cpu->Alloc(n * 4);
    g = *gpu->Alloc(n * DTypeSize(gdt));
    Poison();
  }
  ~Pair() {
    cpu->Free(c);
    gpu->Free(g);
  }
  void Set(const std::vector<float>& v) {
    cpu->CopyFromHostF32(c, DType::kF32, v.data(), n);
    gpu->CopyFromHostF32(g, gdt, v.data(), n);
  }
  void Poison() {
    std::vector<float> nan(n, NAN);
    cpu->CopyFromHostF32(c, DType::kF32, nan.data(), n);
    gpu->CopyFromHostF32(g, gdt, nan.data(), n);
  }
  std::vector<float> Cpu() {
    std::vector<float> v(n);
    cpu->CopyToHostF32(v.data(), c, DType::kF32, n);
    return v;
  }
  std::vector<float> Gpu() {
    std::vector<float> v(n);
    gpu->CopyToHostF32(v.data(), g, gdt, n);
    return v;
  }
  float* cf() { return static_cast<float*>(c); }
  float* gf() { return static_cast<float*>(g); }
};

// Integer tokens on both backends.
struct Tokens {
  Backend* cpu;
  Backend* gpu;
  int32_t* c;
  int32_t* g;
  Tokens(Backend* cpu_, Backend* gpu_, const std::vector<int32_t>& v) : cpu(cpu_), gpu(gpu_) {
    c = static_cast<int32_t*>(*cpu->Alloc(v.size() * 4));
    g = static_cast<int32_t*>(*gpu->Alloc(v.size() * 4));
    cpu->CopyFromHost(c, v.data(), v.size() * 4);
    gpu->CopyFromHost(g, v.data(), v.size() * 4);
  }
  ~Tokens() {
    cpu->Free(c);
    gpu->Free(g);
  }
};

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = CudaBackend::Create(0);
    if (!b.ok()) GTEST_SKIP() << "no usable CUDA device: " << b.status().message();
    gpu_ = std::move(*b);
    cpu_ = NewCpuBackend(2);
    rng_.seed(::testing::UnitTest::GetInstance()->random_seed() + 17);
  }
  void TearDown() override {
    if (gpu_) {
      ASSERT_TRUE(gpu_->Synchronize().ok()) << gpu_->Synchronize();
    }
  }
  void ExpectClose(Pair& p, double tol, const char* what) {
    ASSERT_TRUE(gpu_->Synchronize().ok()) << gpu_->Synchronize();
    double e = RelErr(p.Gpu(), p.Cpu());
    EXPECT_LT(e, tol) << what;
  }
  void LayerNormCase(int N, int C);
  void EncoderCase(int B, int T, int C, int distinct);
  std::unique_ptr<CudaBackend> gpu_;
  std::unique_ptr<Backend> cpu_;
  std::mt19937 rng_;
};

// The replica checksum reduced on the device equals the host's, for sizes with and without a
// partial last word, from an aligned and an unaligned (host-copy fallback) start.
TEST_F(CudaOpsTest, ChecksumMatchesTheHost) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{6}, size_t{4096}, size_t{1000003},
                       size_t{(64u << 20) + 2}}) {
    std::vector<uint8_t> host(bytes + 1);
    for (uint8_t& b : host) b = static_cast<uint8_t>(rng_());
    absl::StatusOr<void*> d = gpu_->Alloc(bytes + 1);
    ASSERT_TRUE(d.ok()) << d.status();
    gpu_->CopyFromHost(*d, host.data(), host.size());
    absl::StatusOr<uint64_t> got = gpu_->Checksum(*d, bytes);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, ChecksumHost(host.data(), bytes)) << bytes << " bytes";
    got = gpu_->Checksum(static_cast<uint8_t*>(*d) + 1, bytes);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, ChecksumHost(host.data() + 1, bytes)) << bytes << " bytes, unaligned";
    gpu_->Free(*d);
  }
}

// A Scratch counts what it holds into its DeviceBytes: a grown buffer replaces the old one
// (freed first, so the peak is the larger), retired buffers stay counted until destruction.
TEST_F(CudaOpsTest, ScratchCountsItsBytes) {
  DeviceBytes count;
  {
    Scratch s(&count);
    ASSERT_NE(s.Get(1000), nullptr);
    EXPECT_EQ(count.live, 1000);
    ASSERT_NE(s.Get(500), nullptr);
    EXPECT_EQ(count.live, 1000);
    ASSERT_NE(s.Get(3000), nullptr);
    EXPECT_EQ(count.live, 3000);
    EXPECT_EQ(count.peak, 3000);
    s.keep_retired();
    ASSERT_NE(s.Get(5000), nullptr);
    EXPECT_EQ(count.live, 8000);
    EXPECT_EQ(count.peak, 8000);
  }
  EXPECT_EQ(count.live, 0);
  EXPECT_EQ(count.peak, 8000);
}

// The backend's memory report counts its Alloc buffers, the kernels' scratch and cuBLASLt's
// workspaces as allocated (PyTorch's max_memory_allocated counts its temporaries too).
TEST_F(CudaOpsTest, MemoryStatsCountScratchAndWorkspaces) {
  auto b = CudaBackend::Create(0);
  ASSERT_TRUE(b.ok()) << b.status();
  const int64_t workspaces =
      LtMatmul::kWorkspaces * static_cast<int64_t>(LtMatmul::kWorkspaceBytes);
  const MemoryStats empty = (*b)->GetMemoryStats();
  EXPECT_EQ(empty.allocated_bytes, workspaces);
  EXPECT_EQ(empty.peak_bytes, workspaces);
  absl::StatusOr<void*> d = (*b)->Alloc(1 << 20);
  ASSERT_TRUE(d.ok()) << d.status();
  (*b)->Memset0(*d, 1 << 20);
  EXPECT_EQ((*b)->GetMemoryStats().allocated_bytes, workspaces + (1 << 20));
  // The checksum's one 8-byte sum is the backend's first scratch.
  ASSERT_TRUE((*b)->Checksum(*d, 1 << 20).ok());
  MemoryStats m = (*b)->GetMemoryStats();
  EXPECT_EQ(m.allocated_bytes, workspaces + (1 << 20) + 8);
  EXPECT_EQ(m.peak_bytes, m.allocated_bytes);
  EXPECT_EQ(m.reserved_bytes, m.allocated_bytes);
  (*b)->Free(*d);
  m = (*b)->GetMemoryStats();
  EXPECT_EQ(m.allocated_bytes, workspaces + 8);
  EXPECT_EQ(m.peak_bytes, workspaces + (1 << 20) + 8);
}

// Token runs (positions sharing a token, summed by one block) of about 13 rows, of hundreds
// (longer than the block's window for finding a run's end), and widths over one block's 128
// column groups.
TEST_F(CudaOpsTest, Encoder) {
  struct Case {
    int B, T, C, distinct;
  };
  for (const Case& k : {Case{4, 64, 64, 20}, Case{8, 256, 200, 3}, Case{2, 128, 1040, 5}}) {
    SCOPED_TRACE(testing::Message() << "B " << k.B << " T " << k.T << " C " << k.C);
    EncoderCase(k.B, k.T, k.C, k.distinct);
  }
}

void CudaOpsTest::EncoderCase(int B, int T, int C, int distinct) {
  const int V = 96;
  std::vector<int32_t> tok(B * T);
  for (auto& t : tok) t = rng_() % distinct;  // many repeats: exercises the run summation
  Tokens tokens(cpu_.get(), gpu_.get(), tok);
  Pair wte(cpu_.get(), gpu_.get(), V * C), wpe(cpu_.get(), gpu_.get(), T * C),
      out(cpu_.get(), gpu_.get(), B * T * C);
  wte.Set(Random(V * C, rng_));
  wpe.Set(Random(T * C, rng_));
  cpu_->EncoderForward(out.c, tokens.c, wte.c, wpe.c, B, T, C);
  gpu_->EncoderForward(out.g, tokens.g, wte.g, wpe.g, B, T, C);
  ExpectClose(out, 1e-2, "encoder forward");
  Pair dout(cpu_.get(), gpu_.get(), B * T * C);
  dout.Set(Random(B * T * C, rng_));
  wte.Set(Random(V * C, rng_));  // gradients accumulate into existing values
  wpe.Set(Random(T * C, rng_));
  cpu_->EncoderBackward(wte.c, wpe.c, dout.c, tokens.c, B, T, C);
  gpu_->EncoderBackward(wte.g, wpe.g, dout.g, tokens.g, B, T, C);
  ExpectClose(wte, 1e-2, "dwte");
  ExpectClose(wpe, 1e-2, "dwpe");
}

// C 1024, 2048 and 4096: the one-pass block backward; 256 and 768: the warp-per-row one-pass
// backward; 200: the two-kernel backward, also the reference kernels' path
// (SetLayerNormReferenceKernels) for 1024 and 2048. N = 300 and 33 end in chunks shorter than a
// block's 32 rows and than a pass's 4 rows.
TEST_F(CudaOpsTest, LayerNorm) {
  for (const int C : {768, 256, 2048, 1024, 200}) LayerNormCase(300, C);
  LayerNormCase(33, 4096);
  LayerNormCase(301, 2048);
  SetLayerNormReferenceKernels(true);
  for (const int C : {2048, 1024}) LayerNormCase(300, C);
  SetLayerNormReferenceKernels(false);
}

void CudaOpsTest::LayerNormCase(int N, int C) {
  SCOPED_TRACE(absl::StrCat("N ", N, " C ", C));
  Pair inp(cpu_.get(), gpu_.get(), N * C), w(cpu_.get(), gpu_.get(), C),
      b(cpu_.get(), gpu_.get(), C), out(cpu_.get(), gpu_.get(), N * C);
  Pair mean(cpu_.get(), gpu_.get(), N, DType::kF32), rstd(cpu_.get(), gpu_.get(), N, DType::kF32);
  inp.Set(Random(N * C, rng_, 2.f));
  w.Set(Random(C, rng_));
  b.Set(Random(C, rng_));
  cpu_->LayerNormForward(out.c, mean.cf(), rstd.cf(), inp.c, w.c, b.c, N, C);
  gpu_->LayerNormForward(out.g, mean.gf(), rstd.gf(), inp.g, w.g, b.g, N, C);
  ExpectClose(out, 1e-2, "layernorm out");
  ExpectClose(mean, 1e-4, "mean");
  ExpectClose(rstd, 1e-4, "rstd");
  Pair dout(cpu_.get(), gpu_.get(), N * C), dinp(cpu_.get(), gpu_.get(), N * C),
      dw(cpu_.get(), gpu_.get(), C), db(cpu_.get(), gpu_.get(), C);
  dout.Set(Random(N * C, rng_));
  const std::vector<float> dinp0 = Random(N * C, rng_), dw0 = Random(C, rng_),
                           db0 = Random(C, rng_);
  dinp.Set(dinp0);
  dw.Set(dw0);
  db.Set(db0);
  cpu_->LayerNormBackward(dinp.c, dw.c, db.c, dout.c, inp.c, w.c, mean.cf(), rstd.cf(), N, C);
  gpu_->LayerNormBackward(dinp.g, dw.g, db.g, dout.g, inp.g, w.g, mean.gf(), rstd.gf(), N, C);
  ExpectClose(dinp, 2e-2, "layernorm dinp");
  ExpectClose(dw, 2e-2, "layernorm dweight");
  ExpectClose(db, 2e-2, "layernorm dbias");
  // Deterministic: the same inputs give the same bits.
  const std::vector<float> first[3] = {dinp.Gpu(), dw.Gpu(), db.Gpu()};
  dinp.Set(dinp0);
  dw.Set(dw0);
  db.Set(db0);
  gpu_->LayerNormBackward(dinp.g, dw.g, db.g, dout.g, inp.g, w.g, mean.gf(), rstd.gf(), N, C);
  EXPECT_EQ(dinp.Gpu(), first[0]) << "dinp differs between two runs";
  EXPECT_EQ(dw.Gpu(), first[1]) << "dweight differs between two runs";
  EXPECT_EQ(db.Gpu(), first[2]) << "dbias differs between two runs";
}

TEST_F(CudaOpsTest, MatmulWithEpilogues) {
  const int N = 256, C = 128, OC = 384;
  for (Epilogue ep : {Epilogue::kNone, Epilogue::kGelu}) {
    Pair inp(cpu_.get(), gpu_.get(), N * C), w(cpu_.get(), gpu_.get(), OC * C),
        bias(cpu_.get(), gpu_.get(), OC), out(cpu_.get(), gpu_.get(), N * OC),
        pre(cpu_.get(), gpu_.get(), N * OC);
    inp.Set(Random(N * C, rng_));
    w.Set(Random(OC * C, rng_, 0.1f));
    bias.Set(Random(OC, rng_));
    bool gelu = ep == Epilogue::kGelu;
    cpu_->MatmulForward(out.c, gelu ? pre.c : nullptr, inp.c, w.c, bias.c, N, C, OC, ep);
    gpu_->MatmulForward(out.g, gelu ? pre.g : nullptr, inp.g, w.g, bias.g, N, C, OC, ep);
    ExpectClose(out, 1e-2, gelu ? "gelu out" : "matmul out");
    if (gelu) ExpectClose(pre, 1e-2, "pre-gelu");
    Pair dout(cpu_.get(), gpu_.get(), N * OC), dinp(cpu_.get(), gpu_.get(), N * C),
        dw(cpu_.get(), gpu_.get(), OC * C), db(cpu_.get(), gpu_.get(), OC);
    dout.Set(Random(N * OC, rng_));
    dw.Set(Random(OC * C, rng_));
    db.Set(Random(OC, rng_));
    cpu_->MatmulBackward(dinp.c, dw.c, db.c, dout.c, gelu ? pre.c : nullptr, inp.c, w.c, N, C, OC);
    gpu_->MatmulBackward(dinp.g, dw.g, db.g, dout.g, gelu ? pre.g : nullptr, inp.g, w.g, N, C, OC);
    ExpectClose(dinp, 2e-2, "dinp");
    ExpectClose(dw, 2e-2, "dweight");
    ExpectClose(db, 2e-2, "dbias");
  }
}

// Our Hopper BF16 GEMM (bf16_gemm_sm90.h) through MatmulForward, every tile, with and without
// the bias and the GELU epilogue, against the CPU backend; shapes with more tiles than SMs (the
// persistent schedule's later rounds) and a column count not a multiple of 256 (kN256 falls back
// to 128). Each call is run twice: the same bits both times. Skips off sm_90.
TEST_F(CudaOpsTest, OwnBf16GemmForward) {
  if (!Bf16GemmSm90Available()) GTEST_SKIP() << "our BF16 GEMM needs an sm_90 GPU";
  struct Shape {
    int N, C, OC;
  };
  for (Shape sh : {Shape{2048, 256, 1536}, Shape{256, 192, 384}, Shape{1024, 768, 3072}}) {
    const int N = sh.N, C = sh.C, OC = sh.OC;
    Pair inp(cpu_.get(), gpu_.get(), size_t(N) * C), w(cpu_.get(), gpu_.get(), size_t(OC) * C),
        bias(cpu_.get(), gpu_.get(), OC), out(cpu_.get(), gpu_.get(), size_t(N) * OC),
        pre(cpu_.get(), gpu_.get(), size_t(N) * OC);
    inp.Set(Random(inp.n, rng_));
    w.Set(Random(w.n, rng_, 1.f / std::sqrt(float(C))));
    bias.Set(Random(OC, rng_));
    for (Bf16GemmTile tile : {Bf16GemmTile::kAuto, Bf16GemmTile::kN256, Bf16GemmTile::kN128,
                              Bf16GemmTile::kPingPong}) {
      for (Epilogue ep : {Epilogue::kNone, Epilogue::kGelu}) {
        for (bool with_bias : {true, false}) {
          SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C << " OC=" << OC << " tile="
                                          << int(tile) << " gelu=" << (ep == Epilogue::kGelu)
                                          << " bias=" << with_bias);
          const bool gelu = ep == Epilogue::kGelu;
          out.Poison();
          pre.Poison();
          gpu_->set_bf16_gemm(CudaBackend::Bf16Gemm::kSm90, tile);
          cpu_->MatmulForward(out.c, gelu ? pre.c : nullptr, inp.c, w.c,
                              with_bias ? bias.c : nullptr, N, C, OC, ep);
          gpu_->MatmulForward(out.g, gelu ? pre.g : nullptr, inp.g, w.g,
                              with_bias ? bias.g : nullptr, N, C, OC, ep);
          ExpectClose(out, 1e-2, gelu ? "gelu out" : "matmul out");
          if (gelu) ExpectClose(pre, 1e-2, "pre-gelu");
          const std::vector<float> first_out = out.Gpu(), first_pre = pre.Gpu();
          out.Poison();
          pre.Poison();
          gpu_->MatmulForward(out.g, gelu ? pre.g : nullptr, inp.g, w.g,
                              with_bias ? bias.g : nullptr, N, C, OC, ep);
          ASSERT_TRUE(gpu_->Synchronize().ok()) << gpu_->Synchronize();
          EXPECT_TRUE(out.Gpu() == first_out) << "output differs between two runs";
          if (gelu) EXPECT_TRUE(pre.Gpu() == first_pre) << "pre-activation differs between two runs";
        }
      }
    }
    gpu_->set_bf16_gemm(CudaBackend::Bf16Gemm::kAuto);
  }
}

// Forward and backward against the CPU reference, with the backward run in both modes:
// deterministic (two kernels, checked bit-identical over two runs) and atomic dQ.
void AttentionCase(Backend* cpu, CudaBackend* gpu, std::mt19937& rng, int B, int T, int NH,
                   int HS) {
  SCOPED_TRACE(testing::Message() << "B=" << B << " T=" << T << " NH=" << NH << " HS=" << HS);
  const int C = NH * HS;
  Pair qkv(cpu, gpu, size_t(B) * T * 3 * C), out(cpu, gpu, size_t(B) * T * C),
      stats(cpu, gpu, size_t(B) * NH * T, DType::kF32);
  qkv.Set(Random(qkv.n, rng));
  cpu->AttentionForward(out.c, stats.cf(), qkv.c, B, T, C, NH);
  gpu->AttentionForward(out.g, stats.gf(), qkv.g, B, T, C, NH);
  ASSERT_TRUE(gpu->Synchronize().ok()) << gpu->Synchronize();
  EXPECT_LT(RelErr(out.Gpu(), out.Cpu()), 1e-2) << "attention out";
  EXPECT_LT(RelErr(stats.Gpu(), stats.Cpu()), 1e-3) << "attention stats";
  Pair dout(cpu, gpu, out.n), dqkv(cpu, gpu, qkv.n);
  dout.Set(Random(dout.n, rng));
  cpu->AttentionBackward(dqkv.c, dout.c, qkv.c, out.c, stats.cf(), B, T, C, NH);
  const std::vector<float> want = dqkv.Cpu();
  for (bool deterministic : {true, false}) {
    SCOPED_TRACE(deterministic ? "deterministic" : "atomic dQ");
    gpu->SetDeterministic(deterministic);
    dqkv.Poison();
    gpu->AttentionBackward(dqkv.g, dout.g, qkv.g, out.g, stats.gf(), B, T, C, NH);
    ASSERT_TRUE(gpu->Synchronize().ok()) << gpu->Synchronize();
    std::vector<float> first = dqkv.Gpu();
    EXPECT_LT(RelErr(first, want), 2e-2) << "attention dqkv";
    // dQ, dK and dV each on their own: one wrong part must not hide behind the others.
    for (int part = 0; part < 3; ++part) {
      std::vector<float> g, w;
      for (size_t r = 0; r < size_t(B) * T; ++r) {
        for (int c = 0; c < C; ++c) {
          g.push_back(first[r * 3 * C + part * C + c]);
          w.push_back(want[r * 3 * C + part * C + c]);
        }
      }
      // With T=1 every query sees one key: dQ and dK are exactly zero, and a relative error
      // against a zero reference means nothing. Such a part must stay tiny on the scale of
      // the whole gradient instead.
      double part_norm = 0, g_norm = 0, all_norm = 0;
      for (float x : w) part_norm += double(x) * x;
      for (float x : g) g_norm += double(x) * x;
      for (float x : want) all_norm += double(x) * x;
      if (std::sqrt(part_norm) < 1e-4 * std::sqrt(all_norm)) {
        EXPECT_LT(std::sqrt(g_norm), 1e-3 * std::sqrt(all_norm))
            << "d"
            << "qkv"[part] << " (zero reference)";
      } else {
        EXPECT_LT(RelErr(g, w), 2e-2) << "d"
                                      << "qkv"[part];
      }
    }
    if (deterministic) {
      dqkv.Poison();
      gpu->AttentionBackward(dqkv.g, dout.g, qkv.g, out.g, stats.gf(), B, T, C, NH);
      ASSERT_TRUE(gpu->Synchronize().ok());
      EXPECT_EQ(0, std::memcmp(first.data(), dqkv.Gpu().data(), first.size() * 4))
          << "deterministic backward differs between two runs";
    }
  }
  gpu->SetDeterministic(false);
}

// T around the kernels' tiles (64 keys / 128 queries forward, 128 keys × 64 or 32 queries
// backward): one row, partial tiles, exact multiples, and many tiles.
TEST_F(CudaOpsTest, AttentionHead64) {
  for (int T : {1, 37, 64, 129, 200, 384}) AttentionCase(cpu_.get(), gpu_.get(), rng_, 2, T, 3, 64);
  AttentionCase(cpu_.get(), gpu_.get(), rng_, 1, 1024, 2, 64);
}
TEST_F(CudaOpsTest, AttentionHead128) {
  for (int T : {1, 77, 130, 256}) AttentionCase(cpu_.get(), gpu_.get(), rng_, 2, T, 2, 128);
  AttentionCase(cpu_.get(), gpu_.get(), rng_, 1, 640, 1, 128);
}

// Each kernel by name against the CPU reference on the same inputs, forward and backward (both
// dQ modes): mma.sync (what every GPU before Hopper runs) and, on compute capability 9.0,
// wgmma (what the backend picks there, so AttentionCase above tests it too). The backward
// reads the CPU forward's out and stats, so each kernel's backward is checked on its own.
TEST_F(CudaOpsTest, AttentionKernelsMatchCpu) {
  const bool wgmma = AttentionWgmmaAvailable();
  if (!wgmma) std::printf("[   INFO   ] no wgmma here: checking the mma.sync kernels only\n");
  struct Case {
    int B, T, NH, HS;
  };
  Scratch scratch;
  for (const Case& k :
       {Case{2, 1, 3, 64}, Case{2, 63, 3, 64}, Case{2, 200, 3, 64}, Case{1, 1024, 2, 64},
        Case{2, 1, 2, 128}, Case{2, 130, 2, 128}, Case{1, 640, 2, 128}, Case{3, 257, 1, 128}}) {
    SCOPED_TRACE(testing::Message()
                 << "B=" << k.B << " T=" << k.T << " NH=" << k.NH << " HS=" << k.HS);
    const int C = k.NH * k.HS;
    Pair qkv(cpu_.get(), gpu_.get(), size_t(k.B) * k.T * 3 * C),
        out(cpu_.get(), gpu_.get(), size_t(k.B) * k.T * C),
        stats(cpu_.get(), gpu_.get(), size_t(k.B) * k.NH * k.T, DType::kF32),
        dout(cpu_.get(), gpu_.get(), size_t(k.B) * k.T * C),
        dqkv(cpu_.get(), gpu_.get(), size_t(k.B) * k.T * 3 * C),
        ref_out(cpu_.get(), gpu_.get(), size_t(k.B) * k.T * C),
        ref_stats(cpu_.get(), gpu_.get(), size_t(k.B) * k.NH * k.T, DType::kF32);
    qkv.Set(Random(qkv.n, rng_));
    dout.Set(Random(dout.n, rng_));
    cpu_->AttentionForward(out.c, stats.cf(), qkv.c, k.B, k.T, C, k.NH);
    cpu_->AttentionBackward(dqkv.c, dout.c, qkv.c, out.c, stats.cf(), k.B, k.T, C, k.NH);
    // Kept aside: Poison() below clears the CPU side too. The backward's inputs are the CPU
    // forward's out and stats (ref_*, uploaded once).
    const std::vector<float> want_out = out.Cpu(), want_stats = stats.Cpu(), want_dqkv = dqkv.Cpu();
    ref_out.Set(want_out);
    ref_stats.Set(want_stats);
    std::vector<std::vector<float>> outs;
    for (AttentionKernel kernel : {AttentionKernel::kMmaSync, AttentionKernel::kWgmma}) {
      const bool is_wgmma = kernel == AttentionKernel::kWgmma;
      SCOPED_TRACE(is_wgmma ? "wgmma" : "mma.sync");
      if (is_wgmma && !wgmma) {
        EXPECT_EQ(cudaErrorNotSupported, AttentionForward(static_cast<bf16*>(out.g), stats.gf(),
                                                          static_cast<const bf16*>(qkv.g), k.B, k.T,
                                                          C, k.NH, gpu_->stream(), kernel));
        continue;
      }
      out.Poison();
      stats.Poison();
      ASSERT_EQ(cudaSuccess, AttentionForward(static_cast<bf16*>(out.g), stats.gf(),
                                              static_cast<const bf16*>(qkv.g), k.B, k.T, C, k.NH,
                                              gpu_->stream(), kernel));
      ASSERT_TRUE(gpu_->Synchronize().ok()) << gpu_->Synchronize();
      outs.push_back(out.Gpu());
      EXPECT_LT(RelErr(outs.back(), want_out), 1e-2) << "attention out";
      EXPECT_LT(RelErr(stats.Gpu(), want_stats), 1e-3) << "attention stats";
      // With wgmma also dQ from the stored dS (AttentionDq::kStoredDs), in both modes, and run
      // twice: bit-identical.
      std::vector<float> stored_first;
      for (int run = 0; run < (is_wgmma ? 5 : 2); ++run) {
        const bool deterministic = run % 2 == 1;
        const AttentionDq dq = run >= 2 ? AttentionDq::kStoredDs : AttentionDq::kRecompute;
        SCOPED_TRACE(testing::Message() << (deterministic ? "deterministic" : "atomic dQ")
                                        << (run >= 2 ? ", dQ from stored dS" : ""));
        dqkv.Poison();
        ASSERT_EQ(cudaSuccess,
                  AttentionBackward(static_cast<bf16*>(dqkv.g), static_cast<const bf16*>(dout.g),
                                    static_cast<const bf16*>(qkv.g),
                                    static_cast<const bf16*>(ref_out.g), ref_stats.gf(), k.B, k.T,
                                    C, k.NH, deterministic, scratch, gpu_->stream(), kernel, dq));
        ASSERT_TRUE(gpu_->Synchronize().ok()) << gpu_->Synchronize();
        const std::vector<float> got = dqkv.Gpu();
        if (run == 2) stored_first = got;
        if (run == 4) {
          EXPECT_EQ(0, std::memcmp(got.data(), stored_first.data(), got.size() * sizeof(float)))
              << "stored dS: two runs differ";
        }
        // dQ, dK, dV each (one wrong part must not hide behind the others); at T = 1 dQ and dK
        // are exactly zero, so those parts are held to the whole gradient's scale.
        double all = 0;
        for (float x : want_dqkv) all += double(x) * x;
        for (int part = 0; part < 3; ++part) {
          std::vector<float> g, w;
          for (size_t r = 0; r < size_t(k.B) * k.T; ++r) {
            for (int c = 0; c < C; ++c) {
              g.push_back(got[r * 3 * C + part * C + c]);
              w.push_back(want_dqkv[r * 3 * C + part * C + c]);
            }
          }
          double wn = 0, gn = 0;
          for (float x : w) wn += double(x) * x;
          for (float x : g) gn += std::isfinite(x) ? double(x) * x : INFINITY;
          if (std::sqrt(wn) < 1e-4 * std::sqrt(all)) {
            EXPECT_LT(std::sqrt(gn), 1e-3 * std::sqrt(all)) << "d"
                                                            << "qkv"[part] << " (zero)";
          } else {
            EXPECT_LT(RelErr(g, w), 2e-2) << "d"
                                          << "qkv"[part];
          }
        }
      }
    }
    if (outs.size() == 2) {
      EXPECT_LT(RelErr(outs[1], outs[0]), 1e-2) << "wgmma vs mma.sync";
    }
    // The pipelined wgmma forwards reorder the plain one's operations: the same bits.
    if (wgmma) {
      auto forward = [&](AttentionFwdVariant v) {
        out.Poison();
        stats.Poison();
        EXPECT_EQ(cudaSuccess, AttentionForward(static_cast<bf16*>(out.g), stats.gf(),
                                                static_cast<const bf16*>(qkv.g), k.B, k.T, C,
                                                k.NH, gpu_->stream(), AttentionKernel::kWgmma, v));
        EXPECT_TRUE(gpu_->Synchronize().ok()) << gpu_->Synchronize();
        std::vector<float> both = out.Gpu(), st = stats.Gpu();
        both.insert(both.end(), st.begin(), st.end());
        return both;
      };
      const std::vector<float> plain = forward(AttentionFwdVariant::kPlain);
      for (AttentionFwdVariant v :
           {AttentionFwdVariant::kPipelined, AttentionFwdVariant::kPipelinedOneBlock}) {
        const std::vector<float> got = forward(v);
        EXPECT_EQ(0, std::memcmp(got.data(), plain.data(), got.size() * sizeof(float)))
            << "pipelined forward " << int(v) << " differs from the plain one";
      }
    }
  }
}

TEST_F(CudaOpsTest, AttentionRejectsUnsupportedHeadSize) {
  auto b = CudaBackend::Create(0);
  ASSERT_TRUE(b.ok());
  const int B = 1, T = 8, NH = 2, C = 2 * 96;
  void* qkv = *(*b)->Alloc(size_t(B) * T * 3 * C * 2);
  void* out = *(*b)->Alloc(size_t(B) * T * C * 2);
  void* stats = *(*b)->Alloc(size_t(B) * NH * T * 4);
  (*b)->AttentionForward(out, static_cast<float*>(stats), qkv, B, T, C, NH);
  absl::Status s = (*b)->Synchronize();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("head size 96 (hidden 192 / 2 heads"), std::string::npos) << s;
}

TEST_F(CudaOpsTest, SoftmaxCrossEntropyWithPadding) {
  // Rows in shared memory with 128 threads (the first two) and 512 (GPT-2's padded vocabulary),
  // and a row too long for shared memory (the two-pass kernel).
  for (auto [V, Vp] : {std::pair{96, 128}, std::pair{1000, 1024}, std::pair{50257, 50304},
                       std::pair{120000, 120000}}) {
    SCOPED_TRACE(absl::StrCat("V ", V, " Vp ", Vp));
    const int N = 70;
    Pair logits(cpu_.get(), gpu_.get(), N * Vp), losses(cpu_.get(), gpu_.get(), N, DType::kF32);
    logits.Set(Random(N * Vp, rng_, 3.f));
    std::vector<int32_t> t(N);
    for (auto& x : t) x = rng_() % V;
    t[0] = V - 1;  // the last real column: next to the padding
    Tokens targets(cpu_.get(), gpu_.get(), t);
    cpu_->SoftmaxCrossEntropy(losses.cf(), logits.c, targets.c, N, V, Vp, 1.f / N);
    gpu_->SoftmaxCrossEntropy(losses.gf(), logits.g, targets.g, N, V, Vp, 1.f / N);
    ExpectClose(losses, 1e-3, "losses");
    ExpectClose(logits, 1e-2, "dlogits");
    std::vector<float> g = logits.Gpu();
    for (int i = 0; i < N; ++i)
      for (int j = V; j < Vp; ++j) ASSERT_EQ(g[size_t(i) * Vp + j], 0.f);
  }
}

// AdamW with the master weights split into the BF16 working weights and 16-bit low halves
// (the default layout) against an FP32 master copy on the same inputs: the same FP32 masters
// bit for bit (the update reads the same values), working weights their nearest BF16 (equal to
// the FP32-copy path's round-to-even except on exact ties), over the 8-element path, its tail
// and the element path (an odd offset), three steps.
TEST_F(CudaOpsTest, AdamWSplitMasterMatchesFp32Master) {
  const size_t n = 100003, n1 = 50005;
  const std::vector<float> p0 = Random(n, rng_), g0 = Random(n, rng_, 0.01f);
  std::vector<uint16_t> hi0(n), lo0(n);
  for (size_t i = 0; i < n; ++i) SplitMaster(p0[i], &hi0[i], &lo0[i]);
  auto alloc = [&](size_t bytes) {
    absl::StatusOr<void*> a = gpu_->Alloc(bytes);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? *a : nullptr;
  };
  struct Run {
    void *params, *master, *grads, *m, *v;
  };
  std::vector<float> zeros(n, 0.f);
  auto make = [&](bool split) {
    Run r{alloc(n * 2), alloc(n * (split ? 2 : 4)), alloc(n * 2), alloc(n * 4), alloc(n * 4)};
    if (split) {
      gpu_->CopyFromHost(r.params, hi0.data(), n * 2);
      gpu_->CopyFromHost(r.master, lo0.data(), n * 2);
    } else {
      gpu_->CopyFromHostF32(r.params, DType::kBF16, p0.data(), n);
      gpu_->CopyFromHostF32(r.master, DType::kF32, p0.data(), n);
    }
    gpu_->CopyFromHostF32(r.grads, DType::kBF16, g0.data(), n);
    gpu_->CopyFromHostF32(r.m, DType::kF32, zeros.data(), n);
    gpu_->CopyFromHostF32(r.v, DType::kF32, zeros.data(), n);
    return r;
  };
  Run full = make(false), split = make(true);
  float* norm_sq = static_cast<float*>(alloc(4));
  gpu_->NormSquared(norm_sq, full.grads, n);
  std::vector<uint8_t> mask(8 + n);
  for (uint8_t& b : mask) b = std::uniform_int_distribution<int>(0, 1)(rng_);
  const std::vector<uint8_t> bits = PackDecayBits(mask);
  auto* gbits = static_cast<uint8_t*>(alloc(bits.size()));
  gpu_->CopyFromHost(gbits, bits.data(), bits.size());
  auto at = [](void* p, size_t elem, size_t i) { return static_cast<char*>(p) + elem * i; };
  for (int t = 1; t <= 3; ++t) {
    for (bool is_split : {false, true}) {
      gpu_->set_split_master(is_split);
      const Run& r = is_split ? split : full;
      for (const auto& [lo, hi] : {std::pair<size_t, size_t>{0, n1}, {n1, n}}) {
        gpu_->AdamW(at(r.params, 2, lo), at(r.master, is_split ? 2 : 4, lo), at(r.grads, 2, lo),
                    at(r.m, 4, lo), at(r.v, 4, lo), DecayBits{gbits, 8 + lo}, hi - lo, 1e-3f, 0.9f,
                    0.95f, 1e-8f, 0.1f, t, 1.f, norm_sq, 0.5f);
      }
    }
  }
  ASSERT_TRUE(gpu_->Synchronize().ok());
  auto read = [&](const void* src, size_t bytes) {
    std::vector<uint8_t> out(bytes);
    gpu_->CopyToHost(out.data(), src, bytes);
    return out;
  };
  std::vector<float> full_master(n);
  gpu_->CopyToHostF32(full_master.data(), full.master, DType::kF32, n);
  std::vector<uint16_t> full_w(n), split_w(n), split_lo(n);
  gpu_->CopyToHost(full_w.data(), full.params, n * 2);
  gpu_->CopyToHost(split_w.data(), split.params, n * 2);
  gpu_->CopyToHost(split_lo.data(), split.master, n * 2);
  ASSERT_TRUE(gpu_->Synchronize().ok());
  EXPECT_EQ(read(full.m, n * 4), read(split.m, n * 4));
  EXPECT_EQ(read(full.v, n * 4), read(split.v, n * 4));
  size_t moved = 0, ties = 0;
  for (size_t i = 0; i < n; ++i) {
    const float joined = JoinMaster(split_w[i], split_lo[i]);
    ASSERT_EQ(FloatBits(joined), FloatBits(full_master[i])) << i << ": " << joined << " vs "
                                                            << full_master[i];
    uint16_t want_hi = 0, want_lo = 0;
    SplitMaster(full_master[i], &want_hi, &want_lo);
    ASSERT_EQ(split_w[i], want_hi) << i;
    if (split_lo[i] == 0x8000u) {
      ++ties;
    } else {
      ASSERT_EQ(split_w[i], full_w[i]) << i;
    }
    moved += full_master[i] != p0[i];
  }
  EXPECT_GT(moved, n / 2);  // the steps did update the weights
  EXPECT_LT(ties, n / 1000);
  for (void* p : {full.params, full.master, full.grads, full.m, full.v, split.params, split.master,
                  split.grads, split.m, split.v, static_cast<void*>(norm_sq),
                  static_cast<void*>(gbits)}) {
    gpu_->Free(p);
  }
}

// NormSquaredBeside (on its own stream): sees the ops enqueued on the op stream before it
// (here the residual add that writes its input), accumulates over the pieces in order, matches
// the CPU backend and one NormSquared over the whole vector; from an unaligned piece too; and
// inside a recorded graph, replayed on new inputs. A copy to the host joins it.
TEST_F(CudaOpsTest, NormSquaredBesideSeesEarlierOpsAndAccumulates) {
  const size_t n = 300007, cut1 = 100001, cut2 = 200008;  // the second piece starts unaligned
  Pair a(cpu_.get(), gpu_.get(), n), b(cpu_.get(), gpu_.get(), n), x(cpu_.get(), gpu_.get(), n);
  Pair ns(cpu_.get(), gpu_.get(), 1, DType::kF32), whole(cpu_.get(), gpu_.get(), 1, DType::kF32);
  auto at = [](void* p, size_t i) { return static_cast<char*>(p) + 2 * i; };
  auto enqueue = [&](Backend* be, void* xs, void* as, void* bs, float* out) {
    be->ResidualForward(xs, as, bs, n);  // x = a + b, just before the norm of x
    be->NormSquaredBeside(out, xs, cut1, /*accumulate=*/false);
    be->NormSquaredBeside(out, at(xs, cut1), cut2 - cut1, /*accumulate=*/true);
    be->NormSquaredBeside(out, at(xs, cut2), n - cut2, /*accumulate=*/true);
    be->JoinNormSquared();
  };
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "eager" : "recorded graph, replayed");
    a.Set(Random(n, rng_, 0.01f));
    b.Set(Random(n, rng_, 0.01f));
    // CPU: the pieces in float, as the GPU.
    cpu_->ResidualForward(x.c, a.c, b.c, n);
    cpu_->NormSquaredBeside(ns.cf(), x.c, cut1, false);
    cpu_->NormSquaredBeside(ns.cf(), static_cast<float*>(x.c) + cut1, cut2 - cut1, true);
    cpu_->NormSquaredBeside(ns.cf(), static_cast<float*>(x.c) + cut2, n - cut2, true);
    if (round == 0) {
      enqueue(gpu_.get(), x.g, a.g, b.g, ns.gf());
    } else {
      x.Poison();
      ASSERT_TRUE(gpu_->BeginCapture().ok());
      enqueue(gpu_.get(), x.g, a.g, b.g, ns.gf());
      absl::StatusOr<std::unique_ptr<Backend::Graph>> g = gpu_->EndCapture();
      ASSERT_TRUE(g.ok()) << g.status();
      a.Set(Random(n, rng_, 0.01f));  // the replay must read these, not the recorded ones
      cpu_->ResidualForward(x.c, a.c, b.c, n);
      cpu_->NormSquaredBeside(ns.cf(), x.c, cut1, false);
      cpu_->NormSquaredBeside(ns.cf(), static_cast<float*>(x.c) + cut1, cut2 - cut1, true);
      cpu_->NormSquaredBeside(ns.cf(), static_cast<float*>(x.c) + cut2, n - cut2, true);
      gpu_->Replay(**g);
    }
    const std::vector<float> got = ns.Gpu();  // CopyToHost: joins whatever is beside
    ExpectClose(ns, 1e-5, "norm squared beside, three pieces");
    gpu_->NormSquared(whole.gf(), x.g, n);
    const std::vector<float> one = whole.Gpu();
    EXPECT_NEAR(got[0], one[0], 1e-5 * one[0]);
    EXPECT_GT(one[0], 0.f);
  }
}

TEST_F(CudaOpsTest, NormAdamWArgmaxResidual) {
  const size_t n = 100003;
  Pair grads(cpu_.get(), gpu_.get(), n), ns(cpu_.get(), gpu_.get(), 1, DType::kF32);
  grads.Set(Random(n, rng_, 0.01f));
  cpu_->NormSquared(ns.cf(), grads.c, n);
  gpu_->NormSquared(ns.gf(), grads.g, n);
  ExpectClose(ns, 1e-5, "norm squared");

  std::vector<float> p0 = Random(n, rng_);
  gpu_->set_split_master(false);  // an FP32 master copy here (split: AdamWSplitMaster* below)
  Pair params(cpu_.get(), gpu_.get(), n), master(cpu_.get(), gpu_.get(), n, DType::kF32),
      m(cpu_.get(), gpu_.get(), n, DType::kF32), v(cpu_.get(), gpu_.get(), n, DType::kF32);
  params.Set(p0);
  master.Set(p0);
  std::vector<float> zeros(n, 0.f);
  m.Set(zeros);
  v.Set(zeros);
  // A random decay mask, packed from bit 8: the first call ([0, n1), bits from 8) takes the
  // 8-element path and its tail, the second ([n1, n), from the odd bit 8 + n1) the element path.
  const size_t n1 = 50005;
  std::vector<uint8_t> mask(8 + n);
  for (uint8_t& b : mask) b = std::uniform_int_distribution<int>(0, 1)(rng_);
  const std::vector<uint8_t> bits = PackDecayBits(mask);
  absl::StatusOr<void*> gpu_bits = gpu_->Alloc(bits.size());
  ASSERT_TRUE(gpu_bits.ok());
  gpu_->CopyFromHost(*gpu_bits, bits.data(), bits.size());
  const auto* gbits = static_cast<const uint8_t*>(*gpu_bits);
  auto f32 = [](void* p, size_t i) { return static_cast<float*>(p) + i; };
  auto b16 = [](void* p, size_t i) { return static_cast<uint16_t*>(p) + i; };
  for (int t = 1; t <= 3; ++t) {
    for (const auto& [lo, hi] : {std::pair<size_t, size_t>{0, n1}, {n1, n}}) {
      cpu_->AdamW(f32(params.c, lo), nullptr, f32(grads.c, lo), f32(m.c, lo), f32(v.c, lo),
                  DecayBits{bits.data(), 8 + lo}, hi - lo, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 1.f,
                  ns.cf(), 0.5f);
      gpu_->AdamW(b16(params.g, lo), f32(master.g, lo), b16(grads.g, lo), f32(m.g, lo),
                  f32(v.g, lo), DecayBits{gbits, 8 + lo}, hi - lo, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                  t, 1.f, ns.gf(), 0.5f);
    }
  }
  ASSERT_TRUE(gpu_->Synchronize().ok());
  gpu_->Free(*gpu_bits);
  // FP32 master weights on the GPU against the CPU's FP32 parameters.
  std::vector<float> want = params.Cpu(), got = master.Gpu();
  double err = 0;
  for (size_t i = 0; i < n; ++i) err = std::max(err, double(std::fabs(got[i] - want[i])));
  EXPECT_LT(err, 1e-5);
  ExpectClose(params, 1e-2, "bf16 working weights");

  const int N = 33, V = 96, Vp = 128;
  Pair logits(cpu_.get(), gpu_.get(), N * Vp);
  logits.Set(Random(N * Vp, rng_));
  std::vector<int32_t> zero(N, -1);
  Tokens am(cpu_.get(), gpu_.get(), zero);
  cpu_->Argmax(am.c, logits.c, N, V, Vp);
  gpu_->Argmax(am.g, logits.g, N, V, Vp);
  std::vector<int32_t> a(N), b(N);
  cpu_->CopyToHost(a.data(), am.c, N * 4);
  gpu_->CopyToHost(b.data(), am.g, N * 4);
  EXPECT_EQ(a, b);

  Pair x(cpu_.get(), gpu_.get(), 1001), y(cpu_.get(), gpu_.get(), 1001),
      s(cpu_.get(), gpu_.get(), 1001);
  x.Set(Random(1001, rng_));
  y.Set(Random(1001, rng_));
  cpu_->ResidualForward(s.c, x.c, y.c, 1001);
  gpu_->ResidualForward(s.g, x.g, y.g, 1001);
  ExpectClose(s, 1e-2, "residual");
}

// fc2's backward with dGELU and fc1's bias gradient fused (cuBLASLt's DGELU_BGRAD and BGRADB
// epilogues), with the DGELU epilogue alone and a column sum, and with the unfused kernels,
// against the CPU: every output accumulates (or is written) as the contract says, over two
// micro-batches; with and without the bias gradients, and for a frozen weight.
TEST_F(CudaOpsTest, MatmulBackwardGeluFusedAndUnfused) {
  const int N = 256, F = 512, C = 128;    // fc2: [N, F] -> [N, C]
  for (int mode = 0; mode < 3; ++mode) {  // 0: fused epilogues, 1: DGELU epilogue, 2: unfused
    for (int variant = 0; variant < 3; ++variant) {
      // 0: every gradient; 1: no bias gradients; 2: frozen weights (no dweight, no dbias).
      SCOPED_TRACE(testing::Message() << (mode == 0   ? "fused"
                                          : mode == 1 ? "dgelu"
                                                      : "unfused")
                                      << " variant " << variant);
      gpu_->set_fused_epilogues(mode == 0);
      gpu_->set_dgelu_epilogue(mode == 1);
      const bool biases = variant == 0, weights = variant != 2;
      Pair pre(cpu_.get(), gpu_.get(), N * F), inp(cpu_.get(), gpu_.get(), N * F),
          w(cpu_.get(), gpu_.get(), C * F), dout(cpu_.get(), gpu_.get(), N * C),
          dpre(cpu_.get(), gpu_.get(), N * F), dpre_bias(cpu_.get(), gpu_.get(), F),
          dw(cpu_.get(), gpu_.get(), C * F), db(cpu_.get(), gpu_.get(), C);
      pre.Set(Random(N * F, rng_, 2.f));
      inp.Set(Random(N * F, rng_));
      w.Set(Random(C * F, rng_, 0.1f));
      dpre_bias.Set(Random(F, rng_));
      dw.Set(Random(C * F, rng_));
      db.Set(Random(C, rng_));
      for (int micro = 0; micro < 2; ++micro) {
        dout.Set(Random(N * C, rng_));
        dpre.Poison();
        cpu_->MatmulBackwardGelu(dpre.c, biases ? dpre_bias.c : nullptr, pre.c,
                                 weights ? dw.c : nullptr, biases ? db.c : nullptr, dout.c, inp.c,
                                 w.c, N, F, C);
        gpu_->MatmulBackwardGelu(dpre.g, biases ? dpre_bias.g : nullptr, pre.g,
                                 weights ? dw.g : nullptr, biases ? db.g : nullptr, dout.g, inp.g,
                                 w.g, N, F, C);
        ExpectClose(dpre, 2e-2, "dpre");
      }
      ExpectClose(dpre_bias, 2e-2, "dpre_bias (fc1's bias gradient)");
      ExpectClose(dw, 2e-2, "dweight");
      ExpectClose(db, 2e-2, "dbias");
    }
  }
  gpu_->set_dgelu_epilogue(false);
  // On a GPU with BF16 tensor cores cuBLASLt has these epilogues: the fused path really ran.
  EXPECT_EQ(gpu_->unfused_fallbacks(), 0) << "a fused-epilogue GEMM ran unfused";
}

// The weight gradient's GEMM on the side stream (set_concurrent_weight_gradient, from a shape's
// second call on) gives the bits of the one-stream backward: MatmulBackward with and without
// the GELU backward in place, and MatmulBackwardGelu, three accumulating micro-batches each,
// with a shape whose GEMMs take several waves.
TEST_F(CudaOpsTest, ConcurrentWeightGradientGivesTheOneStreamBits) {
  const int N = 2048, C = 768, OC = 1536;
  Pair inp(cpu_.get(), gpu_.get(), size_t(N) * C), w(cpu_.get(), gpu_.get(), size_t(OC) * C),
      pre(cpu_.get(), gpu_.get(), size_t(N) * OC), dout(cpu_.get(), gpu_.get(), size_t(N) * OC),
      dinp(cpu_.get(), gpu_.get(), size_t(N) * C), dw(cpu_.get(), gpu_.get(), size_t(OC) * C),
      db(cpu_.get(), gpu_.get(), OC), dpre(cpu_.get(), gpu_.get(), size_t(N) * C),
      dpre_bias(cpu_.get(), gpu_.get(), C), pre_c(cpu_.get(), gpu_.get(), size_t(N) * C);
  inp.Set(Random(inp.n, rng_));
  w.Set(Random(w.n, rng_, 0.1f));
  pre.Set(Random(pre.n, rng_, 2.f));
  pre_c.Set(Random(pre_c.n, rng_, 2.f));
  const std::vector<float> w0 = Random(dw.n, rng_), b0 = Random(db.n, rng_),
                           pb0 = Random(dpre_bias.n, rng_);
  std::vector<std::vector<float>> douts;
  for (int micro = 0; micro < 3; ++micro) douts.push_back(Random(dout.n, rng_));
  for (int op = 0; op < 3; ++op) {  // 0: MatmulBackward, 1: with pre_gelu, 2: MatmulBackwardGelu
    SCOPED_TRACE(testing::Message() << "op " << op);
    std::vector<std::vector<float>> got[2];
    for (int concurrent = 0; concurrent < 2; ++concurrent) {
      gpu_->set_concurrent_weight_gradient(concurrent == 1);
      dw.Set(w0);
      db.Set(b0);
      dpre_bias.Set(pb0);
      for (int micro = 0; micro < 3; ++micro) {
        dout.Set(douts[micro]);
        dinp.Poison();
        dpre.Poison();
        if (op < 2) {
          gpu_->MatmulBackward(dinp.g, dw.g, db.g, dout.g, op == 1 ? pre.g : nullptr, inp.g, w.g, N,
                               C, OC);
          got[concurrent].push_back(dinp.Gpu());
        } else {
          gpu_->MatmulBackwardGelu(dpre.g, dpre_bias.g, pre_c.g, dw.g, db.g, dout.g, inp.g, w.g, N,
                                   C, OC);
          got[concurrent].push_back(dpre.Gpu());
        }
      }
      ASSERT_TRUE(gpu_->Synchronize().ok()) << gpu_->Synchronize();
      got[concurrent].push_back(dw.Gpu());
      got[concurrent].push_back(db.Gpu());
      if (op == 2) got[concurrent].push_back(dpre_bias.Gpu());
    }
    ASSERT_EQ(got[0].size(), got[1].size());
    for (size_t i = 0; i < got[0].size(); ++i) {
      EXPECT_TRUE(got[0][i] == got[1][i])
          << "output " << i << " differs between one stream and two";
    }
  }
  gpu_->set_concurrent_weight_gradient(true);
}

// The GELU backward fused with fc1's bias-gradient column sum (the unfused path of
// MatmulBackwardGelu): the same bits as GeluBackwardInPlace followed by ColumnSumAccumulate,
// on row counts that are not a multiple of the row chunks and on widths the vectorised kernel
// does not take (C % 8 != 0: the two ops run).
TEST_F(CudaOpsTest, GeluBackwardColumnSumMatchesTheTwoOpsBitForBit) {
  for (const int C : {3072, 512, 200, 100}) {
    const int N = 300;
    SCOPED_TRACE(testing::Message() << "C " << C);
    Pair pre(cpu_.get(), gpu_.get(), size_t(N) * C), x1(cpu_.get(), gpu_.get(), size_t(N) * C),
        x2(cpu_.get(), gpu_.get(), size_t(N) * C), b1(cpu_.get(), gpu_.get(), C),
        b2(cpu_.get(), gpu_.get(), C);
    pre.Set(Random(size_t(N) * C, rng_, 2.f));
    const std::vector<float> x = Random(size_t(N) * C, rng_), bias = Random(C, rng_);
    x1.Set(x);
    x2.Set(x);
    b1.Set(bias);
    b2.Set(bias);
    ASSERT_TRUE(gpu_->Synchronize().ok());  // the uploads ran on the backend's stream
    Scratch s1, s2;
    auto* p = static_cast<const __nv_bfloat16*>(pre.g);
    ASSERT_EQ(GeluBackwardColumnSum(static_cast<__nv_bfloat16*>(x1.g), p,
                                    static_cast<__nv_bfloat16*>(b1.g), N, C, s1, nullptr),
              cudaSuccess);
    ASSERT_EQ(GeluBackwardInPlace(static_cast<__nv_bfloat16*>(x2.g), p, size_t(N) * C, nullptr),
              cudaSuccess);
    ASSERT_EQ(ColumnSumAccumulate(static_cast<__nv_bfloat16*>(b2.g),
                                  static_cast<const __nv_bfloat16*>(x2.g), N, C, s2, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(x1.Gpu(), x2.Gpu()) << "dGELU output";
    EXPECT_EQ(b1.Gpu(), b2.Gpu()) << "bias gradient";
  }
}

// MatmulBackward's weight gradient with the bias gradient from its BGRADB epilogue: the bias
// gradient accumulates over micro-batches (the epilogue itself writes with '='), fused or not.
TEST_F(CudaOpsTest, BiasGradientFromTheWeightGradientAccumulates) {
  const int N = 300, C = 128, OC = 384;  // N not a multiple of a GEMM tile
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "unfused");
    gpu_->set_fused_epilogues(fused);
    Pair inp(cpu_.get(), gpu_.get(), N * C), w(cpu_.get(), gpu_.get(), OC * C),
        dout(cpu_.get(), gpu_.get(), N * OC), dinp(cpu_.get(), gpu_.get(), N * C),
        dw(cpu_.get(), gpu_.get(), OC * C), db(cpu_.get(), gpu_.get(), OC);
    inp.Set(Random(N * C, rng_));
    w.Set(Random(OC * C, rng_, 0.1f));
    std::vector<float> zeros(OC * C, 0.f);
    dw.Set(zeros);
    db.Set(std::vector<float>(OC, 0.f));
    for (int micro = 0; micro < 3; ++micro) {
      dout.Set(Random(N * OC, rng_));
      cpu_->MatmulBackward(dinp.c, dw.c, db.c, dout.c, nullptr, inp.c, w.c, N, C, OC);
      gpu_->MatmulBackward(dinp.g, dw.g, db.g, dout.g, nullptr, inp.g, w.g, N, C, OC);
      ExpectClose(dinp, 2e-2, "dinp");
      ExpectClose(db, 2e-2, "dbias after a micro-batch");
    }
    ExpectClose(dw, 2e-2, "dweight");
  }
  EXPECT_EQ(gpu_->unfused_fallbacks(), 0) << "a fused-epilogue GEMM ran unfused";
}

// SetWeightGradientOverwrite: the weight gradient written with '=' (NaN before it must not
// show), bias gradients still accumulated, for MatmulBackward and MatmulBackwardGelu; each
// twice, so the second runs the weight gradient on the side stream (the first of a shape
// autotunes on the main one).
TEST_F(CudaOpsTest, WeightGradientOverwriteIgnoresTheOldValues) {
  const int N = 300, C = 128, OC = 384;
  for (bool gelu : {false, true}) {
    for (int run = 0; run < 2; ++run) {
      SCOPED_TRACE(testing::Message() << (gelu ? "MatmulBackwardGelu" : "MatmulBackward")
                                      << " run " << run);
      Pair inp(cpu_.get(), gpu_.get(), N * C), w(cpu_.get(), gpu_.get(), OC * C),
          dout(cpu_.get(), gpu_.get(), N * OC), dinp(cpu_.get(), gpu_.get(), N * C),
          dw(cpu_.get(), gpu_.get(), OC * C), db(cpu_.get(), gpu_.get(), OC),
          pre(cpu_.get(), gpu_.get(), N * C), dpre_bias(cpu_.get(), gpu_.get(), C);
      inp.Set(Random(N * C, rng_));
      w.Set(Random(OC * C, rng_, 0.1f));
      pre.Set(Random(N * C, rng_, 2.f));
      const std::vector<float> db0 = Random(OC, rng_), dpb0 = Random(C, rng_);
      db.Set(db0);
      dpre_bias.Set(dpb0);
      dout.Set(Random(N * OC, rng_));  // dw stays poisoned (NaN)
      for (Backend* be : {cpu_.get(), static_cast<Backend*>(gpu_.get())}) {
        const bool g = be != cpu_.get();
        be->SetWeightGradientOverwrite(true);
        if (gelu) {
          be->MatmulBackwardGelu(g ? dinp.g : dinp.c, g ? dpre_bias.g : dpre_bias.c,
                                 g ? pre.g : pre.c, g ? dw.g : dw.c, g ? db.g : db.c,
                                 g ? dout.g : dout.c, g ? inp.g : inp.c, g ? w.g : w.c, N, C, OC);
        } else {
          be->MatmulBackward(g ? dinp.g : dinp.c, g ? dw.g : dw.c, g ? db.g : db.c,
                             g ? dout.g : dout.c, nullptr, g ? inp.g : inp.c, g ? w.g : w.c, N, C,
                             OC);
        }
        be->SetWeightGradientOverwrite(false);
      }
      ExpectClose(dw, 2e-2, "dweight");
      ExpectClose(db, 2e-2, "dbias");
      ExpectClose(dinp, 2e-2, gelu ? "dpre" : "dinp");
      if (gelu) ExpectClose(dpre_bias, 2e-2, "dpre_bias");
      // The bias gradient accumulated onto its start values (not overwritten).
      const std::vector<float> want_db = db.Cpu();
      double moved = 0;
      for (int i = 0; i < OC; ++i) moved += std::fabs(want_db[i] - db0[i]);
      EXPECT_GT(moved, 0.0);
    }
  }
}

// Memset0Ranges zeroes exactly its ranges: odd offsets and lengths, empty ranges, ranges
// shorter than 16 bytes inside one chunk, one large range, and more ranges than one launch
// takes (ZeroRangeList::kMax).
TEST_F(CudaOpsTest, Memset0RangesZeroesExactlyItsRanges) {
  const size_t bytes = (3 << 20) + 77;
  std::vector<Backend::ByteRange> ranges = {{1, 0}, {3, 5}, {17, 1}, {31, 40}, {200, 2 << 20}};
  for (size_t i = 0; i < 100; ++i) ranges.push_back({(2 << 20) + 300 + i * 97, 1 + i % 40});
  absl::StatusOr<void*> d = gpu_->Alloc(bytes);
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<uint8_t> host(bytes);
  for (uint8_t& b : host) b = static_cast<uint8_t>(1 + rng_() % 255);
  gpu_->CopyFromHost(*d, host.data(), bytes);
  gpu_->Memset0Ranges(*d, ranges);
  std::vector<uint8_t> got(bytes);
  gpu_->CopyToHost(got.data(), *d, bytes);
  ASSERT_TRUE(gpu_->Synchronize().ok());
  std::vector<uint8_t> want = host;
  for (const Backend::ByteRange& r : ranges) std::fill_n(want.begin() + r.offset, r.bytes, 0);
  size_t wrong = 0;
  for (size_t i = 0; i < bytes; ++i) wrong += got[i] != want[i];
  EXPECT_EQ(wrong, 0u);
  gpu_->Free(*d);
}

// In deterministic mode the fused backward gives bit-identical results from run to run.
TEST_F(CudaOpsTest, FusedBackwardIsBitReproducibleWhenDeterministic) {
  auto other = CudaBackend::Create(0);
  ASSERT_TRUE(other.ok());
  const int N = 512, F = 512, C = 128;
  const std::vector<float> pre = Random(N * F, rng_, 2.f), inp = Random(N * F, rng_),
                           w = Random(C * F, rng_, 0.1f), dout = Random(N * C, rng_);
  std::vector<float> results[2];
  CudaBackend* backends[2] = {gpu_.get(), other->get()};
  for (int run = 0; run < 2; ++run) {
    CudaBackend* b = backends[run];
    b->SetDeterministic(true);
    auto up = [&](const std::vector<float>& v) {
      void* p = *b->Alloc(v.size() * 2);
      b->CopyFromHostF32(p, DType::kBF16, v.data(), v.size());
      return p;
    };
    const std::vector<float> zf(F, 0.f), zw(C * F, 0.f), zc(C, 0.f), zp(N * F, 0.f);
    void *p = up(pre), *x = up(inp), *wt = up(w), *dy = up(dout), *dp = up(zp), *dpb = up(zf),
         *dw = up(zw), *db = up(zc);
    for (int micro = 0; micro < 2; ++micro) {
      b->MatmulBackwardGelu(dp, dpb, p, dw, db, dy, x, wt, N, F, C);
    }
    ASSERT_TRUE(b->Synchronize().ok()) << b->Synchronize();
    const std::pair<void*, size_t> outputs[] = {
        {dp, size_t(N) * F}, {dpb, size_t(F)}, {dw, size_t(C) * F}, {db, size_t(C)}};
    for (auto [ptr, n] : outputs) {
      std::vector<float> h(n);
      b->CopyToHostF32(h.data(), ptr, DType::kBF16, n);
      results[run].insert(results[run].end(), h.begin(), h.end());
    }
    for (void* q : {p, x, wt, dy, dp, dpb, dw, db}) b->Free(q);
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  EXPECT_EQ(0, std::memcmp(results[0].data(), results[1].data(), results[0].size() * 4));
}

// The residual add fused with the LayerNorm after it: against the CPU, and bit-identical to
// the unfused pair on the GPU (also in place, residual aliasing a).
TEST_F(CudaOpsTest, ResidualLayerNormMatchesTheUnfusedPair) {
  const int N = 301, C = 768;
  Pair a(cpu_.get(), gpu_.get(), N * C), b(cpu_.get(), gpu_.get(), N * C),
      w(cpu_.get(), gpu_.get(), C), bias(cpu_.get(), gpu_.get(), C),
      res(cpu_.get(), gpu_.get(), N * C), out(cpu_.get(), gpu_.get(), N * C),
      mean(cpu_.get(), gpu_.get(), N, DType::kF32), rstd(cpu_.get(), gpu_.get(), N, DType::kF32);
  const std::vector<float> av = Random(N * C, rng_, 2.f);
  a.Set(av);
  b.Set(Random(N * C, rng_));
  w.Set(Random(C, rng_));
  bias.Set(Random(C, rng_));
  cpu_->ResidualLayerNormForward(res.c, out.c, mean.cf(), rstd.cf(), a.c, b.c, w.c, bias.c, N, C);
  gpu_->ResidualLayerNormForward(res.g, out.g, mean.gf(), rstd.gf(), a.g, b.g, w.g, bias.g, N, C);
  ExpectClose(res, 1e-2, "residual");
  ExpectClose(out, 1e-2, "layernorm out");
  ExpectClose(mean, 1e-2, "mean");
  ExpectClose(rstd, 1e-2, "rstd");
  const std::vector<float> fused_res = res.Gpu(), fused_out = out.Gpu(), fused_mean = mean.Gpu(),
                           fused_rstd = rstd.Gpu();
  // Unfused on the GPU: the same bits.
  res.Poison();
  out.Poison();
  gpu_->ResidualForward(res.g, a.g, b.g, size_t(N) * C);
  gpu_->LayerNormForward(out.g, mean.gf(), rstd.gf(), res.g, w.g, bias.g, N, C);
  ASSERT_TRUE(gpu_->Synchronize().ok());
  EXPECT_EQ(res.Gpu(), fused_res);
  EXPECT_EQ(out.Gpu(), fused_out);
  EXPECT_EQ(mean.Gpu(), fused_mean);
  EXPECT_EQ(rstd.Gpu(), fused_rstd);
  // In place: the residual overwrites a.
  out.Poison();
  gpu_->ResidualLayerNormForward(a.g, out.g, mean.gf(), rstd.gf(), a.g, b.g, w.g, bias.g, N, C);
  ASSERT_TRUE(gpu_->Synchronize().ok());
  EXPECT_EQ(a.Gpu(), fused_res);
  EXPECT_EQ(out.Gpu(), fused_out);
}

// C = 768 and 2048 hold each row in registers: the same bits as the chunk loop every other C
// runs (SetLayerNormReferenceKernels), plain and with the residual, N not a multiple of the
// block's 8 rows.
TEST_F(CudaOpsTest, LayerNormHeldRowsMatchTheChunkLoop) {
  struct Reference {  // restored however the test ends
    ~Reference() { SetLayerNormReferenceKernels(false); }
  } restore;
  for (const int C : {768, 2048}) {
    SCOPED_TRACE(absl::StrCat("C ", C));
    const int N = 333;
    Pair a(cpu_.get(), gpu_.get(), N * C), b(cpu_.get(), gpu_.get(), N * C),
        w(cpu_.get(), gpu_.get(), C), bias(cpu_.get(), gpu_.get(), C),
        res(cpu_.get(), gpu_.get(), N * C), out(cpu_.get(), gpu_.get(), N * C),
        mean(cpu_.get(), gpu_.get(), N, DType::kF32), rstd(cpu_.get(), gpu_.get(), N, DType::kF32);
    a.Set(Random(N * C, rng_, 3.f));
    b.Set(Random(N * C, rng_));
    w.Set(Random(C, rng_));
    bias.Set(Random(C, rng_));
    std::vector<float> got[2][5];  // [reference][res, out, mean, rstd, plain out]
    for (const bool reference : {false, true}) {
      SetLayerNormReferenceKernels(reference);
      res.Poison();
      out.Poison();
      mean.Poison();
      rstd.Poison();
      gpu_->ResidualLayerNormForward(res.g, out.g, mean.gf(), rstd.gf(), a.g, b.g, w.g, bias.g, N,
                                     C);
      ASSERT_TRUE(gpu_->Synchronize().ok());
      got[reference][0] = res.Gpu();
      got[reference][1] = out.Gpu();
      got[reference][2] = mean.Gpu();
      got[reference][3] = rstd.Gpu();
      out.Poison();
      gpu_->LayerNormForward(out.g, mean.gf(), rstd.gf(), a.g, w.g, bias.g, N, C);
      ASSERT_TRUE(gpu_->Synchronize().ok());
      got[reference][4] = out.Gpu();
    }
    SetLayerNormReferenceKernels(false);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(0, std::memcmp(got[0][i].data(), got[1][i].data(), got[0][i].size() * 4))
          << "output " << i;
    }
    // And against the CPU (Poison poisons both sides: first).
    res.Poison();
    out.Poison();
    cpu_->ResidualLayerNormForward(res.c, out.c, mean.cf(), rstd.cf(), a.c, b.c, w.c, bias.c, N,
                                   C);
    gpu_->ResidualLayerNormForward(res.g, out.g, mean.gf(), rstd.gf(), a.g, b.g, w.g, bias.g, N, C);
    ExpectClose(res, 1e-2, "residual");
    ExpectClose(out, 1e-2, "layernorm out");
    ExpectClose(rstd, 1e-2, "rstd");
  }
}

}  // namespace
}  // namespace boulder::kernels::cuda
