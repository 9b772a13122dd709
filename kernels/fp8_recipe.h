// The delayed-scaling update of one FP8 tensor (Transformer Engine's DelayedScaling recipe),
// written once for the CPU backend and the CUDA kernel so both give bit-identical scales.
//
// Per tensor: an amax history h[0..H-1], h[0] the most recent step. After a step:
//   1. roll:   h[j] = h[j-1] for j = H-1..1; h[0] = the step's amax; the step's amax = 0;
//   2. amax:   max over h (NaN if any entry is NaN) for "max", h[0] for "most_recent";
//   3. scale:  (fp8_max / amax) / 2^margin, in FP32, each operation correctly rounded;
//              kept unchanged when amax is 0, inf or NaN, or when that scale is not a finite
//              normal number (an amax so small or large the scale overflows or underflows:
//              a subnormal scale would make 1 / scale infinite);
//   4. scale_inv = 1 / scale (what the GEMMs multiply FP8 products by).
//
// Bit-exactness needs IEEE division and no flush-to-zero: the CUDA file including this is
// compiled without --use_fast_math.
#ifndef BOULDER_KERNELS_FP8_RECIPE_H_
#define BOULDER_KERNELS_FP8_RECIPE_H_

#include <cfloat>
#include <cmath>

#include "kernels/host_device.h"

namespace boulder::kernels {

// Largest finite magnitudes of the two OCP FP8 formats.
inline constexpr float kFp8E4M3Max = 448.0f;
inline constexpr float kFp8E5M2Max = 57344.0f;

// Max of an amax history; NaN as soon as one entry is NaN (inf wins over finite values).
BOULDER_HD inline float Fp8HistoryMax(const float* h, int len) {
  float m = 0.0f;
  for (int j = 0; j < len; ++j) {
    const float v = h[j];
    if (v != v) return v;
    m = v > m ? v : m;
  }
  return m;
}

// Step 3 above: the new scale from an amax, or `prev` when it would not be usable.
BOULDER_HD inline float Fp8ScaleFromAmax(float amax, float prev, float fp8_max, int margin) {
  if (!(amax > 0.0f) || !(amax <= FLT_MAX)) return prev;  // 0, negative, inf, NaN
  const float s = ldexpf(fp8_max / amax, -margin);
  if (!(s >= FLT_MIN) || !(s <= FLT_MAX)) return prev;  // keeps 1 / scale finite
  return s;
}

// Steps 1-4 for tensor i of a set whose histories are rows of `history` ([n, len]).
BOULDER_HD inline void Fp8UpdateOne(int i, float* scale, float* scale_inv, int scale_inv_stride,
                                    float* history, float* amax, const float* fp8_max, int len,
                                    bool use_history_max, int margin) {
  float* h = history + static_cast<long long>(i) * len;
  for (int j = len - 1; j > 0; --j) h[j] = h[j - 1];
  h[0] = amax[i];
  amax[i] = 0.0f;
  const float a = use_history_max ? Fp8HistoryMax(h, len) : h[0];
  const float s = Fp8ScaleFromAmax(a, scale[i], fp8_max[i], margin);
  scale[i] = s;
  scale_inv[static_cast<long long>(i) * scale_inv_stride] = 1.0f / s;
}

}  // namespace boulder::kernels

#endif  // BOULDER_KERNELS_FP8_RECIPE_H_
