#include "kernels/cpu/fp8.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/blas.h"
#include "kernels/fp8_recipe.h"

namespace boulder::kernels::cpu {
namespace {

struct Fp8Bits {
  int mantissa_bits;
  int bias;
  float max;
  uint8_t max_code;
};

constexpr Fp8Bits kE4M3 = {3, 7, kFp8E4M3Max, 0x7E};
constexpr Fp8Bits kE5M2 = {2, 15, kFp8E5M2Max, 0x7B};

const Fp8Bits& BitsOf(Fp8Format f) { return f == Fp8Format::kE4M3 ? kE4M3 : kE5M2; }

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace

uint8_t EncodeFp8(float x, Fp8Format format) {
  const Fp8Bits& b = BitsOf(format);
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7F;
  const float a = std::fabs(x);
  if (a >= b.max) return sign | b.max_code;  // saturate (also ±inf)
  const float min_normal = std::ldexp(1.0f, 1 - b.bias);
  if (a < min_normal) {
    // Subnormals are multiples of 2^(1 - bias - mantissa_bits); scaling by a power of two is
    // exact, nearbyint rounds to nearest even. A result of 2^mantissa_bits is the smallest
    // normal's code (exponent field 1, mantissa 0), so it needs no special case.
    const float q = std::nearbyint(std::ldexp(a, b.bias + b.mantissa_bits - 1));
    return sign | static_cast<uint8_t>(q);
  }
  int e = 0;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exponent = e - 1;               // a = (2m) * 2^exponent, 2m in [1, 2)
  float q = std::nearbyint((2.0f * m - 1.0f) * static_cast<float>(1 << b.mantissa_bits));
  if (q == static_cast<float>(1 << b.mantissa_bits)) {
    q = 0.0f;
    ++exponent;
  }
  // a < max, so rounding never passes the max code.
  return sign |
         static_cast<uint8_t>(((exponent + b.bias) << b.mantissa_bits) | static_cast<int>(q));
}

float DecodeFp8(uint8_t code, Fp8Format format) {
  const Fp8Bits& b = BitsOf(format);
  const bool negative = (code & 0x80) != 0;
  const int magnitude = code & 0x7F;
  const int e = magnitude >> b.mantissa_bits;
  const int q = magnitude & ((1 << b.mantissa_bits) - 1);
  float v;
  if (format == Fp8Format::kE4M3 && magnitude == 0x7F) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (format == Fp8Format::kE5M2 && e == 31) {
    v = q == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<float>(q), 1 - b.bias - b.mantissa_bits);
  } else {
    v = std::ldexp(1.0f + std::ldexp(static_cast<float>(q), -b.mantissa_bits), e - b.bias);
  }
  return negative ? -v : v;
}

template <typename S>
void CastFp8(uint8_t* out, uint8_t* out_t, const S* inp, int rows, int cols, Fp8Format format,
             const float* scale, float* amax, uint64_t* counts) {
  const float s = *scale;
  const float max = Fp8Max(format);
  // |x| compared as bit patterns, as the GPU's atomicMax does: NaN (0x7fc...) beats inf.
  uint32_t amax_bits = FloatBits(*amax);
  uint64_t saturated = 0, underflow = 0, non_finite = 0;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const float x = static_cast<float>(inp[static_cast<size_t>(r) * cols + c]);
      const float y = x * s;
      const uint8_t q = EncodeFp8(y, format);
      if (out != nullptr) out[static_cast<size_t>(r) * cols + c] = q;
      if (out_t != nullptr) out_t[static_cast<size_t>(c) * rows + r] = q;
      const uint32_t ab = FloatBits(std::fabs(x));
      if (ab > amax_bits) amax_bits = ab;
      if (!std::isfinite(x)) {
        ++non_finite;
      } else {
        if (std::fabs(y) > max) ++saturated;
        if (x != 0.0f && (q & 0x7F) == 0) ++underflow;
      }
    }
  }
  *amax = BitsFloat(amax_bits);
  counts[kFp8Saturated] += saturated;
  counts[kFp8Underflow] += underflow;
  counts[kFp8NonFinite] += non_finite;
}

template <typename S>
void MatmulFp8(int threads, S* out, const uint8_t* a, Fp8Format a_format, float a_scale_inv,
               const uint8_t* b, Fp8Format b_format, float b_scale_inv, const S* bias, int M, int N,
               int K, bool accumulate) {
  // Decoding through a 256-entry table per operand: the scaled value of every code.
  auto table = [](Fp8Format f, float scale_inv) {
    std::vector<S> t(256);
    for (int c = 0; c < 256; ++c) {
      t[c] = static_cast<S>(DecodeFp8(static_cast<uint8_t>(c), f) * scale_inv);
    }
    return t;
  };
  const std::vector<S> ta = table(a_format, a_scale_inv), tb = table(b_format, b_scale_inv);
  std::vector<S> A(static_cast<size_t>(M) * K), B(static_cast<size_t>(N) * K);
  for (size_t i = 0; i < A.size(); ++i) A[i] = ta[a[i]];
  for (size_t i = 0; i < B.size(); ++i) B[i] = tb[b[i]];
  Gemm(threads, false, true, M, N, K, S(1), A.data(), K, B.data(), K, accumulate ? S(1) : S(0), out,
       N);
  if (bias != nullptr && !accumulate) {
    for (int r = 0; r < M; ++r) {
      for (int c = 0; c < N; ++c) out[static_cast<size_t>(r) * N + c] += bias[c];
    }
  }
}

void Fp8ScaleUpdate(float* scale, float* scale_inv, int scale_inv_stride, float* history,
                    float* amax, const float* fp8_max, int n, int history_len,
                    bool use_history_max, int margin) {
  for (int i = 0; i < n; ++i) {
    Fp8UpdateOne(i, scale, scale_inv, scale_inv_stride, history, amax, fp8_max, history_len,
                 use_history_max, margin);
  }
}

template void CastFp8<float>(uint8_t*, uint8_t*, const float*, int, int, Fp8Format, const float*,
                             float*, uint64_t*);
template void CastFp8<double>(uint8_t*, uint8_t*, const double*, int, int, Fp8Format, const float*,
                              float*, uint64_t*);
template void MatmulFp8<float>(int, float*, const uint8_t*, Fp8Format, float, const uint8_t*,
                               Fp8Format, float, const float*, int, int, int, bool);
template void MatmulFp8<double>(int, double*, const uint8_t*, Fp8Format, float, const uint8_t*,
                                Fp8Format, float, const double*, int, int, int, bool);

}  // namespace boulder::kernels::cpu
