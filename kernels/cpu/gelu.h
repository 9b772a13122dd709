// GELU, tanh approximation (as GPT-2):
//   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
//
// In float, tanh is a clamped rational approximation (Eigen's fast tanh: max error 4.1e-7
// absolute, under 7 ulp) instead of std::tanh: it is branch-free and has no library call, so
// the epilogue loops vectorise. In double, std::tanh: the double backend is the exact
// reference for finite-difference tests.
#ifndef BOULDER_KERNELS_CPU_GELU_H_
#define BOULDER_KERNELS_CPU_GELU_H_

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace boulder::kernels::cpu {

inline float FastTanh(float a) {
  // Beyond the clamp, tanh is within 4e-7 of ±1, which the rational function returns there.
  const float x = std::min(std::max(a, -7.90531110763549805f), 7.90531110763549805f);
  const float x2 = x * x;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  p = p * x;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  const float r = p / q;
  // Near 0 the rational function's relative error grows; tanh(a) rounds to a there.
  return std::fabs(a) < 0.0004f ? a : r;
}

template <typename S>
inline S GeluTanh(S u);
template <>
inline float GeluTanh<float>(float u) {
  return FastTanh(u);
}
template <>
inline double GeluTanh<double>(double u) {
  return std::tanh(u);
}

// Rough scalar-operation count of one Gelu or GeluGrad, for WorthParallel.
inline constexpr size_t kGeluOps = 24;

inline constexpr double kGeluSqrt2OverPi = 0.7978845608028654;  // sqrt(2/pi)
inline constexpr double kGeluCubic = 0.044715;

template <typename S>
inline S Gelu(S x) {
  const S k = static_cast<S>(kGeluSqrt2OverPi);
  const S a = static_cast<S>(kGeluCubic);
  const S u = k * (x + a * x * x * x);
  return S{0.5} * x * (S{1} + GeluTanh<S>(u));
}

template <typename S>
inline S GeluGrad(S x) {
  const S k = static_cast<S>(kGeluSqrt2OverPi);
  const S a = static_cast<S>(kGeluCubic);
  const S u = k * (x + a * x * x * x);
  const S th = GeluTanh<S>(u);
  const S du = k * (S{1} + S{3} * a * x * x);
  return S{0.5} * (S{1} + th) + S{0.5} * x * (S{1} - th * th) * du;
}

}  // namespace boulder::kernels::cpu

#endif  // BOULDER_KERNELS_CPU_GELU_H_
