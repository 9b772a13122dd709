// FP32 master weights kept as two 16-bit halves: the BF16 working weight (the high half,
// rounded) and a 16-bit word of the low bits. Together they hold the FP32 value exactly, so
// AdamW moves 2 bytes per parameter less (it reads and writes the BF16 weight it must write
// anyway, plus 2 bytes instead of 4) and the master copy takes 2 bytes per parameter instead
// of 4.
//
// Split: lo = the FP32 bits' low 16; hi = the high 16, plus one when lo >= 0x8000. On the
// sign-magnitude bits that is round to nearest with ties away from zero (a float's magnitude
// grows with its bit pattern), so hi is the nearest BF16 to the master: the working weight
// differs from round-to-nearest-even only on exact ties (lo == 0x8000 with an even high half,
// 1 in 65536 values), by one BF16 unit. Join undoes it: bits = ((hi - (lo >= 0x8000)) << 16) |
// lo, exact for every finite value and infinity (a finite value past BF16's largest rounds hi
// to infinity and joins back to itself). A NaN master splits into a quiet NaN hi with lo = 0
// (so the working weight is NaN too, never a number made of a NaN's payload) and joins back to
// a NaN.
#ifndef BOULDER_KERNELS_SPLIT_MASTER_H_
#define BOULDER_KERNELS_SPLIT_MASTER_H_

#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace boulder::kernels {

BOULDER_HD inline uint32_t FloatBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
#endif
}

BOULDER_HD inline float BitsFloat(uint32_t b) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
#endif
}

// hi: the BF16 bits of the working weight; lo: the master's low word.
BOULDER_HD inline void SplitMaster(float master, uint16_t* hi, uint16_t* lo) {
  const uint32_t b = FloatBits(master);
  if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu) != 0) {  // NaN
    *hi = static_cast<uint16_t>((b >> 16) | 0x0040u);
    *lo = 0;
    return;
  }
  *lo = static_cast<uint16_t>(b & 0xffffu);
  *hi = static_cast<uint16_t>((b >> 16) + (*lo >= 0x8000u ? 1u : 0u));
}

BOULDER_HD inline float JoinMaster(uint16_t hi, uint16_t lo) {
  const uint32_t high = (static_cast<uint32_t>(hi) - (lo >= 0x8000u ? 1u : 0u)) & 0xffffu;
  return BitsFloat((high << 16) | lo);
}

}  // namespace boulder::kernels

#endif  // BOULDER_KERNELS_SPLIT_MASTER_H_
