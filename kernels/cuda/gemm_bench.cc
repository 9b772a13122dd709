// gemm_bench: how much step time the cuBLASLt heuristic's first algorithm leaves on the table.
//
// For every BF16 GEMM of one training step of the benchmark workloads (Linear forward, data
// gradient and weight gradient of qkv, attention projection, fc1, fc2 and the LM head, in the
// layouts kernels/cuda/cuda_backend.cc uses), times the heuristic's top algorithm and each of
// its next candidates (up to 16) with CUDA events, and prints per shape the top-1 time, the
// best time and TFLOP/s, then per workload the GEMM time of one step with top-1 vs the best.
// Forward GEMMs are also timed with the BIAS epilogue (and fc1's with GELU_AUX_BIAS), as
// variants not counted in the step total.
//
//   gemm_bench [--workloads seed,gpt2,h2048] [--reps 20]
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "kernels/cuda/bench_check.h"

namespace {

#define CKB(call)                                                        \
  do {                                                                   \
    cublasStatus_t e = (call);                                           \
    if (e != CUBLAS_STATUS_SUCCESS) {                                    \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
                   cublasLtGetStatusName(e));                            \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)

struct Gemm {
  std::string name;
  bool ta, tb;
  int m, n, k;
  bool accumulate;
  int count;  // how many times one step runs it (0: a variant, not counted in the step)
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
};

struct Workload {
  std::string name;
  int N, C, F, V, layers;
};

// The three GEMMs of a Linear inp[N,C]·W[OC,C]ᵀ, column-major as the backend issues them.
void AddLinear(std::vector<Gemm>* out, const std::string& what, int N, int C, int OC, int count) {
  out->push_back({what + " fwd", true, false, OC, N, C, false, count});
  out->push_back({what + " fwd+b", true, false, OC, N, C, false, 0, CUBLASLT_EPILOGUE_BIAS});
  if (what == "fc1") {
    out->push_back(
        {what + " fwd+g", true, false, OC, N, C, false, 0, CUBLASLT_EPILOGUE_GELU_AUX_BIAS});
  }
  out->push_back({what + " dinp", false, false, C, N, OC, false, count});
  out->push_back({what + " dW", false, true, C, OC, N, true, count});
}

constexpr size_t kWorkspace = 32 << 20;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Times cuBLASLt's candidate algorithms on every GEMM of a step"};
  std::string wanted = "seed,gpt2,h2048";
  int reps = 20;
  app.add_option("--workloads", wanted, "comma-separated: seed, gpt2, h2048");
  app.add_option("--reps", reps, "timed calls each (median reported)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  const std::vector<Workload> all = {{"seed", 32 * 256, 768, 3072, 128, 4},
                                     {"gpt2", 16 * 1024, 768, 3072, 50304, 12},
                                     {"h2048", 8 * 1024, 2048, 8192, 128, 8}};
  cublasLtHandle_t lt;
  CKB(cublasLtCreate(&lt));
  void* ws;
  BENCH_CHECK(cudaMalloc(&ws, kWorkspace));
  cudaEvent_t e0, e1;
  BENCH_CHECK(cudaEventCreate(&e0));
  BENCH_CHECK(cudaEventCreate(&e1));

