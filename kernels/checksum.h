// The term of the replica checksum (kernels::ChecksumHost, Backend::Checksum) for 32-bit word
// `w` at word index `i`: SplitMix64's finalizer of w ^ (i * golden ratio). Shared by host and
// device code.
#ifndef BOULDER_KERNELS_CHECKSUM_H_
#define BOULDER_KERNELS_CHECKSUM_H_

#include <cstdint>

#include "kernels/host_device.h"

namespace boulder::kernels {

BOULDER_HD inline uint64_t ChecksumTerm(uint32_t w, uint64_t i) {
  uint64_t z = static_cast<uint64_t>(w) ^ (i * 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace boulder::kernels

#endif  // BOULDER_KERNELS_CHECKSUM_H_
