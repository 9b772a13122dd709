#include "kernels/cuda/matmul.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda/check.h"

namespace boulder::kernels::cuda {

GemmShape Fp8TnShape(int M, int N, int K, bool a_e4m3, bool b_e4m3) {
  GemmShape s;
  s.trans_a = true;
  s.m = N;
  s.n = M;
  s.k = K;
  s.lda = K;
  s.ldb = K;
  s.ldd = N;
  s.a_type = b_e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
  s.b_type = a_e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
  return s;
}

namespace {

int PointerAlignment(const void* p) {
  if (p == nullptr) return 256;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int align = 1;
  while (align < 256 && (a % (2 * align)) == 0) align *= 2;
  return align;
}

const char* TypeName(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_16BF: return "bf16";
    case CUDA_R_8F_E4M3: return "e4m3";
    case CUDA_R_8F_E5M2: return "e5m2";
    default: return "other";
  }
}

}  // namespace

std::string LtMatmul::Describe(const GemmShape& s) {
  return absl::StrCat("m=", s.m, " n=", s.n, " k=", s.k, " op(A)=", s.trans_a ? "T" : "N",
                      " op(B)=", s.trans_b ? "T" : "N", " lda=", s.lda, " ldb=", s.ldb,
                      " ldd=", s.ldd, " A ", TypeName(s.a_type), " B ", TypeName(s.b_type),
                      " D bf16, epilogue ", static_cast<int>(s.epilogue),
                      s.accumulate ? ", beta 1" : ", beta 0", s.fast_accum ? ", fast accum" : "",
                      ", alignment A/B/D/bias ", s.align_a, "/", s.align_b, "/", s.align_d, "/",
                      s.align_bias, " bytes");
}

absl::StatusOr<std::unique_ptr<LtMatmul>> LtMatmul::Create() {
  std::unique_ptr<LtMatmul> mm(new LtMatmul());
  CUBLAS_CHECK(cublasLtCreate(&mm->handle_));
  for (void*& w : mm->workspace_) CUDA_CHECK(cudaMalloc(&w, kWorkspaceBytes));
  CUDA_CHECK(cudaEventCreate(&mm->start_));
  CUDA_CHECK(cudaEventCreate(&mm->stop_));
  return mm;
}

LtMatmul::~LtMatmul() {
  for (auto& [shape, plan] : plans_) {
    cublasLtMatrixLayoutDestroy(plan->a);
    cublasLtMatrixLayoutDestroy(plan->b);
    cublasLtMatrixLayoutDestroy(plan->d);
    cublasLtMatmulDescDestroy(plan->desc);
  }
  if (start_) cudaEventDestroy(start_);
  if (stop_) cudaEventDestroy(stop_);
  for (void* w : workspace_) {
    if (w) cudaFree(w);
  }
  if (handle_) cublasLtDestroy(handle_);
}

absl::StatusOr<LtMatmul::Plan*> LtMatmul::GetPlan(const GemmShape& s) {
  auto it = plans_.find(s);
  if (it != plans_.end()) return it->second.get();
  auto plan = std::make_unique<Plan>();
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t tb = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                              sizeof(ta)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                              sizeof(tb)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                              &s.epilogue, sizeof(s.epilogue)));
  if (s.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    cudaDataType_t bt = CUDA_R_16BF;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
  if (s.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || s.epilogue == CUBLASLT_EPILOGUE_GELU_AUX ||
      s.epilogue == CUBLASLT_EPILOGUE_DGELU || s.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
    int64_t ld = s.m;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
    cudaDataType_t at = CUDA_R_16BF;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &at, sizeof(at)));
  }
  if (s.a_type != CUDA_R_16BF || s.b_type != CUDA_R_16BF) {
    const int8_t fast = s.fast_accum ? 1 : 0;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                                sizeof(fast)));
  }
  int a_rows = s.trans_a ? s.k : s.m, a_cols = s.trans_a ? s.m : s.k;
  int b_rows = s.trans_b ? s.n : s.k, b_cols = s.trans_b ? s.k : s.n;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, s.a_type, a_rows, a_cols, s.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, s.b_type, b_rows, b_cols, s.ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d, CUDA_R_16BF, s.m, s.n, s.ldd));

  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspaceBytes;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  const struct {
    cublasLtMatmulPreferenceAttributes_t attr;
    uint32_t bytes;
  } aligns[] = {{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t(s.align_a)},
                {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, uint32_t(s.align_b)},
                {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, uint32_t(s.align_d)},
                {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, uint32_t(s.align_d)}};
  for (const auto& a : aligns) {
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulPreferenceSetAttribute(pref, a.attr, &a.bytes, sizeof(a.bytes));
    }
  }
  cublasLtMatmulHeuristicResult_t results[kCandidates];
  int found = 0;
  // Always several candidates: without autotuning the first is used, and the others are the
  // fallbacks when it rejects a call.
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b, plan->d, plan->d,
                                        pref, kCandidates, results, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  // No algorithm (found == 0, or the heuristic calls the configuration unsupported) is kept as
  // a plan without candidates, so that the heuristic is asked once per shape.
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) found = 0, st = CUBLAS_STATUS_SUCCESS;
  CUBLAS_CHECK(st);
  if (found > 0) plan->algo = results[0].algo;
  for (int i = 0; i < found; ++i) plan->candidates.push_back(results[i].algo);
  plan->tuned = found < 2 || !autotune_;
  Plan* raw = plan.get();
  plans_.emplace(s, std::move(plan));
  return raw;
}