  for (const Workload& w : all) {
    if (wanted.find(w.name) == std::string::npos) continue;
    std::vector<Gemm> gemms;
    AddLinear(&gemms, "qkv", w.N, w.C, 3 * w.C, w.layers);
    AddLinear(&gemms, "proj", w.N, w.C, w.C, w.layers);
    AddLinear(&gemms, "fc1", w.N, w.C, w.F, w.layers);
    AddLinear(&gemms, "fc2", w.N, w.F, w.C, w.layers);
    AddLinear(&gemms, "head", w.N, w.C, w.V, 1);
    std::printf("== %s (N=%d C=%d F=%d Vp=%d layers=%d)\n", w.name.c_str(), w.N, w.C, w.F, w.V,
                w.layers);
    std::printf("%-10s %6s %6s %6s %9s %9s %5s %8s %8s\n", "gemm", "m", "n", "k", "top1 ms",
                "best ms", "algo", "top1 TF", "best TF");
    double step_top1 = 0, step_best = 0;
    for (const Gemm& g : gemms) {
      const int ar = g.ta ? g.k : g.m, ac = g.ta ? g.m : g.k;
      const int br = g.tb ? g.n : g.k, bc = g.tb ? g.k : g.n;
      void *A, *B, *D;
      BENCH_CHECK(cudaMalloc(&A, size_t(ar) * ac * 2));
      BENCH_CHECK(cudaMalloc(&B, size_t(br) * bc * 2));
      BENCH_CHECK(cudaMalloc(&D, size_t(g.m) * g.n * 2));
      BENCH_CHECK(cudaMemset(A, 0x3c, size_t(ar) * ac * 2));  // bf16 ~0.0115: finite, non-zero
      BENCH_CHECK(cudaMemset(B, 0x3c, size_t(br) * bc * 2));
      BENCH_CHECK(cudaMemset(D, 0, size_t(g.m) * g.n * 2));
      cublasLtMatmulDesc_t desc;
      CKB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      cublasOperation_t ta = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                        tb = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
      CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
      CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
      void *bias = nullptr, *aux = nullptr;
      if (g.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epilogue,
                                           sizeof(g.epilogue)));
        cudaDataType_t bt = CUDA_R_16BF;
        CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                           sizeof(bt)));
        BENCH_CHECK(cudaMalloc(&bias, size_t(g.m) * 2));
        BENCH_CHECK(cudaMemset(bias, 0, size_t(g.m) * 2));
        CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                           sizeof(bias)));
      }
      if (g.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
        int64_t ld = g.m;
        CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                           sizeof(ld)));
        cudaDataType_t at = CUDA_R_16BF;
        CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &at,
                                           sizeof(at)));
        BENCH_CHECK(cudaMalloc(&aux, size_t(g.m) * g.n * 2));
        CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                           sizeof(aux)));
      }
      cublasLtMatrixLayout_t la, lb, ld;
      CKB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ar, ac, ar));
      CKB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, br, bc, br));
      CKB(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, g.m, g.n, g.m));
      cublasLtMatmulPreference_t pref;
      CKB(cublasLtMatmulPreferenceCreate(&pref));
      size_t wsb = kWorkspace;
      CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                               sizeof(wsb)));
      cublasLtMatmulHeuristicResult_t res[16];
      int found = 0;
      CKB(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 16, res, &found));
      const float alpha = 1.f, beta = g.accumulate ? 1.f : 0.f;
      double top1 = -1, best = 1e30;
      int best_i = -1;
      for (int i = 0; i < found; ++i) {
        auto run = [&] {
          return cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &res[i].algo,
                                ws, kWorkspace, 0);
        };
        if (run() != CUBLAS_STATUS_SUCCESS) continue;
        for (int r = 0; r < 2; ++r) run();
        BENCH_CHECK(cudaEventRecord(e0));
        for (int r = 0; r < reps; ++r) run();
        BENCH_CHECK(cudaEventRecord(e1));
        BENCH_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        BENCH_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        const double per = ms / reps;
        if (i == 0) top1 = per;
        if (per < best) best = per, best_i = i;
      }
      const double flop = 2.0 * g.m * g.n * g.k;
      std::printf("%-10s %6d %6d %6d %9.3f %9.3f %5d %8.0f %8.0f\n", g.name.c_str(), g.m, g.n, g.k,
                  top1, best, best_i, flop / top1 / 1e9, flop / best / 1e9);
      step_top1 += top1 * g.count;
      step_best += best * g.count;
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(la);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(ld);
      cublasLtMatmulDescDestroy(desc);
      BENCH_CHECK(cudaFree(A));
      BENCH_CHECK(cudaFree(B));
      BENCH_CHECK(cudaFree(D));
      if (bias) BENCH_CHECK(cudaFree(bias));
      if (aux) BENCH_CHECK(cudaFree(aux));
    }
    std::printf("%s: GEMM time per step: heuristic top-1 %.2f ms, best candidate %.2f ms\n",
                w.name.c_str(), step_top1, step_best);
  }
  return 0;
}
