// LayerNorm over the last dimension of inp[N,C] (eps 1e-5, as GPT-2).
//
// Forward, per row: mean, then the variance of (x - mean) (two passes: no cancellation),
// rstd = 1/sqrt(var + eps), out = (x - mean) * rstd * weight + bias. mean and rstd are saved
// as FP32 for the backward.
//
// Backward, per row (llm.c's formulation), with norm = (x - mean) * rstd, g = weight * dout:
//   dinp += rstd * (g - mean(g) - norm * mean(g * norm))     (accumulates: residual stream)
//   dweight += Σ_rows norm * dout,  dbias += Σ_rows dout       (parameter grads: +=)
// The FP64 instantiation recomputes mean and rstd from inp in FP64 (FP32 statistics would
// limit its gradients to ~1e-7 relative accuracy, and it exists for finite differences).
// Rows run in parallel; the weight and bias grads are summed per fixed chunk of rows and the
// chunks combined in order, so the result does not depend on the thread count.
#ifndef BOULDER_KERNELS_CPU_LAYERNORM_H_
#define BOULDER_KERNELS_CPU_LAYERNORM_H_

namespace boulder::kernels::cpu {

inline constexpr double kLayerNormEps = 1e-5;

template <typename S>
void LayerNormForward(int threads, S* out, float* mean, float* rstd, const S* inp, const S* weight,
                      const S* bias, int N, int C);

// LayerNormForward's out again from its saved statistics (FP8 training's backward recomputes
// a LayerNorm's output it did not keep): bit-identical to the out LayerNormForward wrote for
// the same inp, weight and bias. FP32 uses mean and rstd as saved; FP64 recomputes them from
// inp (its saved FP32 statistics are rounded), as the backward does.
template <typename S>
void LayerNormFromStats(int threads, S* out, const S* inp, const float* mean, const float* rstd,
                        const S* weight, const S* bias, int N, int C);

template <typename S>
void LayerNormBackward(int threads, S* dinp, S* dweight, S* dbias, const S* dout, const S* inp,
                       const S* weight, const float* mean, const float* rstd, int N, int C);

}  // namespace boulder::kernels::cpu

#endif  // BOULDER_KERNELS_CPU_LAYERNORM_H_
