// Greedy decoding: the index of each row's largest logit among the first V columns of
// logits[N,Vp] (the first one on ties; NaNs are never chosen over a number). Parallel over
// rows.
#ifndef BOULDER_KERNELS_CPU_ARGMAX_H_
#define BOULDER_KERNELS_CPU_ARGMAX_H_

#include <cstdint>

namespace boulder::kernels::cpu {

// REQUIRES: 1 <= V <= Vp.
template <typename S>
void Argmax(int threads, int32_t* out, const S* logits, int N, int V, int Vp);

}  // namespace boulder::kernels::cpu

#endif  // BOULDER_KERNELS_CPU_ARGMAX_H_
