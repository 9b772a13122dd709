// One AdamW step over a flat parameter buffer (decoupled weight decay, as PyTorch's AdamW and
// llm.c), element-wise and parallel over contiguous ranges:
//   g = grad * grad_scale * clip
//   m = beta1 m + (1 - beta1) g,   v = beta2 v + (1 - beta2) g²
//   w -= lr (m / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps) + wd w)
// with wd = weight_decay where decay.bits is null or bit decay.offset + i is set (DecayBits,
// kernels/backend.h), else 0, and
// clip = min(1, max_norm / sqrt(*norm_sq)) when max_norm > 0 (1 when the norm is 0 or not a
// number: a NaN gradient then shows up as NaN parameters rather than being hidden).
// w is master[i] when master is non-null (params[i] then receives the updated master),
// else params[i].
#ifndef BOULDER_KERNELS_CPU_ADAMW_H_
#define BOULDER_KERNELS_CPU_ADAMW_H_

#include <cstddef>
#include <cstdint>

#include "kernels/backend.h"

namespace boulder::kernels::cpu {

struct AdamWParams {
  float lr = 0;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0;
  int t = 1;  // 1-based step, for the bias corrections
  float grad_scale = 1;
  const float* norm_sq = nullptr;  // REQUIRES: non-null when max_norm > 0
  float max_norm = 0;
};

template <typename S>
void AdamW(int threads, S* params, S* master, const S* grads, S* m, S* v, DecayBits decay, size_t n,
           const AdamWParams& p);

}  // namespace boulder::kernels::cpu

#endif  // BOULDER_KERNELS_CPU_ADAMW_H_
