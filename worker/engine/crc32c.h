// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of checkpoint files.
// Uses the SSE4.2 crc32 instruction when the CPU has it, else a table; both give the same
// value (Crc32c("123456789") == 0xE3069283).
//
// Thread-safe: pure functions.
#ifndef BOULDER_WORKER_ENGINE_CRC32C_H_
#define BOULDER_WORKER_ENGINE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace boulder::engine {

// Extends `crc` (the value of the bytes before, 0 for none) over `n` bytes at `data`.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

// The table implementation alone (for tests comparing the two).
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_CRC32C_H_
