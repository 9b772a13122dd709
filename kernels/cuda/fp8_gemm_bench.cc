// fp8_gemm_bench: our Hopper FP8 GEMM (fp8_gemm_sm90.h) against cuBLASLt's (LtMatmul, autotuned
// as CudaBackend runs it) on every FP8 GEMM of one training step of the benchmark workloads:
// per Linear (qkv, attention projection, fc1, fc2) the forward (E4M3 · E4M3, bias, fast
// accumulation), the data gradient (E5M2 · E4M3) and the weight gradient (E5M2 · E4M3,
// accumulating), with the operand layouts of worker/engine/model_fp8.cc.
//
// Per shape: ms per call (median of --reps after warm-up, CUDA events) and TFLOP/s of cuBLASLt
// and of our kernel with each tile and (fast accumulation) the ping-pong kernel, and how far our
// kAuto output is from cuBLASLt's (relative L2 and the largest difference over the largest
// magnitude); per workload the FP8 GEMM time of one
// step with cuBLASLt, with our kernel everywhere, with the best of the two per shape, and with
// Fp8GemmSm90Preferred's choice. Then fc1's forward with fc2's input cast: the GEMM (cuBLASLt,
// ours) followed by GeluCastFp8 against our GEMM casting it in its epilogue (Fp8GemmGeluCast,
// kAuto and ping-pong tiles), the fused codes checked against the unfused ones.
//
//   fp8_gemm_bench [--workloads seed,gpt2,h2048] [--reps 30]
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "kernels/cuda/bench_check.h"
#include "kernels/cuda/fp8_gelu_ops.h"
#include "kernels/cuda/fp8_gemm_sm90.h"
#include "kernels/cuda/matmul.h"

