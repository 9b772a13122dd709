// attention_bench: times the causal flash attention kernels (kernels/cuda/attention_*.cu) on
// the benchmark workloads' shapes, forward and backward (atomic-dQ and deterministic), with
// CUDA events: median over --iters calls after --warmup, inputs rotated among three sets of
// fresh random BF16 values so no call finds its inputs in L2.
//
// TFLOP/s counts the nominal causal FLOPs: forward 2 products × 2·T²·HS / 2 (half the
// score matrix is masked) = 2·B·NH·T²·HS; backward 5 products = 2.5 × forward (the
// recomputation of P and, in deterministic mode, of S and dP is not counted), as
// FlashAttention's benchmarks count them.
// On Hopper also the forward with FP8 training's projection-input cast: the forward then CastFp8,
// against the forward casting its own output (AttentionFp8Cast), with the codes compared.
//
//   attention_bench [--shape all|seed|gpt2|h2048] [--iters 30] [--warmup 5]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "kernels/cuda/bench_check.h"
#include "kernels/cuda/fp8_ops.h"
#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {
namespace {

struct Shape {
  const char* name;
  int B, T, NH, HS, layers;
};

constexpr Shape kShapes[] = {
    {"seed", 32, 256, 12, 64, 4},    // the seed mini-GPT, batch 32 × 256
    {"gpt2", 16, 1024, 12, 64, 12},  // GPT-2 124M, batch 16 × 1024
    {"h2048", 8, 1024, 16, 128, 8},  // hidden 2048, 16 heads, 8 layers, batch 8 × 1024
};

// Fresh pseudo-random BF16 values, roughly N(0, 1) (sum of four uniforms, rescaled).
std::vector<uint16_t> RandomBf16(size_t n, uint64_t seed) {
  std::vector<uint16_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    float s = 0.f;
    for (int k = 0; k < 4; ++k) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      s += float(x >> 40) / float(1ull << 24) - 0.5f;
    }
    float f = s * 1.7320508f;  // variance of the sum of 4 uniforms is 1/3
    uint32_t b;
    std::memcpy(&b, &f, 4);
    v[i] = uint16_t((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
  }
  return v;
}

struct Buffers {
  bf16 *qkv, *out, *dout, *dqkv;
  float* stats;
};

template <typename F>
double MedianMs(int warmup, int iters, F call) {
  for (int i = 0; i < warmup; ++i) call(i);
  BENCH_CHECK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) BENCH_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    BENCH_CHECK(cudaEventRecord(ev[2 * i]));
    call(i);
    BENCH_CHECK(cudaEventRecord(ev[2 * i + 1]));
  }
  BENCH_CHECK(cudaDeviceSynchronize());
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i)
    BENCH_CHECK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) BENCH_CHECK(cudaEventDestroy(e));
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

