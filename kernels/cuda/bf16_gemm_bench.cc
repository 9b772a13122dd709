// bf16_gemm_bench: our Hopper BF16 GEMM (bf16_gemm_sm90.h) against cuBLASLt's (LtMatmul,
// autotuned as CudaBackend runs it) on the Linear forwards of the benchmark workloads: qkv, the
// attention projection and fc2 with the bias epilogue, fc1 with the bias and with GELU_AUX_BIAS
// (the pre-activation and GELU both written), in CudaBackend::MatmulForward's layout.
//
// Per shape: ms per call (median of --reps after warm-up, CUDA events) and TFLOP/s of cuBLASLt
// and of our kernel with each tile, and how far our outputs (kAuto) are from cuBLASLt's
// (relative L2 and the largest difference over the largest magnitude, worst tile); per workload the
// forward GEMM time of one step with cuBLASLt, with ours, and with the faster per shape.
//
//   bf16_gemm_bench [--workloads seed,gpt2,h2048] [--reps 30]
#include <cuda_bf16.h>
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
#include "kernels/cuda/bf16_gemm_sm90.h"
#include "kernels/cuda/matmul.h"

namespace {

using boulder::kernels::cuda::Bf16GemmSm90;
using boulder::kernels::cuda::Bf16GemmSm90Available;
using boulder::kernels::cuda::Bf16GemmTile;
using boulder::kernels::cuda::GemmShape;
using boulder::kernels::cuda::LtMatmul;
using bf16 = __nv_bfloat16;

struct Workload {
  std::string name;
  int tokens, C, F, layers;
};

struct Call {
  std::string name;
  int M, N, K;  // out[M, N] = a[M, K] · b[N, K]ᵀ + bias
  bool gelu;
  int count;
};

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

std::vector<float> Download(const bf16* p, size_t n) {
  std::vector<bf16> h(n);
  BENCH_CHECK(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = __bfloat162float(h[i]);
  return f;
}

// Relative L2 distance and the largest difference over the largest |want|.
void Compare(const std::vector<float>& got, const std::vector<float>& want, double* rel,
             double* worst) {
  double num = 0, den = 0, big = 0, diff = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = double(got[i]) - want[i];
    if (!std::isfinite(got[i])) diff = INFINITY;
    num += e * e;
    den += double(want[i]) * want[i];
    big = std::max(big, std::fabs(double(want[i])));
    diff = std::max(diff, std::fabs(e));
  }
  *rel = std::sqrt(num / std::max(den, 1e-30));
  *worst = diff / std::max(big, 1e-30);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Our Hopper BF16 GEMM against cuBLASLt on the Linear forwards"};
  std::string wanted = "seed,gpt2,h2048";
  int reps = 30;
  app.add_option("--workloads", wanted, "comma-separated: seed, gpt2, h2048");
  app.add_option("--reps", reps, "timed calls each (median reported)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (!Bf16GemmSm90Available()) {
    std::fprintf(stderr, "bf16_gemm_bench: needs an sm_90 GPU and an sm_90a build\n");
    return 1;
  }
  auto lt = LtMatmul::Create();
  if (!lt.ok()) {
    std::fprintf(stderr, "%s\n", std::string(lt.status().message()).c_str());
    return 1;
  }
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreate(&stream));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  const std::vector<Workload> all = {{"seed", 32 * 256, 768, 3072, 4},
                                     {"gpt2", 16 * 1024, 768, 3072, 12},
                                     {"h2048", 8 * 1024, 2048, 8192, 8}};
  for (const Workload& w : all) {
    if (wanted.find(w.name) == std::string::npos) continue;
    const std::vector<Call> calls = {{"qkv", w.tokens, 3 * w.C, w.C, false, w.layers},
                                     {"proj", w.tokens, w.C, w.C, false, w.layers},
                                     {"fc1", w.tokens, w.F, w.C, false, 0},
                                     {"fc1+gelu", w.tokens, w.F, w.C, true, w.layers},
                                     {"fc2", w.tokens, w.C, w.F, false, w.layers}};
    std::printf("== %s (tokens %d, C %d, F %d, layers %d)\n", w.name.c_str(), w.tokens, w.C, w.F,
                w.layers);
    std::printf("%-9s %6s %6s %6s %9s %9s %9s %9s %9s %7s %7s %9s %9s\n", "gemm", "M", "N", "K",
                "cublasLt", "ours", "ours256", "ours128", "pingpong", "lt TF", "best TF", "relL2",
                "maxdiff");
    double step_lt = 0, step_ours = 0, step_best = 0;
    for (const Call& c : calls) {
      const size_t na = size_t(c.M) * c.K, nb = size_t(c.N) * c.K, no = size_t(c.M) * c.N;
      std::vector<bf16> ha(na), hb(nb), hbias(c.N);
      const float sb = 1.f / std::sqrt(float(c.K));
      for (auto& x : ha) x = __float2bfloat16(nd(rng));
      for (auto& x : hb) x = __float2bfloat16(nd(rng) * sb);
      for (auto& x : hbias) x = __float2bfloat16(nd(rng));
      bf16 *a, *b, *bias, *out_lt, *aux_lt, *out, *gelu;
      BENCH_CHECK(cudaMalloc(&a, na * 2));
      BENCH_CHECK(cudaMalloc(&b, nb * 2));
      BENCH_CHECK(cudaMalloc(&bias, c.N * 2));
      for (bf16** p : {&out_lt, &aux_lt, &out, &gelu}) BENCH_CHECK(cudaMalloc(p, no * 2));
      BENCH_CHECK(cudaMemcpy(a, ha.data(), na * 2, cudaMemcpyHostToDevice));
      BENCH_CHECK(cudaMemcpy(b, hb.data(), nb * 2, cudaMemcpyHostToDevice));
      BENCH_CHECK(cudaMemcpy(bias, hbias.data(), c.N * 2, cudaMemcpyHostToDevice));
      // CudaBackend::MatmulForward's shape: column-major outᵀ[N, M] = bᵀ · a.
      GemmShape s;
      s.trans_a = true;
      s.m = c.N;
      s.n = c.M;
      s.k = c.K;
      s.lda = c.K;
      s.ldb = c.K;
      s.ldd = c.N;
      s.epilogue = c.gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS;
      // GELU_AUX_BIAS: D = GELU, aux = the pre-activation.
      auto run_lt = [&] {
        absl::Status st = (*lt)->Run(s, b, a, out_lt, bias, c.gelu ? aux_lt : nullptr, stream);
        if (!st.ok()) {
          std::fprintf(stderr, "cuBLASLt: %s\n", std::string(st.message()).c_str());
          std::exit(1);
        }
      };
      auto run_ours = [&](Bf16GemmTile tile) {
        BENCH_CHECK(Bf16GemmSm90(out, c.gelu ? gelu : nullptr, a, b, bias, c.M, c.N, c.K, stream,
                                 tile));
      };
      run_lt();  // autotunes
      BENCH_CHECK(cudaStreamSynchronize(stream));
      const float t_lt = MedianMs(run_lt, reps, stream);
      const float t_auto = MedianMs([&] { run_ours(Bf16GemmTile::kAuto); }, reps, stream);
      const float t_256 = c.N % 256 == 0
                              ? MedianMs([&] { run_ours(Bf16GemmTile::kN256); }, reps, stream)
                              : NAN;
      const float t_128 = MedianMs([&] { run_ours(Bf16GemmTile::kN128); }, reps, stream);
      const float t_pp = MedianMs([&] { run_ours(Bf16GemmTile::kPingPong); }, reps, stream);
      const float t_ours = std::min({t_auto, t_128, t_pp, std::isnan(t_256) ? t_auto : t_256});
      // Outputs of every tile against cuBLASLt's: the pre-activation (the plain output without
      // GELU) and, with GELU, GELU; the worst over the tiles is printed.
      double rel = 0, worst = 0;
      for (Bf16GemmTile tile : {Bf16GemmTile::kN256, Bf16GemmTile::kN128, Bf16GemmTile::kPingPong}) {
        for (bf16* p : {out, gelu}) BENCH_CHECK(cudaMemset(p, 0xff, no * 2));  // NaN
        run_ours(tile);
        BENCH_CHECK(cudaStreamSynchronize(stream));
        double r = 0, w = 0;
        Compare(Download(out, no), Download(c.gelu ? aux_lt : out_lt, no), &r, &w);
        rel = std::max(rel, r);
        worst = std::max(worst, w);
        if (c.gelu) {
          Compare(Download(gelu, no), Download(out_lt, no), &r, &w);
          rel = std::max(rel, r);
          worst = std::max(worst, w);
        }
      }
      const double flop = 2.0 * c.M * c.N * c.K;
      std::printf("%-9s %6d %6d %6d %9.4f %9.4f %9.4f %9.4f %9.4f %7.0f %7.0f %9.2e %9.2e\n",
                  c.name.c_str(), c.M, c.N, c.K, t_lt, t_auto, t_256, t_128, t_pp,
                  flop / t_lt / 1e9, flop / t_ours / 1e9, rel, worst);
      step_lt += c.count * t_lt;
      step_ours += c.count * t_ours;
      step_best += c.count * std::min(t_lt, t_ours);
      for (bf16* p : {a, b, bias, out_lt, aux_lt, out, gelu}) BENCH_CHECK(cudaFree(p));
    }
    std::printf("%s: forward GEMMs per step: cuBLASLt %.3f ms, ours (best tile) %.3f ms, faster per shape %.3f ms\n",
                w.name.c_str(), step_lt, step_ours, step_best);
  }
  return 0;
}