namespace {

using boulder::kernels::cuda::Fp8GemmGeluCast;
using boulder::kernels::cuda::Fp8GemmSm90;
using boulder::kernels::cuda::Fp8GemmSm90Available;
using boulder::kernels::cuda::Fp8GemmSm90Preferred;
using boulder::kernels::cuda::Fp8GemmTile;
using boulder::kernels::cuda::Fp8TnShape;
using boulder::kernels::cuda::GemmShape;
using boulder::kernels::cuda::LtMatmul;

struct Call {
  std::string name;
  int M, N, K;
  bool a_e4m3, b_e4m3, bias, accumulate, fast;
  int count;  // per step
};

struct Workload {
  std::string name;
  int tokens, C, F, layers;
};

std::vector<Call> StepCalls(const Workload& w) {
  std::vector<Call> calls;
  auto linear = [&](const std::string& n, int C, int OC) {
    calls.push_back({n + " fwd", w.tokens, OC, C, true, true, true, false, true, w.layers});
    calls.push_back({n + " dgrad", w.tokens, C, OC, false, true, false, false, false, w.layers});
    calls.push_back({n + " wgrad", OC, C, w.tokens, false, true, false, true, false, w.layers});
  };
  linear("qkv", w.C, 3 * w.C);
  linear("proj", w.C, w.C);
  linear("fc1", w.C, w.F);
  linear("fc2", w.F, w.C);
  return calls;
}

template <typename F>
float MedianMs(F&& run, int reps, cudaStream_t s) {
  cudaEvent_t a, b;
  BENCH_CHECK(cudaEventCreate(&a));
  BENCH_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) run();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    BENCH_CHECK(cudaEventRecord(a, s));
    run();
    BENCH_CHECK(cudaEventRecord(b, s));
    BENCH_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  BENCH_CHECK(cudaEventDestroy(a));
  BENCH_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<float> Download(const __nv_bfloat16* p, size_t n) {
  std::vector<__nv_bfloat16> h(n);
  BENCH_CHECK(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = __bfloat162float(h[i]);
  return f;
}

// fc1's forward (M tokens × F, k = C) and fc2's input cast (GELU, E4M3, statistics), per call:
// separately (cuBLASLt or our GEMM, then GeluCastFp8) and fused in our GEMM's epilogue.
void FusedGelu(const Workload& w, LtMatmul& lt, cudaStream_t stream, int reps, std::mt19937& rng) {
  const int M = w.tokens, N = w.F, K = w.C;
  const size_t na = size_t(M) * K, nb = size_t(N) * K, no = size_t(M) * N;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint8_t> ha(na), hb(nb);
  for (auto& x : ha) x = __nv_fp8_e4m3(nd(rng) * 8.f).__x;
  for (auto& x : hb) x = __nv_fp8_e4m3(nd(rng) * 8.f).__x;
  std::vector<__nv_bfloat16> hbias(N);
  for (auto& x : hbias) x = __float2bfloat16(nd(rng));
  uint8_t *a, *b, *codes[2];
  __nv_bfloat16 *bias, *pre;
  float* scalars;              // a's scale_inv at 0, b's at 64, the cast's scale at 128, amaxes
  unsigned long long* counts;  // 2 × 3
  BENCH_CHECK(cudaMalloc(&a, na));
  BENCH_CHECK(cudaMalloc(&b, nb));
  BENCH_CHECK(cudaMalloc(&codes[0], no));
  BENCH_CHECK(cudaMalloc(&codes[1], no));
  BENCH_CHECK(cudaMalloc(&bias, N * 2));
  BENCH_CHECK(cudaMalloc(&pre, no * 2));
  BENCH_CHECK(cudaMalloc(&scalars, 1024));
  BENCH_CHECK(cudaMalloc(&counts, 6 * sizeof(unsigned long long)));
  BENCH_CHECK(cudaMemcpy(a, ha.data(), na, cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(b, hb.data(), nb, cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(bias, hbias.data(), N * 2, cudaMemcpyHostToDevice));
  const float hs[3] = {0.05f, 0.02f, 16.f};
  BENCH_CHECK(cudaMemcpy(scalars, hs, 4, cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(scalars + 64, hs + 1, 4, cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(scalars + 128, hs + 2, 4, cudaMemcpyHostToDevice));
  float* amax = scalars + 192;  // [0]: unfused, [1]: fused
  GemmShape s = Fp8TnShape(M, N, K, true, true);
  s.epilogue = CUBLASLT_EPILOGUE_BIAS;
  s.fast_accum = true;
  auto cast = [&](int k) {
    BENCH_CHECK(boulder::kernels::cuda::GeluCastFp8(
        codes[k], nullptr, pre, M, N, true, scalars + 128, amax + k, counts + 3 * k, stream));
  };
  auto run_lt = [&] {
    absl::Status st = lt.Run(s, b, a, pre, bias, nullptr, stream, scalars + 64, scalars);
    if (!st.ok()) {
      std::fprintf(stderr, "cuBLASLt: %s\n", std::string(st.message()).c_str());
      std::exit(1);
    }
    cast(0);
  };
  auto run_own = [&] {
    BENCH_CHECK(Fp8GemmSm90(pre, a, true, scalars, b, true, scalars + 64, bias, M, N, K, false,
                            true, stream, Fp8GemmTile::kAuto));
    cast(0);
  };
  auto run_fused = [&](Fp8GemmTile tile) {
    const Fp8GemmGeluCast g{codes[1], scalars + 128, amax + 1, counts + 3};
    BENCH_CHECK(Fp8GemmSm90(pre, a, true, scalars, b, true, scalars + 64, bias, M, N, K, false,
                            true, stream, tile, &g));
  };
  // The codes and statistics of one call each, from zeroed statistics.
  BENCH_CHECK(cudaMemsetAsync(amax, 0, 8, stream));
  BENCH_CHECK(cudaMemsetAsync(counts, 0, 6 * sizeof(unsigned long long), stream));
  run_own();
  run_fused(Fp8GemmTile::kAuto);
  BENCH_CHECK(cudaStreamSynchronize(stream));
  std::vector<uint8_t> c0(no), c1(no);
  BENCH_CHECK(cudaMemcpy(c0.data(), codes[0], no, cudaMemcpyDeviceToHost));
  BENCH_CHECK(cudaMemcpy(c1.data(), codes[1], no, cudaMemcpyDeviceToHost));
  float hamax[2];
  unsigned long long hcounts[6];
  BENCH_CHECK(cudaMemcpy(hamax, amax, 8, cudaMemcpyDeviceToHost));
  BENCH_CHECK(cudaMemcpy(hcounts, counts, sizeof hcounts, cudaMemcpyDeviceToHost));
  size_t differ = 0;
  for (size_t i = 0; i < no; ++i) differ += c0[i] != c1[i];
  const bool same_stats = hamax[0] == hamax[1] && hcounts[0] == hcounts[3] &&
                          hcounts[1] == hcounts[4] && hcounts[2] == hcounts[5];
  const float t_lt = MedianMs(run_lt, reps, stream), t_own = MedianMs(run_own, reps, stream);
  const float t_cast = MedianMs([&] { cast(0); }, reps, stream);
  const float t_fused = MedianMs([&] { run_fused(Fp8GemmTile::kAuto); }, reps, stream);
  const float t_pp = MedianMs([&] { run_fused(Fp8GemmTile::kPingPong); }, reps, stream);
  std::printf(
      "%s fc1 fwd + fc2 input cast (%dx%d k=%d), ms per call: cuBLASLt+GeluCastFp8 %.4f, "
      "own+GeluCastFp8 %.4f (the cast alone %.4f), fused auto %.4f, fused ping-pong %.4f; "
      "per step (x%d) fused auto saves %.3f ms over own+GeluCastFp8; codes differing %zu, "
      "statistics %s (saturated %llu, underflow %llu)\n",
      w.name.c_str(), M, N, K, t_lt, t_own, t_cast, t_fused, t_pp, w.layers,
      w.layers * (t_own - t_fused), differ, same_stats ? "identical" : "DIFFER", hcounts[0],
      hcounts[1]);
  for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(codes[0]),
                  static_cast<void*>(codes[1]), static_cast<void*>(bias), static_cast<void*>(pre),
                  static_cast<void*>(scalars), static_cast<void*>(counts)}) {
    BENCH_CHECK(cudaFree(p));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Times our Hopper FP8 GEMM against cuBLASLt's on every FP8 GEMM of a step"};
  std::string wanted = "seed,gpt2,h2048";
  int reps = 30;
  app.add_option("--workloads", wanted, "comma-separated: seed, gpt2, h2048");
  app.add_option("--reps", reps, "timed calls per shape (median reported)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (!Fp8GemmSm90Available()) {
    std::fprintf(stderr, "fp8_gemm_bench: our FP8 GEMM needs compute capability 9.0 (sm_90a)\n");
    return 1;
  }
  const std::vector<Workload> all = {{"seed", 32 * 256, 768, 3072, 12},
                                     {"gpt2", 16 * 1024, 768, 3072, 12},
                                     {"h2048", 8 * 1024, 2048, 8192, 8}};
  auto lt = LtMatmul::Create();
  if (!lt.ok()) {
    std::fprintf(stderr, "%s\n", std::string(lt.status().message()).c_str());
    return 1;
  }
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreate(&stream));
  cudaDeviceProp prop;
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("fp8_gemm_bench on %s (%d SMs), median of %d calls, ms per call\n", prop.name,
              prop.multiProcessorCount, reps);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);

  for (const Workload& w : all) {
    if (wanted.find(w.name) == std::string::npos) continue;
    std::printf("\n%s (tokens %d, C %d, F %d, %d layers)\n", w.name.c_str(), w.tokens, w.C, w.F,
                w.layers);
    std::printf("%-12s %6s %6s %6s | %8s %6s | %8s %6s | %8s %6s | %9s %6s | %9s %9s\n", "gemm",
                "M", "N", "K", "cublasLt", "TF/s", "own auto", "TF/s", "own 128", "TF/s",
                "ping-pong", "TF/s", "rel L2", "max/|max|");
    double step_lt = 0, step_own = 0, step_best = 0, step_pref = 0;
    for (const Call& c : StepCalls(w)) {
      const size_t na = size_t(c.M) * c.K, nb = size_t(c.N) * c.K, nd_ = size_t(c.M) * c.N;
      std::vector<uint8_t> ha(na), hb(nb);
      // Codes of N(0, 1) values times a spread (E5M2 gradients smaller), as the casts make.
      for (auto& x : ha) {
        x = c.a_e4m3 ? __nv_fp8_e4m3(nd(rng) * 8.f).__x : __nv_fp8_e5m2(nd(rng) * 1e-3f).__x;
      }
      for (auto& x : hb) x = __nv_fp8_e4m3(nd(rng) * 8.f).__x;
      std::vector<__nv_bfloat16> hbias(c.N), hinit(nd_);
      for (auto& x : hbias) x = __float2bfloat16(nd(rng));
      for (auto& x : hinit) x = __float2bfloat16(nd(rng));
      uint8_t *a, *b;
      __nv_bfloat16 *bias, *d_lt, *d_own, *init;
      float* scales;
      BENCH_CHECK(cudaMalloc(&a, na));
      BENCH_CHECK(cudaMalloc(&b, nb));
      BENCH_CHECK(cudaMalloc(&bias, c.N * 2));
      BENCH_CHECK(cudaMalloc(&d_lt, nd_ * 2));
      BENCH_CHECK(cudaMalloc(&d_own, nd_ * 2));
      BENCH_CHECK(cudaMalloc(&init, nd_ * 2));
      BENCH_CHECK(
          cudaMalloc(&scales, 512));  // a's at 0, b's at 256 bytes (cuBLASLt wants them aligned)
      const float hs[2] = {c.a_e4m3 ? 0.05f : 40.f, 0.02f};
      BENCH_CHECK(cudaMemcpy(a, ha.data(), na, cudaMemcpyHostToDevice));
      BENCH_CHECK(cudaMemcpy(b, hb.data(), nb, cudaMemcpyHostToDevice));
      BENCH_CHECK(cudaMemcpy(bias, hbias.data(), c.N * 2, cudaMemcpyHostToDevice));
      BENCH_CHECK(cudaMemcpy(init, hinit.data(), nd_ * 2, cudaMemcpyHostToDevice));
      BENCH_CHECK(cudaMemcpy(scales, hs, 4, cudaMemcpyHostToDevice));
      BENCH_CHECK(cudaMemcpy(scales + 64, hs + 1, 4, cudaMemcpyHostToDevice));
      // cuBLASLt as CudaBackend::MatmulFp8 calls it (column-major outᵀ = bᵀ(T) · a).
      GemmShape s = Fp8TnShape(c.M, c.N, c.K, c.a_e4m3, c.b_e4m3);
      s.epilogue = c.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
      s.accumulate = c.accumulate;
      s.fast_accum = c.fast;
      auto run_lt = [&] {
        absl::Status st = (*lt)->Run(s, b, a, d_lt, c.bias ? bias : nullptr, nullptr, stream,
                                     scales + 64, scales);
        if (!st.ok()) {
          std::fprintf(stderr, "cuBLASLt: %s\n", std::string(st.message()).c_str());
          std::exit(1);
        }
      };
      auto run_own = [&](Fp8GemmTile tile) {
        BENCH_CHECK(Fp8GemmSm90(d_own, a, c.a_e4m3, scales, b, c.b_e4m3, scales + 64,
                                c.bias ? bias : nullptr, c.M, c.N, c.K, c.accumulate, c.fast,
                                stream, tile));
      };
      // Correctness first, from the same initial output (accumulating calls add to it).
      BENCH_CHECK(cudaMemcpyAsync(d_lt, init, nd_ * 2, cudaMemcpyDeviceToDevice, stream));
      BENCH_CHECK(cudaMemcpyAsync(d_own, init, nd_ * 2, cudaMemcpyDeviceToDevice, stream));
      run_lt();
      run_own(Fp8GemmTile::kAuto);
      BENCH_CHECK(cudaStreamSynchronize(stream));
      const std::vector<float> want = Download(d_lt, nd_), got = Download(d_own, nd_);
      double num = 0, den = 0, maxdiff = 0, maxref = 0;
      for (size_t i = 0; i < nd_; ++i) {
        const double e = double(got[i]) - want[i];
        num += e * e;
        den += double(want[i]) * want[i];
        maxdiff = std::max(maxdiff, std::fabs(e));
        maxref = std::max(maxref, std::fabs(double(want[i])));
      }
      const float t_lt = MedianMs(run_lt, reps, stream);
      const float t_auto = MedianMs([&] { run_own(Fp8GemmTile::kAuto); }, reps, stream);
      const float t128 = MedianMs([&] { run_own(Fp8GemmTile::kN128); }, reps, stream);
      // The ping-pong kernel takes fast accumulation only (split calls would time kN128 again).
      const float tpp =
          c.fast ? MedianMs([&] { run_own(Fp8GemmTile::kPingPong); }, reps, stream) : NAN;
      const double flop = 2.0 * c.M * c.N * c.K;
      auto tf = [&](float ms) { return flop / (ms * 1e-3) / 1e12; };
      std::printf(
          "%-12s %6d %6d %6d | %8.4f %6.0f | %8.4f %6.0f | %8.4f %6.0f | %9.4f %6.0f | %9.2e "
          "%9.2e\n",
          c.name.c_str(), c.M, c.N, c.K, t_lt, tf(t_lt), t_auto, tf(t_auto), t128, tf(t128), tpp,
          tf(tpp), std::sqrt(num / den), maxdiff / maxref);
      const float t_own = t_auto;
      step_lt += c.count * t_lt;
      step_own += c.count * t_own;
      step_best += c.count * std::min({t_lt, t_auto, t128, c.fast ? tpp : t128});
      step_pref += c.count * (Fp8GemmSm90Preferred(c.M, c.N, c.K, c.fast) ? t_own : t_lt);
      for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(bias),
                      static_cast<void*>(d_lt), static_cast<void*>(d_own), static_cast<void*>(init),
                      static_cast<void*>(scales)}) {
        BENCH_CHECK(cudaFree(p));
      }
    }
    std::printf(
        "%s FP8 GEMMs per step: cuBLASLt %.3f ms, own (kAuto tile) %.3f, best per shape "
        "%.3f, Fp8GemmSm90Preferred %.3f\n",
        w.name.c_str(), step_lt, step_own, step_best, step_pref);
    FusedGelu(w, **lt, stream, reps, rng);
  }
  return 0;
}
