// The emulated GPU's Hopper asynchronous machinery for fp8_gemm_sm90.cuh (TMA loads and
// stores of 128-byte-swizzled boxes, mbarriers with transaction counts, bulk groups, named
// barrier arrivals, FP8 wgmma from shared-memory descriptors), on top of emulated_gpu.h.
// Included once per test binary, after emulated_gpu.h and before fp8_gemm_sm90.cuh.
#ifndef BOULDER_KERNELS_CUDA_EMULATED_GPU_TMA_H_
#define BOULDER_KERNELS_CUDA_EMULATED_GPU_TMA_H_

#include "kernels/cuda/emulated_gpu.h"

// ---- fp8_gemm_sm90.cuh's primitives: mbarriers, TMA, bulk groups, FP8 wgmma -------------
//
// A tensor map (CUtensorMap, opaque on the GPU) is, here, the fields EncodeEmulatedMap writes:
// a 2-D row-major tensor and its box, with the 128-byte swizzle. TMA loads land when issued
// and complete their bytes on the barrier then; TMA stores run at the bulk-group wait that
// covers them. An mbarrier is a phase counter with pending arrivals and a transaction count.

namespace boulder::kernels::cuda::fp8gemm {

using emu::Die;

struct EmulatedMap {
  const unsigned char* ptr;
  uint64_t cols, rows, stride, box_cols, box_rows, elem;
};
void EncodeEmulatedMap(CUtensorMap* map, const void* ptr, uint64_t cols, uint64_t rows,
                       uint64_t elem, uint64_t box_cols, uint64_t box_rows) {
  static_assert(sizeof(EmulatedMap) <= sizeof(CUtensorMap), "the fields fit");
  if (box_cols * elem != 128) Die("tensor map: a box row must be 128 bytes (the swizzle span)");
  const EmulatedMap m{
      static_cast<const unsigned char*>(ptr), cols, rows, cols * elem, box_cols, box_rows, elem};
  std::memcpy(map, &m, sizeof m);
}
EmulatedMap MapOf(const CUtensorMap* map) {
  EmulatedMap m;
  std::memcpy(&m, map, sizeof m);
  return m;
}
// The shared address of byte c of box row r for a box at `at` (128-byte swizzle).
uint32_t BoxByte(uint32_t at, int r, int c) {
  uint32_t addr = at + r * 128 + c;
  return addr ^ (((addr >> 7) & 7u) << 4);
}

// With g_late_loads, a TMA load lands (its bytes copied, its transaction completed) only when a
// thread waits on its barrier's phase, so a read of a stage without that wait sees the stage's
// old contents; otherwise it lands when issued, so a refill of a stage freed too early lands
// under the products still reading it.
bool g_late_loads = false;
struct Load {
  uint32_t dst;
  EmulatedMap map;  // a copy: the producer's kernel parameters may be gone when it lands
  int x, y;
};
struct Mbar {
  int expected = 0, pending = 0;
  int64_t tx = 0;
  uint64_t phase = 0;       // completed phases
  std::vector<Load> loads;  // g_late_loads: issued, not landed
  uint64_t events = 0;      // phases completed and loads issued: what waiters wait on
};
std::map<uint32_t, Mbar> g_mbars;  // by shared address; cleared per block
Mbar& MbarAt(uint32_t bar) {
  auto it = g_mbars.find(bar);
  if (it == g_mbars.end()) Die("mbarrier used before mbarrier.init");
  return it->second;
}
void MaybeComplete(Mbar& m) {
  if (m.pending == 0 && m.tx == 0) {
    ++m.phase;
    ++m.events;
    m.pending = m.expected;
  }
}

uint32_t SharedBase() { return attn::SmemAddr(attn::smem); }
void FenceMbarrierInit() {}
void PrefetchTensorMap(const CUtensorMap*) {}
void MbarInit(uint32_t bar, int count) {
  if (bar % 8 != 0 || bar + 8 > emu::g_block.smem_bytes) Die("mbarrier outside shared memory");
  Mbar m;
  m.expected = m.pending = count;
  g_mbars[bar] = m;
}
void Land(const Load& l, Mbar& b);
// try_wait.parity succeeds once the phase of that parity has completed.
void MbarWait(uint32_t bar, uint32_t parity) {
  Mbar& m = MbarAt(bar);
  while ((m.phase & 1) == parity) {
    if (!m.loads.empty()) {
      std::vector<Load> loads;
      loads.swap(m.loads);
      for (const Load& l : loads) Land(l, m);
      continue;
    }
    emu::WaitWhile(&m.events, m.events);
  }
}
void MbarArrive(uint32_t bar) {
  Mbar& m = MbarAt(bar);
  if (m.pending <= 0) Die("mbarrier: more arrivals than its count");
  --m.pending;
  MaybeComplete(m);
}
void MbarExpectTx(uint32_t bar, uint32_t bytes) {
  MbarAt(bar).tx += bytes;
  MbarArrive(bar);
}
void TmaLoad(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
  const EmulatedMap m = MapOf(map);
  if (dst % 1024 != 0) Die("TMA load: a 128-byte-swizzled box must start 1024-byte aligned");
  if (x < 0 || y < 0 || uint64_t(x) + m.box_cols > m.cols || uint64_t(y) + m.box_rows > m.rows) {
    Die("TMA load: box outside the tensor (not emulated)");
  }
  if (dst + m.box_rows * 128 > emu::g_block.smem_bytes) Die("TMA load outside shared memory");
  Mbar& b = MbarAt(bar);
  if (g_late_loads) {
    b.loads.push_back({dst, m, x, y});
    ++b.events;  // a waiter lands it
  } else {
    Land({dst, m, x, y}, b);
  }
}
void Land(const Load& l, Mbar& b) {
  const EmulatedMap& m = l.map;
  for (uint64_t r = 0; r < m.box_rows; ++r) {
    for (int c = 0; c < 128; ++c) {
      attn::smem[BoxByte(l.dst, int(r), c)] = m.ptr[(l.y + r) * m.stride + l.x * m.elem + c];
    }
  }
  b.tx -= int64_t(m.box_rows * 128);
  MaybeComplete(b);
}
// The box's bytes must be fenced from the generic proxy when the store is issued (the kernels
// write the staging, fence, then synchronise before the issuing thread starts the store).
void TmaStore(const CUtensorMap* map, int x, int y, uint32_t src) {
  if (src % 1024 != 0) Die("TMA store: a 128-byte-swizzled box must start 1024-byte aligned");
  const EmulatedMap m = MapOf(map);
  for (uint64_t r = 0; r < m.box_rows; ++r) {
    for (int c = 0; c < 128; ++c) emu::CheckAsyncProxyRead(BoxByte(src, int(r), c), "TMA store");
  }
  emu::Me().bulk_open.push_back([m, x, y, src] {
    if (uint64_t(x) + m.box_cols > m.cols || uint64_t(y) + m.box_rows > m.rows) {
      Die("TMA store: box outside the tensor (not emulated)");
    }
    auto* out = const_cast<unsigned char*>(m.ptr);
    for (uint64_t r = 0; r < m.box_rows; ++r) {
      for (int c = 0; c < 128; ++c) {
        out[(y + r) * m.stride + x * m.elem + c] = attn::smem[BoxByte(src, int(r), c)];
      }
    }
  });
}
void NamedBarrier(int id, int threads) { emu::NamedSync(id, threads); }
void NamedArrive(int id, int threads) { emu::NamedArrive(id, threads); }
template <bool kAE4, bool kBE4, int R>
void WgmmaFp8(float (&d)[R], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  emu::WgOp op{false, 2 * R, 0, 0, desc_a, desc_b, scale_d, {0, 0, 0, 0}, d};
  op.fp8 = emu::kFp8 | (kAE4 ? emu::kAE4M3 : 0) | (kBE4 ? emu::kBE4M3 : 0);
  emu::Me().wg_open.push_back(op);
}

}  // namespace boulder::kernels::cuda::fp8gemm

#endif  // BOULDER_KERNELS_CUDA_EMULATED_GPU_TMA_H_