absl::Status LtMatmul::Run(const GemmShape& shape, const void* A, const void* B, void* D,
                           const void* bias, void* aux, cudaStream_t stream, const float* a_scale,
                           const float* b_scale, int workspace) {
  absl::StatusOr<bool> ran =
      TryRun(shape, A, B, D, bias, aux, stream, a_scale, b_scale, workspace);
  if (!ran.ok()) return ran.status();
  if (*ran) return absl::OkStatus();
  GemmShape s = shape;
  s.align_a = PointerAlignment(A);
  s.align_b = PointerAlignment(B);
  s.align_d = PointerAlignment(D);
  s.align_bias = PointerAlignment(bias);
  const Plan* p = plans_.at(s).get();
  if (p->candidates.empty()) {
    return absl::InternalError(absl::StrCat("cuBLASLt has no algorithm for ", Describe(s)));
  }
  return absl::InternalError(absl::StrCat(
      "cublasLtMatmul: every one of ", p->candidates.size(), " candidate algorithms rejected ",
      Describe(s),
      a_scale ? absl::StrCat(", scale alignment A/B ", PointerAlignment(a_scale), "/",
                             PointerAlignment(b_scale), " bytes")
              : std::string(),
      " (CUBLAS_STATUS_NOT_SUPPORTED)"));
}

absl::StatusOr<bool> LtMatmul::TryRun(const GemmShape& shape, const void* A, const void* B,
                                      void* D, const void* bias, void* aux, cudaStream_t stream,
                                      const float* a_scale, const float* b_scale,
                                      int workspace) {
  if (workspace != kMainWorkspace && workspace != kSideWorkspace) {
    return absl::InvalidArgumentError(absl::StrCat("LtMatmul: no workspace ", workspace));
  }
  void* const ws = workspace_[workspace];
  GemmShape s = shape;
  s.align_a = PointerAlignment(A);
  s.align_b = PointerAlignment(B);
  s.align_d = PointerAlignment(D);
  s.align_bias = PointerAlignment(bias);
  absl::StatusOr<Plan*> plan = GetPlan(s);
  if (!plan.ok()) return plan.status();
  Plan* p = *plan;
  if (p->candidates.empty()) {
    ++unsupported_;
    return false;
  }
  if (bias != nullptr) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                &bias, sizeof(bias)));
  }
  if (aux != nullptr) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  }
  if (a_scale != nullptr) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                &a_scale, sizeof(a_scale)));
  }
  if (b_scale != nullptr) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                &b_scale, sizeof(b_scale)));
  }
  if (!p->tuned) {
    if (absl::Status st = Tune(s, p, A, B, D, stream, ws); !st.ok()) return st;
  }
  const float alpha = 1.f, beta = s.accumulate ? 1.f : 0.f;
  cublasStatus_t st = cublasLtMatmul(handle_, p->desc, &alpha, A, p->a, B, p->b, &beta, D, p->d,
                                     D, p->d, &p->algo, ws, kWorkspaceBytes, stream);
  if (st != CUBLAS_STATUS_NOT_SUPPORTED) {
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    return CublasStatus(st, absl::StrCat("cublasLtMatmul (", Describe(s), ")").c_str(), __FILE__,
                        __LINE__);
  }
  // The chosen algorithm rejected this call (a rejected call does not launch): fall back, in
  // heuristic order, to the first candidate that accepts it and keep that one for the shape.
  for (const cublasLtMatmulAlgo_t& algo : p->candidates) {
    st = cublasLtMatmul(handle_, p->desc, &alpha, A, p->a, B, p->b, &beta, D, p->d, D, p->d,
                        &algo, ws, kWorkspaceBytes, stream);
    if (st == CUBLAS_STATUS_SUCCESS) {
      p->algo = algo;
      ++fallbacks_;
      return true;
    }
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) {
      return CublasStatus(st, absl::StrCat("cublasLtMatmul (", Describe(s), ")").c_str(),
                          __FILE__, __LINE__);
    }
  }
  ++unsupported_;
  return false;  // every candidate rejected the call: nothing was launched
}

