// Token + position embedding.
//
// Forward: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:], parallel over rows.
// Backward: dwte += scatter-add of dout by token, dwpe += sum of dout over the batch
// (parameter grads use +=). Parallel over channel blocks: each thread owns a slice of
// channels of both tables and walks the rows in order, so there are no atomics and the
// result does not depend on the thread count.
//
// REQUIRES: 0 <= tokens[i] < rows of wte (the engine validates tokens); wpe has >= T rows.
#ifndef BOULDER_KERNELS_CPU_ENCODER_H_
#define BOULDER_KERNELS_CPU_ENCODER_H_

#include <cstdint>

namespace boulder::kernels::cpu {

template <typename S>
void EncoderForward(int threads, S* out, const int32_t* tokens, const S* wte, const S* wpe, int B,
                    int T, int C);

template <typename S>
void EncoderBackward(int threads, S* dwte, S* dwpe, const S* dout, const int32_t* tokens, int B,
                     int T, int C);

}  // namespace boulder::kernels::cpu

#endif  // BOULDER_KERNELS_CPU_ENCODER_H_
