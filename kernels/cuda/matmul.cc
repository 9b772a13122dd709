#include "kernels/cuda/matmul.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/check.h"

namespace boulder::kernels::cuda {

absl::StatusOr<std::unique_ptr<LtMatmul>> LtMatmul::Create() {
  std::unique_ptr<LtMatmul> mm(new LtMatmul());
  CUBLAS_CHECK(cublasLtCreate(&mm->handle_));
  CUDA_CHECK(cudaMalloc(&mm->workspace_, kWorkspaceBytes));
  return mm;
}

LtMatmul::~LtMatmul() {
  for (auto& [shape, plan] : plans_) {
    cublasLtMatrixLayoutDestroy(plan->a);
    cublasLtMatrixLayoutDestroy(plan->b);
    cublasLtMatrixLayoutDestroy(plan->d);
    cublasLtMatmulDescDestroy(plan->desc);
  }
  if (workspace_) cudaFree(workspace_);
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
  if (s.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || s.epilogue == CUBLASLT_EPILOGUE_GELU_AUX) {
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
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b, plan->d, plan->d,
                                        pref, 1, &result, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  CUBLAS_CHECK(st);
  if (found == 0) {
    return absl::InternalError(absl::StrCat("cuBLASLt has no algorithm for m=", s.m, " n=", s.n,
                                            " k=", s.k, " epilogue=", s.epilogue, " types ",
                                            s.a_type, "/", s.b_type));
  }
  plan->algo = result.algo;
  Plan* raw = plan.get();
  plans_.emplace(s, std::move(plan));
  return raw;
}

absl::Status LtMatmul::Run(const GemmShape& s, const void* A, const void* B, void* D,
                           const void* bias, void* aux, cudaStream_t stream, const float* a_scale,
                           const float* b_scale) {
  absl::StatusOr<Plan*> plan = GetPlan(s);
  if (!plan.ok()) return plan.status();
  Plan* p = *plan;
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
  const float alpha = 1.f, beta = s.accumulate ? 1.f : 0.f;
  CUBLAS_CHECK(cublasLtMatmul(handle_, p->desc, &alpha, A, p->a, B, p->b, &beta, D, p->d, D,
                              p->d, &p->algo, workspace_, kWorkspaceBytes, stream));
  return absl::OkStatus();
}

}  // namespace boulder::kernels::cuda