void Run(const Shape& sh, int warmup, int iters) {
  const int C = sh.NH * sh.HS;
  const size_t n_qkv = size_t(sh.B) * sh.T * 3 * C, n_out = size_t(sh.B) * sh.T * C;
  constexpr int kSets = 3;
  Buffers set[kSets];
  for (int s = 0; s < kSets; ++s) {
    BENCH_CHECK(cudaMalloc(&set[s].qkv, n_qkv * 2));
    BENCH_CHECK(cudaMalloc(&set[s].dqkv, n_qkv * 2));
    BENCH_CHECK(cudaMalloc(&set[s].out, n_out * 2));
    BENCH_CHECK(cudaMalloc(&set[s].dout, n_out * 2));
    BENCH_CHECK(cudaMalloc(&set[s].stats, size_t(sh.B) * sh.NH * sh.T * 4));
    std::vector<uint16_t> h = RandomBf16(n_qkv, 3 * s + 1);
    BENCH_CHECK(cudaMemcpy(set[s].qkv, h.data(), n_qkv * 2, cudaMemcpyHostToDevice));
    h = RandomBf16(n_out, 3 * s + 2);
    BENCH_CHECK(cudaMemcpy(set[s].dout, h.data(), n_out * 2, cudaMemcpyHostToDevice));
    // The backward reads the forward's out and stats.
    BENCH_CHECK(AttentionForward(set[s].out, set[s].stats, set[s].qkv, sh.B, sh.T, C, sh.NH, 0));
  }
  Scratch scratch;
  const double fwd_flop = 2.0 * sh.B * sh.NH * double(sh.T) * sh.T * sh.HS;
  const double bwd_flop = 2.5 * fwd_flop;

  auto forward = [&](AttentionKernel kernel) {
    return MedianMs(warmup, iters, [&](int i) {
      const Buffers& b = set[i % kSets];
      BENCH_CHECK(AttentionForward(b.out, b.stats, b.qkv, sh.B, sh.T, C, sh.NH, 0, kernel));
    });
  };
  const double fwd_mma = forward(AttentionKernel::kMmaSync);
  const bool wgmma = AttentionWgmmaAvailable();
  const double fwd_wgmma = wgmma ? forward(AttentionKernel::kWgmma) : NAN;
  const double fwd = wgmma ? fwd_wgmma : fwd_mma;  // what the backend runs
  // The pipelined wgmma forwards (AttentionFwdVariant), and whether their outputs and
  // statistics are the plain one's bits (they should be: the same operations reordered).
  double fwd_piped[2] = {NAN, NAN};
  size_t piped_differ[2] = {0, 0};
  if (wgmma) {
    const AttentionFwdVariant variants[2] = {AttentionFwdVariant::kPipelined,
                                             AttentionFwdVariant::kPipelinedOneBlock};
    const Buffers& b = set[0];
    auto read = [&] {
      std::vector<uint16_t> o(n_out);
      std::vector<float> st(size_t(sh.B) * sh.NH * sh.T);
      BENCH_CHECK(cudaDeviceSynchronize());
      BENCH_CHECK(cudaMemcpy(o.data(), b.out, n_out * 2, cudaMemcpyDeviceToHost));
      BENCH_CHECK(cudaMemcpy(st.data(), b.stats, st.size() * 4, cudaMemcpyDeviceToHost));
      std::vector<uint32_t> bits(o.begin(), o.end());
      for (float f : st) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        bits.push_back(u);
      }
      return bits;
    };
    BENCH_CHECK(AttentionForward(b.out, b.stats, b.qkv, sh.B, sh.T, C, sh.NH, 0,
                                 AttentionKernel::kWgmma));
    const std::vector<uint32_t> plain = read();
    for (int v = 0; v < 2; ++v) {
      BENCH_CHECK(cudaMemset(b.out, 0xff, n_out * 2));
      BENCH_CHECK(AttentionForward(b.out, b.stats, b.qkv, sh.B, sh.T, C, sh.NH, 0,
                                   AttentionKernel::kWgmma, variants[v]));
      const std::vector<uint32_t> got = read();
      for (size_t i = 0; i < got.size(); ++i) piped_differ[v] += got[i] != plain[i];
      fwd_piped[v] = MedianMs(warmup, iters, [&](int i) {
        const Buffers& bi = set[i % kSets];
        BENCH_CHECK(AttentionForward(bi.out, bi.stats, bi.qkv, sh.B, sh.T, C, sh.NH, 0,
                                     AttentionKernel::kWgmma, variants[v]));
      });
    }
    // The backward below reads set[0]'s forward: make it the plain one's again (same bits).
    BENCH_CHECK(AttentionForward(b.out, b.stats, b.qkv, sh.B, sh.T, C, sh.NH, 0));
  }
  // FP8 training's projection input: the wgmma forward then CastFp8 (E4M3, statistics), against
  // the forward casting its own output (AttentionFp8Cast); the codes compared once.
  double fwd_cast = NAN, fwd_fused = NAN;
  size_t codes_differ = 0;
  if (wgmma) {
    uint8_t* codes[2];
    float* f8;  // scale at 0, amaxes at 64 and 65
    unsigned long long* counts;
    BENCH_CHECK(cudaMalloc(&codes[0], n_out));
    BENCH_CHECK(cudaMalloc(&codes[1], n_out));
    BENCH_CHECK(cudaMalloc(&f8, 512));
    BENCH_CHECK(cudaMalloc(&counts, 6 * sizeof(unsigned long long)));
    const float scale = 64.f;
    BENCH_CHECK(cudaMemcpy(f8, &scale, 4, cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMemset(f8 + 64, 0, 8));
    auto apart = [&](int i) {
      const Buffers& b = set[i % kSets];
      BENCH_CHECK(AttentionForward(b.out, b.stats, b.qkv, sh.B, sh.T, C, sh.NH, 0,
                                   AttentionKernel::kWgmma));
      BENCH_CHECK(CastFp8(codes[0], nullptr, b.out, sh.B * sh.T, C, true, f8, f8 + 64, counts, 0));
    };
    const AttentionFp8Cast cast{codes[1], f8, f8 + 65, counts + 3};
    auto fused = [&](int i) {
      const Buffers& b = set[i % kSets];
      BENCH_CHECK(AttentionForwardSm90(b.out, b.stats, b.qkv, sh.B, sh.T, C, sh.NH, 0, &cast));
    };
    apart(0);
    fused(0);
    BENCH_CHECK(cudaDeviceSynchronize());
    std::vector<uint8_t> h0(n_out), h1(n_out);
    BENCH_CHECK(cudaMemcpy(h0.data(), codes[0], n_out, cudaMemcpyDeviceToHost));
    BENCH_CHECK(cudaMemcpy(h1.data(), codes[1], n_out, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n_out; ++i) codes_differ += h0[i] != h1[i];
    fwd_cast = MedianMs(warmup, iters, apart);
    fwd_fused = MedianMs(warmup, iters, fused);
    for (void* p : {static_cast<void*>(codes[0]), static_cast<void*>(codes[1]),
                    static_cast<void*>(f8), static_cast<void*>(counts)}) {
      BENCH_CHECK(cudaFree(p));
    }
  }
  // Backward per kernel (mma.sync, then wgmma where available) and dQ mode (with wgmma both
  // modes run the same kernels).
  double bwd[2][2] = {{NAN, NAN}, {NAN, NAN}};
  for (int k = 0; k < (wgmma ? 2 : 1); ++k) {
    const AttentionKernel kernel = k ? AttentionKernel::kWgmma : AttentionKernel::kMmaSync;
    for (int det = 0; det < 2; ++det) {
      if (k == 1 && det == 0) continue;  // wgmma: both modes run the same two kernels
      bwd[k][det] = MedianMs(warmup, iters, [&](int i) {
        const Buffers& b = set[i % kSets];
        BENCH_CHECK(AttentionBackward(b.dqkv, b.dout, b.qkv, b.out, b.stats, sh.B, sh.T, C, sh.NH,
                                      det == 1, scratch, 0, kernel));
      });
    }
  }
  // wgmma with dQ from the stored dS (AttentionDq::kStoredDs), and its scratch's size.
  double bwd_stored = NAN;
  if (wgmma) {
    bwd_stored = MedianMs(warmup, iters, [&](int i) {
      const Buffers& b = set[i % kSets];
      BENCH_CHECK(AttentionBackward(b.dqkv, b.dout, b.qkv, b.out, b.stats, sh.B, sh.T, C, sh.NH,
                                    true, scratch, 0, AttentionKernel::kWgmma,
                                    AttentionDq::kStoredDs));
    });
  }
  char shape[96];
  std::snprintf(shape, sizeof shape, "%s B=%d T=%d NH=%d HS=%d", sh.name, sh.B, sh.T, sh.NH, sh.HS);
  const struct {
    const char* pass;
    double ms, flop;
  } rows[] = {{"forward, mma.sync", fwd_mma, fwd_flop},
              {"forward, wgmma", fwd_wgmma, fwd_flop},
              {"fwd pipelined, wgmma", fwd_piped[0], fwd_flop},
              {"fwd pipelined 1 block", fwd_piped[1], fwd_flop},
              {"bwd atomic dQ, mma.sync", bwd[0][0], bwd_flop},
              {"bwd determ., mma.sync", bwd[0][1], bwd_flop},
              {"bwd (both modes), wgmma", bwd[1][1], bwd_flop},
              {"bwd stored dS, wgmma", bwd_stored, bwd_flop},
              {"fwd + CastFp8, wgmma", fwd_cast, fwd_flop},
              {"fwd casting FP8, wgmma", fwd_fused, fwd_flop}};
  for (const auto& r : rows) {
    if (std::isnan(r.ms)) continue;  // wgmma where the device has none
    std::printf("%-32s %-24s %9.3f %12.2f %9.1f\n", shape, r.pass, r.ms, r.ms * sh.layers,
                r.flop / (r.ms * 1e-3) / 1e12);
  }
  if (wgmma) {
    std::printf("%-32s %-24s %zu codes differ between the two FP8 rows\n", shape, "", codes_differ);
    std::printf("%-32s %-24s %zu / %zu values differ from the plain forward (pipelined / 1 block)\n",
                shape, "", piped_differ[0], piped_differ[1]);
    std::printf("%-32s %-24s %.1f MiB of scratch with the stored dS\n", shape, "",
                double(scratch.capacity()) / (1 << 20));
  }
  const double bwd_used = !wgmma                                        ? bwd[0][0]
                          : AttentionDqDefault(sh.HS) == AttentionDq::kStoredDs ? bwd_stored
                                                                          : bwd[1][1];
  std::printf("%-32s %-24s %9.3f %12.2f\n", shape, "fwd + bwd (as trained)", fwd + bwd_used,
              (fwd + bwd_used) * sh.layers);
  for (Buffers& b : set) {
    cudaFree(b.qkv);
    cudaFree(b.dqkv);
    cudaFree(b.out);
    cudaFree(b.dout);
    cudaFree(b.stats);
  }
}

}  // namespace
}  // namespace boulder::kernels::cuda

int main(int argc, char** argv) {
  CLI::App app{"Times the causal flash attention kernels"};
  std::string shape = "all";
  int iters = 30, warmup = 5;
  app.add_option("--shape", shape, "all, seed, gpt2 or h2048")
      ->check(CLI::IsMember({"all", "seed", "gpt2", "h2048"}));
  app.add_option("--iters", iters, "timed calls per pass (median reported)")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed calls first")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "attention_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# %s, %d SMs; median of %d calls after %d warm-up; ms/step = ms/call × layers\n",
              prop.name, prop.multiProcessorCount, iters, warmup);
  std::printf("%-32s %-24s %9s %12s %9s\n", "shape", "pass", "ms/call", "ms/step", "TFLOP/s");
  for (const auto& sh : boulder::kernels::cuda::kShapes) {
    if (shape == "all" || shape == sh.name) boulder::kernels::cuda::Run(sh, warmup, iters);
  }
  return 0;
}