absl::Status LtMatmul::Tune(const GemmShape& s, Plan* p, const void* A, const void* B, void* D,
                            cudaStream_t stream, void* ws) {
  p->tuned = true;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) return absl::OkStatus();  // keep the heuristic's
  // Trial runs write D (and the epilogue's aux) before the real call rewrites them; an
  // accumulating GEMM must not add trials into D, so those time into a scratch output.
  void* out = D;
  if (s.accumulate) {
    CUDA_CHECK(cudaMallocAsync(&out, size_t(s.ldd) * s.n * 2, stream));
    CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(s.ldd) * s.n * 2, stream));
  }
  constexpr int kReps = 3;
  // The call's own beta: an accumulating GEMM is timed accumulating (into the scratch output).
  const float alpha = 1.f, beta = s.accumulate ? 1.f : 0.f;
  float best_ms = 0.f;
  int best = -1;
  absl::Status status;
  for (size_t i = 0; i < p->candidates.size() && status.ok(); ++i) {
    auto run = [&] {
      return cublasLtMatmul(handle_, p->desc, &alpha, A, p->a, B, p->b, &beta, out, p->d, out,
                            p->d, &p->candidates[i], ws, kWorkspaceBytes, stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;  // a candidate may reject these operands
    cudaError_t e = cudaEventRecord(start_, stream);
    for (int r = 0; r < kReps && e == cudaSuccess; ++r) {
      if (run() != CUBLAS_STATUS_SUCCESS) e = cudaErrorUnknown;
    }
    if (e == cudaSuccess) e = cudaEventRecord(stop_, stream);
    if (e == cudaSuccess) e = cudaEventSynchronize(stop_);
    float ms = 0.f;
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, start_, stop_);
    if (e != cudaSuccess) {
      status = CudaStatus(e, "timing a GEMM candidate", __FILE__, __LINE__);
      break;
    }
    if (i == 0) p->top_ms = ms / kReps;
    if (best < 0 || ms < best_ms) best = static_cast<int>(i), best_ms = ms;
  }
  if (s.accumulate) {
    cudaError_t e = cudaFreeAsync(out, stream);
    if (status.ok() && e != cudaSuccess) status = CudaStatus(e, "cudaFreeAsync", __FILE__, __LINE__);
  }
  if (!status.ok()) return status;
  if (best > 0) {
    p->algo = p->candidates[best];
    p->chosen = best;
    p->best_ms = best_ms / kReps;
    ++retuned_;
  }
  return absl::OkStatus();
}

std::string LtMatmul::TuningReport() const {
  std::vector<std::pair<std::string, const Plan*>> moved;
  for (const auto& [s, plan] : plans_) {
    if (plan->chosen == 0) continue;
    moved.emplace_back(absl::StrCat("m=", s.m, " n=", s.n, " k=", s.k, " ", s.trans_a ? "T" : "N",
                                    s.trans_b ? "T" : "N", " ", TypeName(s.a_type), "x",
                                    TypeName(s.b_type), " epilogue ", static_cast<int>(s.epilogue),
                                    s.accumulate ? " +=" : ""),
                       plan.get());
  }
  std::sort(moved.begin(), moved.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  for (const auto& [name, p] : moved) {
    out += absl::StrFormat("  %s: candidate %d of %d, %.4f ms per call (the top pick %.4f)\n", name,
                           p->chosen, static_cast<int>(p->candidates.size()), p->best_ms,
                           p->top_ms);
  }
  return out;
}

}  // namespace boulder::kernels::cuda
