// FP8 on the CPU: an exact emulation of the OCP E4M3 / E5M2 formats (the encoding NVIDIA's
// cvt.rn.satfinite produces), the cast with its statistics, the emulated FP8 GEMM and the
// delayed-scaling update (kernels/fp8_recipe.h). See kernels/backend.h for the contracts.
//
// Encoding: round to nearest even; finite magnitudes beyond the format's max (and ±inf)
// saturate to ±max; NaN becomes 0x7F with the input's sign. Subnormals are exact.
#ifndef BOULDER_KERNELS_CPU_FP8_H_
#define BOULDER_KERNELS_CPU_FP8_H_

#include <cstddef>
#include <cstdint>

#include "kernels/backend.h"

namespace boulder::kernels::cpu {

uint8_t EncodeFp8(float x, Fp8Format format);
float DecodeFp8(uint8_t code, Fp8Format format);

template <typename S>
void CastFp8(uint8_t* out, uint8_t* out_t, const S* inp, int rows, int cols, Fp8Format format,
             const float* scale, float* amax, uint64_t* counts);

// The GEMM of Backend::MatmulFp8: decodes both operands to S, scales them and multiplies
// with Gemm (blas.h). fast_accum has no effect on the CPU.
template <typename S>
void MatmulFp8(int threads, S* out, const uint8_t* a, Fp8Format a_format, float a_scale_inv,
               const uint8_t* b, Fp8Format b_format, float b_scale_inv, const S* bias, int M, int N,
               int K, bool accumulate);

void Fp8ScaleUpdate(float* scale, float* scale_inv, int scale_inv_stride, float* history,
                    float* amax, const float* fp8_max, int n, int history_len,
                    bool use_history_max, int margin);

}  // namespace boulder::kernels::cpu

#endif  // BOULDER_KERNELS_CPU_FP8_H_
