// Fused softmax + cross-entropy over logits[N,Vp] whose first V columns are real.
//
// Per row (parallel over rows), numerically stable: m = max of the V logits,
// lse = m + log Σ exp(l_j - m), losses[row] = lse - l[target] (FP32). The logits row is then
// overwritten in place with its gradient (softmax - onehot(target)) * dloss; the padding
// columns [V, Vp) take no part in the softmax and receive 0.
//
// A target outside [0, V) (the engine validates data, so this is a bug upstream) does not
// crash and does not read out of bounds: that row's loss is NaN, which the step reports, and
// its gradient row is 0.
#ifndef BOULDER_KERNELS_CPU_CROSSENTROPY_H_
#define BOULDER_KERNELS_CPU_CROSSENTROPY_H_

#include <cstdint>

namespace boulder::kernels::cpu {

// REQUIRES: 1 <= V <= Vp.
template <typename S>
void SoftmaxCrossEntropy(int threads, float* losses, S* logits, const int32_t* targets, int N,
                         int V, int Vp, float dloss);

}  // namespace boulder::kernels::cpu

#endif  // BOULDER_KERNELS_CPU_CROSSENTROPY_H_
