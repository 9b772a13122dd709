// Linear layers: out[N,OC] = epilogue(inp[N,C] · weight[OC,C]ᵀ + bias[OC]).
//
// Forward: one GEMM (no transposed copies: the weight's row-major [OC,C] layout is read as
// Bᵀ), then a single pass that adds the bias and, for Epilogue::kGelu, stores the
// pre-activation in pre_gelu and the GELU in out. For kGelu the GEMM writes straight into
// pre_gelu.
//
// Backward, given dout[N,OC]:
//   - when pre_gelu is non-null, dout *= gelu'(pre_gelu) in place (dout becomes the
//     pre-activation gradient), fused with dbias += Σ_rows dout (when dbias is non-null);
//   - dinp = dout · weight        (=, skipped when dinp is null: activation grad)
//   - dweight += doutᵀ · inp      (+=: parameter grad)
// The fused pass runs over column blocks, each summing its columns over the rows in order,
// so dbias does not depend on the thread count. GEMMs go through Gemm (blas.h).
#ifndef BOULDER_KERNELS_CPU_MATMUL_H_
#define BOULDER_KERNELS_CPU_MATMUL_H_

#include "kernels/backend.h"

namespace boulder::kernels::cpu {

// REQUIRES: pre_gelu non-null when epilogue is kGelu; bias may be null.
template <typename S>
void MatmulForward(int threads, S* out, S* pre_gelu, const S* inp, const S* weight, const S* bias,
                   int N, int C, int OC, Epilogue epilogue);

// dinp, dbias, pre_gelu and dweight may be null. dweight += doutᵀ·inp, or = when
// overwrite_dweight.
template <typename S>
void MatmulBackward(int threads, S* dinp, S* dweight, S* dbias, S* dout, const S* pre_gelu,
                    const S* inp, const S* weight, int N, int C, int OC,
                    bool overwrite_dweight = false);

}  // namespace boulder::kernels::cpu

#endif  // BOULDER_KERNELS_CPU_MATMUL_H_
