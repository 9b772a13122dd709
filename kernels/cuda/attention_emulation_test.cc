// The flash attention kernels (attention_fwd.cuh, attention_bwd.cuh) and the FP8 GEMM
// (fp8_gemm_sm90.cuh) compiled as host C++ and run on an emulated GPU, against a float64
// reference: runs on any machine, so the fragment layouts, tile index arithmetic, masks,
// padding and pipelining are tested without a GPU (cuda_ops_test and cuda_fp8_test, label gpu,
// run the same kernels on the device).
//
// The emulation: every CUDA thread of a block is a fiber on one OS thread (started with
// makecontext, switched with _setjmp/_longjmp, which unlike swapcontext make no system call),
// switched at barriers. __syncthreads, __syncwarp, named barriers, shuffles and the PTX
// primitives ldmatrix and mma.sync are warp- or block-wide rendezvous implementing the PTX ISA's
// fragment layouts; the sm_90a kernels' wgmma products (attention_{fwd,bwd}_sm90.cuh) are
// recorded at issue and run at the warpgroup-wide wait that retires them (so a read of the
// accumulators before that wait sees stale values, and shared memory is read as it is then),
// decoding the shared-memory descriptors and the 128-byte swizzle as wgmma.cuh describes them;
// shared and global memory are host memory; shared memory is poisoned with NaN before each
// block, and every shared access of the primitives is bounds- and alignment-checked. cp.async
// copies land either when issued or only at the cp.async.wait that covers them (both are run:
// the first exposes a refill racing with readers, the second a read before the data landed).
// A deadlock (threads waiting at different barriers) fails the test. The FP8 GEMM's TMA loads,
// TMA stores, mbarriers and FP8 wgmma are emulated too (see "fp8_gemm_sm90.cuh's primitives"
// below); its tests run the wgmma products late (g_late_products), so a stage freed before
// the products reading it retire is refilled under them, and its TMA stores read the staging
// only at the bulk wait, so staging overwritten before that wait shows.
//
// What it cannot see: device-only numerics (exp2f is exact here, ex2.approx on the GPU), the
// real timing of cp.async, the async proxy's ordering (fence.proxy.async is a no-op here), and
// anything in the launchers (attention_fwd*.cu, attention_bwd*.cu), whose launch sequence is
// mirrored below. That the emulated descriptor and swizzle semantics match the hardware's is
// checked by the same kernels passing cuda_ops_test on an H200.
#undef _FORTIFY_SOURCE  // its longjmp check rejects jumps between fiber stacks
#define BOULDER_ATTENTION_EMULATION 1
#define __launch_bounds__(...)
#define __grid_constant__

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/fp8.h"

// ---- the emulated GPU ----------------------------------------------------------------------

uint3 threadIdx, blockIdx;
dim3 gridDim, blockDim;

namespace emu {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "emulated GPU: %s (block %u,%u,%u thread %u)\n", what, blockIdx.x,
               blockIdx.y, blockIdx.z, threadIdx.x);
  std::abort();
}

struct Copy {
  void* dst;
  const void* src;
  bool valid;
};

// One recorded wgmma (wgmma.cuh's wrappers): its operands, and where the issuing thread's
// accumulators live.
struct WgOp {
  bool rs;  // A from registers
  int n;    // N of m64nNk16
  int trans_a, trans_b;
  uint64_t desc_a, desc_b;
  int scale_d;
  uint32_t a[4];
  float* d;
  int fp8 = 0;  // FP8 products (m64nNk32, fp8_gemm_sm90.cuh): kFp8 | kAE4M3 | kBE4M3
};
constexpr int kFp8 = 1, kAE4M3 = 2, kBE4M3 = 4;

// A TMA store recorded at issue and done when the issuing thread waits for its bulk group
// (cp.async.bulk.wait_group), so overwriting the staging before that wait shows in the output.
struct BulkStore {
  const void* map;
  int x, y;
  uint32_t src;
};

struct Fiber {
  ucontext_t ctx;  // the entry context, used once
  jmp_buf env;     // where the fiber resumes
  std::unique_ptr<char[]> stack;
  bool started = false;
  bool done = false;
  const uint64_t* wait_gen = nullptr;  // blocked while *wait_gen == wait_value
  uint64_t wait_value = 0;
  std::vector<Copy> open;
  std::deque<std::vector<Copy>> groups;
  std::vector<WgOp> wg_open;
  std::deque<std::vector<WgOp>> wg_groups;
  std::vector<BulkStore> bulk_open;
  std::deque<std::vector<BulkStore>> bulk_groups;
};

struct Rendezvous {
  int count = 0;
  uint64_t gen = 0;
  int retire = -1;  // wgmma waits with late products: the N of a completed wait not yet run
};

struct Warp {
  int count = 0;
  uint64_t gen = 0;
  const void* ptr[32];
  uint32_t words[32][6];
  float f[32];
};

constexpr size_t kStackBytes = 128 * 1024;
constexpr size_t kMaxSmem = 227 * 1024;

struct Block {
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  std::vector<Rendezvous> warpgroups;  // wgmma waits
  Rendezvous named[16];                // bar.sync 1..15
  int count = 0;
  uint64_t gen = 0;
  jmp_buf sched;
  int current = 0;
  std::function<void()> body;
  size_t smem_bytes = 0;
};

Block g_block;
// Schedules. Lockstep: every thread runs to its next barrier in turn, so warps stay within one
// step of each other. Greedy: warps in a random order, each running until all its threads wait
// at a block barrier, so one warp gets as far ahead of the others as the barriers allow.
bool g_greedy = false;
bool g_eager_copies = false;
// Late products: a warpgroup's wgmma wait completes, then every other warp runs once before the
// retired products do (in the lockstep schedule), so a stage freed before the wait that
// retires its products is refilled under them and the products read the new data.
bool g_late_products = false;
std::mt19937 g_rng(7);

int Tid() { return g_block.current; }
Fiber& Me() { return g_block.fibers[Tid()]; }

void WaitWhile(const uint64_t* gen, uint64_t value) {
  Fiber& f = Me();
  f.wait_gen = gen;
  f.wait_value = value;
  if (!_setjmp(f.env)) _longjmp(g_block.sched, 1);
}

void BlockBarrier() {
  const uint64_t gen = g_block.gen;
  if (++g_block.count == int(g_block.fibers.size())) {
    g_block.count = 0;
    ++g_block.gen;
    return;
  }
  WaitWhile(&g_block.gen, gen);
}

void WarpBarrier() {
  Warp& w = g_block.warps[Tid() / 32];
  const uint64_t gen = w.gen;
  if (++w.count == 32) {
    w.count = 0;
    ++w.gen;
    return;
  }
  WaitWhile(&w.gen, gen);
}

void Trampoline() {
  g_block.body();
  g_block.fibers[g_block.current].done = true;
  _longjmp(g_block.sched, 1);
}

// Runs fiber f until it waits at a barrier or ends. A function of its own, so that no local of
// the scheduler lives across the _setjmp.
__attribute__((noinline)) void SwitchTo(Fiber& f) {
  if (!_setjmp(g_block.sched)) {
    if (f.started) _longjmp(f.env, 1);
    f.started = true;
    setcontext(&f.ctx);
  }
}

void RunBlock(int threads, const std::function<void()>& body) {
  if (threads % 32 != 0) Die("block size is not a multiple of 32");
  Block& b = g_block;
  if (int(b.fibers.size()) != threads) {
    b.fibers = std::vector<Fiber>(threads);
    for (Fiber& f : b.fibers) f.stack.reset(new char[kStackBytes]);
  }
  b.warps.assign(threads / 32, Warp{});
  b.warpgroups.assign((threads + 127) / 128, Rendezvous{});
  for (Rendezvous& r : b.named) r = Rendezvous{};
  b.count = 0;
  b.body = body;
  for (Fiber& f : b.fibers) {
    f.started = false;
    f.done = false;
    f.wait_gen = nullptr;
    f.open.clear();
    f.groups.clear();
    f.wg_open.clear();
    f.wg_groups.clear();
    f.bulk_open.clear();
    f.bulk_groups.clear();
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.get();
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, Trampoline, 0);
  }
  std::vector<int> order(threads / 32);
  for (size_t w = 0; w < order.size(); ++w) order[w] = int(w);
  if (g_greedy) std::shuffle(order.begin(), order.end(), g_rng);
  for (;;) {
    bool progressed = false;
    for (int w : order) {
      bool ran;
      do {
        ran = false;
        for (int i = w * 32; i < w * 32 + 32; ++i) {
          Fiber& f = b.fibers[i];
          if (f.done || (f.wait_gen && *f.wait_gen == f.wait_value)) continue;
          f.wait_gen = nullptr;
          b.current = i;
          threadIdx = make_uint3(i, 0, 0);
          SwitchTo(f);
          ran = progressed = true;
        }
      } while (g_greedy && ran);
    }
    bool alive = false;
    for (const Fiber& f : b.fibers) alive = alive || !f.done;
    if (!alive) {
      for (const Fiber& f : b.fibers) {
        if (!f.wg_open.empty() || !f.wg_groups.empty()) Die("a wgmma was never waited for");
        if (!f.bulk_open.empty() || !f.bulk_groups.empty()) Die("a TMA store was never waited for");
      }
      for (const Rendezvous& r : b.named) {
        if (r.count != 0) Die("a named barrier was left with arrivals no thread waited for");
      }
      return;
    }
    if (!progressed) Die("deadlock: threads wait at barriers that never complete");
  }
}

}  // namespace emu

void __syncthreads() { emu::BlockBarrier(); }
void __syncwarp(unsigned = 0xffffffffu) { emu::WarpBarrier(); }
float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  emu::Warp& w = emu::g_block.warps[emu::Tid() / 32];
  const int lane = emu::Tid() % 32;
  w.f[lane] = v;
  emu::WarpBarrier();
  const float r = w.f[lane ^ lane_mask];
  emu::WarpBarrier();
  return r;
}
float atomicAdd(float* p, float v) {  // one OS thread: plain addition is atomic
  const float old = *p;
  *p = old + v;
  return old;
}
int min(int a, int b) { return a < b ? a : b; }
// What fp8_cast.cuh (the FP8 GEMM's fused GELU cast) uses: bit casts, unsigned max, warp-wide
// reductions (a rendezvous, as the shuffle) and the atomics of its statistics.
unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
unsigned WarpReduce(unsigned v, bool is_max) {
  emu::Warp& w = emu::g_block.warps[emu::Tid() / 32];
  w.words[emu::Tid() % 32][0] = v;
  emu::WarpBarrier();
  unsigned r = 0;
  for (int l = 0; l < 32; ++l) r = is_max ? max(r, w.words[l][0]) : r + w.words[l][0];
  emu::WarpBarrier();
  return r;
}
unsigned __reduce_max_sync(unsigned, unsigned v) { return WarpReduce(v, true); }
unsigned __reduce_add_sync(unsigned, unsigned v) { return WarpReduce(v, false); }
unsigned atomicMax(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = max(old, v);
  return old;
}
unsigned atomicAdd(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old + v;
  return old;
}
unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  const unsigned long long old = *p;
  *p = old + v;
  return old;
}
// The SIMD-within-a-word intrinsics of fp8_cast.cuh's Cast8 (the attention forward's cast).
unsigned __vmaxu2(unsigned a, unsigned b) {
  return max(a & 0xffffu, b & 0xffffu) | (max(a >> 16, b >> 16) << 16);
}
unsigned __vcmpeq2(unsigned a, unsigned b) {
  return ((a & 0xffffu) == (b & 0xffffu) ? 0xffffu : 0u) |
         ((a >> 16) == (b >> 16) ? 0xffff0000u : 0u);
}
unsigned __vcmpeq4(unsigned a, unsigned b) {
  unsigned r = 0;
  for (int k = 0; k < 4; ++k) {
    if (((a >> (8 * k)) & 0xffu) == ((b >> (8 * k)) & 0xffu)) r |= 0xffu << (8 * k);
  }
  return r;
}
int __popc(unsigned v) { return __builtin_popcount(v); }

namespace boulder::kernels::cuda::attn {

alignas(1024) unsigned char smem[emu::kMaxSmem];
using emu::Die;

void CheckSmem(const void* p, size_t bytes) {
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < smem || c + bytes > smem + emu::g_block.smem_bytes) Die("shared access out of bounds");
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) Die("misaligned 16-byte shared access");
}

void CpAsync16(void* dst, const void* src, bool valid) {
  CheckSmem(dst, 16);
  if (valid && reinterpret_cast<uintptr_t>(src) % 16 != 0) Die("misaligned cp.async source");
  emu::Copy c{dst, src, valid};
  if (emu::g_eager_copies) {
    if (valid)
      std::memcpy(dst, src, 16);
    else
      std::memset(dst, 0, 16);
  } else {
    emu::Me().open.push_back(c);
  }
}
void CpAsyncCommit() {
  emu::Fiber& f = emu::Me();
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}
template <int N>
void CpAsyncWait() {
  emu::Fiber& f = emu::Me();
  while (f.groups.size() > size_t(N)) {
    for (const emu::Copy& c : f.groups.front()) {
      if (c.valid)
        std::memcpy(c.dst, c.src, 16);
      else
        std::memset(c.dst, 0, 16);
    }
    f.groups.pop_front();
  }
}

uint16_t Bits(const __nv_bfloat16* p) {
  uint16_t u;
  std::memcpy(&u, p, 2);
  return u;
}

// ldmatrix .x4: lane l addresses row l % 8 of matrix l / 8; register j of lane i receives
// matrix j's row i / 4, elements 2(i % 4) and 2(i % 4) + 1 (with .trans: elements
// [2(i % 4)][i / 4] and [2(i % 4) + 1][i / 4]).
void Ldsm(uint32_t (&r)[4], const __nv_bfloat16* p, bool trans) {
  CheckSmem(p, 16);
  emu::Warp& w = emu::g_block.warps[emu::Tid() / 32];
  const int lane = emu::Tid() % 32;
  w.ptr[lane] = p;
  emu::WarpBarrier();
  for (int j = 0; j < 4; ++j) {
    const auto row = [&](int i) { return static_cast<const __nv_bfloat16*>(w.ptr[j * 8 + i]); };
    uint16_t lo, hi;
    if (!trans) {
      lo = Bits(row(lane / 4) + 2 * (lane % 4));
      hi = Bits(row(lane / 4) + 2 * (lane % 4) + 1);
    } else {
      lo = Bits(row(2 * (lane % 4)) + lane / 4);
      hi = Bits(row(2 * (lane % 4) + 1) + lane / 4);
    }
    r[j] = uint32_t(lo) | uint32_t(hi) << 16;
  }
  emu::WarpBarrier();
}
void Ldsm4(uint32_t (&r)[4], const __nv_bfloat16* p) { Ldsm(r, p, false); }
void Ldsm4T(uint32_t (&r)[4], const __nv_bfloat16* p) { Ldsm(r, p, true); }

float Half(uint32_t v, int hi) {
  const uint32_t bits = (hi ? v >> 16 : v & 0xffffu) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// mma.m16n8k16 with the fragment layouts of attention_common.cuh.
void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::Warp& w = emu::g_block.warps[emu::Tid() / 32];
  const int lane = emu::Tid() % 32;
  for (int i = 0; i < 4; ++i) w.words[lane][i] = a[i];
  w.words[lane][4] = b0;
  w.words[lane][5] = b1;
  emu::WarpBarrier();
  const auto A = [&](int r, int k) {
    return Half(w.words[(r % 8) * 4 + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)], k % 2);
  };
  const auto B = [&](int k, int n) {
    return Half(w.words[n * 4 + (k % 8) / 2][4 + (k >= 8)], k % 2);
  };
  const int g = lane / 4, t = lane % 4;
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int r = g + (e >> 1) * 8, n = 2 * t + (e & 1);
    double s = 0;
    for (int k = 0; k < 16; ++k) s += double(A(r, k)) * B(k, n);
    out[e] = float(double(c[e]) + s);
  }
  emu::WarpBarrier();
  for (int e = 0; e < 4; ++e) c[e] = out[e];
}

// Shared addresses count from the emulated shared memory's start (1024-byte aligned, as the
// swizzle needs).
uint32_t SmemAddr(const void* p) {
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < smem || c > smem + emu::kMaxSmem) Die("SmemAddr of a non-shared pointer");
  return uint32_t(c - smem);
}

template <int kId, int kThreads>
void NamedBarrier() {
  static_assert(kId > 0 && kId < 16 && kThreads % 32 == 0, "bar.sync operands");
  emu::Rendezvous& r = emu::g_block.named[kId];
  const uint64_t gen = r.gen;
  if (++r.count == kThreads) {
    r.count = 0;
    ++r.gen;
    return;
  }
  emu::WaitWhile(&r.gen, gen);
}

}  // namespace boulder::kernels::cuda::attn

namespace boulder::kernels::cuda::wgmma {

using emu::Die;

// Element (r, k) of a wgmma operand (r: row of A or column of B; k < 16: the contracted index)
// through its descriptor: K-major, rows 128 bytes apart in 8-row groups SBO apart; MN-major, k
// rows 128 bytes apart in 8-row groups SBO apart and 64-element atoms along r LBO apart; then the
// 128-byte swizzle on the address (bits 4–6 ^= bits 7–9).
float Operand(uint64_t desc, int trans, int r, int k) {
  const uint32_t start = uint32_t(desc & 0x3FFFu) << 4;
  const uint32_t lbo = uint32_t((desc >> 16) & 0x3FFFu) << 4;
  const uint32_t sbo = uint32_t((desc >> 32) & 0x3FFFu) << 4;
  if ((desc >> 62) != 1) Die("wgmma descriptor: only the 128-byte swizzle is emulated");
  if (((desc >> 49) & 7) != 0) Die("wgmma descriptor: nonzero base offset");
  uint32_t addr = trans ? start + (r / 64) * lbo + (k / 8) * sbo + (k % 8) * 128 + 2 * (r % 64)
                        : start + (r / 8) * sbo + (r % 8) * 128 + 2 * k;
  addr ^= ((addr >> 7) & 7u) << 4;
  if (addr + 2 > emu::g_block.smem_bytes) Die("wgmma operand outside shared memory");
  return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(attn::smem + addr));
}

// Byte (r, k) (k < 32) of an FP8 operand through its K-major 128-byte-swizzle descriptor.
uint8_t Fp8Operand(uint64_t desc, int r, int k) {
  const uint32_t start = uint32_t(desc & 0x3FFFu) << 4;
  const uint32_t sbo = uint32_t((desc >> 32) & 0x3FFFu) << 4;
  if ((desc >> 62) != 1) Die("wgmma descriptor: only the 128-byte swizzle is emulated");
  if (((desc >> 49) & 7) != 0) Die("wgmma descriptor: nonzero base offset");
  uint32_t addr = start + (r / 8) * sbo + (r % 8) * 128 + k;
  addr ^= ((addr >> 7) & 7u) << 4;
  if (addr + 1 > emu::g_block.smem_bytes) Die("wgmma operand outside shared memory");
  return attn::smem[addr];
}

// One FP8 product m64nNk32 (both operands K-major from shared memory).
void ExecuteFp8(const std::vector<const emu::WgOp*>& ops) {
  const emu::WgOp& o = *ops[0];
  const Fp8Format fa = (o.fp8 & emu::kAE4M3) ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
  const Fp8Format fb = (o.fp8 & emu::kBE4M3) ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
  static double A[64][32], B[32][256];
  for (int m = 0; m < 64; ++m) {
    for (int k = 0; k < 32; ++k) A[m][k] = cpu::DecodeFp8(Fp8Operand(o.desc_a, m, k), fa);
  }
  for (int k = 0; k < 32; ++k) {
    for (int n = 0; n < o.n; ++n) B[k][n] = cpu::DecodeFp8(Fp8Operand(o.desc_b, n, k), fb);
  }
  for (int t = 0; t < 128; ++t) {
    const int w = t / 32, g = (t % 32) / 4, q = t % 4;
    for (int j = 0; j < o.n / 8; ++j) {
      for (int e = 0; e < 4; ++e) {
        const int m = 16 * w + g + (e >> 1) * 8, n = 8 * j + 2 * q + (e & 1);
        double acc = o.scale_d ? double(ops[t]->d[4 * j + e]) : 0.0;
        for (int k = 0; k < 32; ++k) acc += A[m][k] * B[k][n];
        ops[t]->d[4 * j + e] = float(acc);
      }
    }
  }
}

// Runs one product for the warpgroup's 128 threads (ops[t]: thread t's record of it).
void Execute(const std::vector<const emu::WgOp*>& ops) {
  const emu::WgOp& o = *ops[0];
  for (const emu::WgOp* p : ops) {
    if (p->fp8 != o.fp8) Die("wgmma operand types differ across the warpgroup");
  }
  if (o.fp8) {
    for (const emu::WgOp* p : ops) {
      if (p->n != o.n || p->desc_a != o.desc_a || p->desc_b != o.desc_b ||
          p->scale_d != o.scale_d) {
        Die("wgmma operands differ across the warpgroup");
      }
    }
    ExecuteFp8(ops);
    return;
  }
  for (const emu::WgOp* p : ops) {
    if (p->rs != o.rs || p->n != o.n || p->trans_a != o.trans_a || p->trans_b != o.trans_b ||
        (!o.rs && p->desc_a != o.desc_a) || p->desc_b != o.desc_b || p->scale_d != o.scale_d) {
      Die("wgmma operands differ across the warpgroup");
    }
  }
  static double A[64][16], B[16][256];
  for (int m = 0; m < 64; ++m) {
    for (int k = 0; k < 16; ++k) {
      if (o.rs) {  // mma.sync's A fragment per warp: a0 (g, 2t..), a1 (g+8, ..), a2 (g, 2t+8..)
        const int w = m / 16, g = m % 8, t = (k % 8) / 2;
        const uint32_t reg = ops[32 * w + 4 * g + t]->a[(m % 16 >= 8) + 2 * (k >= 8)];
        A[m][k] = attn::Half(reg, k % 2);
      } else {
        A[m][k] = Operand(o.desc_a, o.trans_a, m, k);
      }
    }
  }
  for (int k = 0; k < 16; ++k) {
    for (int n = 0; n < o.n; ++n) B[k][n] = Operand(o.desc_b, o.trans_b, n, k);
  }
  for (int t = 0; t < 128; ++t) {
    const int w = t / 32, g = (t % 32) / 4, q = t % 4;
    for (int j = 0; j < o.n / 8; ++j) {
      for (int e = 0; e < 4; ++e) {
        const int m = 16 * w + g + (e >> 1) * 8, n = 8 * j + 2 * q + (e & 1);
        double acc = o.scale_d ? double(ops[t]->d[4 * j + e]) : 0.0;
        for (int k = 0; k < 16; ++k) acc += A[m][k] * B[k][n];
        ops[t]->d[4 * j + e] = float(acc);
      }
    }
  }
}

void Fence() {}
void FenceProxyAsync() {}
template <int N>
void FenceOperand(float (&)[N]) {}
void Commit() {
  emu::Fiber& f = emu::Me();
  f.wg_groups.push_back(std::move(f.wg_open));
  f.wg_open.clear();
}
// Warpgroup-wide: the last of its 128 threads to arrive runs every group older than the N most
// recent, for all of them, in issue order.
template <int N>
void Wait() {
  const int wg = emu::Tid() / 128;
  if (size_t(wg + 1) * 128 > emu::g_block.fibers.size()) Die("wgmma in an incomplete warpgroup");
  emu::Rendezvous& r = emu::g_block.warpgroups[wg];
  const uint64_t gen = r.gen;
  if (emu::g_late_products) {
    if (++r.count == 128) {
      r.count = 0;
      r.retire = N;
      ++r.gen;
    }
    emu::WaitWhile(&r.gen, gen);  // the last to arrive yields too: the others run first
    if (r.retire < 0) return;     // a thread of this warpgroup ran the products already
    r.retire = -1;
  } else {
    if (++r.count < 128) {
      emu::WaitWhile(&r.gen, gen);
      return;
    }
    r.count = 0;
  }
  emu::Fiber* fs = &emu::g_block.fibers[wg * 128];
  for (int t = 0; t < 128; ++t) {
    if (fs[t].wg_groups.size() != fs[0].wg_groups.size() || !fs[t].wg_open.empty()) {
      Die("wgmma groups differ across the warpgroup (or products were not committed)");
    }
  }
  while (fs[0].wg_groups.size() > size_t(N)) {
    const size_t n_ops = fs[0].wg_groups.front().size();
    for (int t = 0; t < 128; ++t) {
      if (fs[t].wg_groups.front().size() != n_ops) Die("wgmma group sizes differ");
    }
    for (size_t i = 0; i < n_ops; ++i) {
      std::vector<const emu::WgOp*> ops(128);
      for (int t = 0; t < 128; ++t) ops[t] = &fs[t].wg_groups.front()[i];
      Execute(ops);
    }
    for (int t = 0; t < 128; ++t) fs[t].wg_groups.pop_front();
  }
  if (!emu::g_late_products) ++r.gen;
}

void Record(bool rs, int n, int ta, int tb, uint64_t da, uint64_t db, int scale_d,
            const uint32_t* a, float* d) {
  emu::WgOp op{rs, n, ta, tb, da, db, scale_d, {0, 0, 0, 0}, d};
  if (a) std::memcpy(op.a, a, sizeof op.a);
  emu::Me().wg_open.push_back(op);
}
template <int kTransA, int kTransB>
void WgmmaSS64(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  Record(false, 64, kTransA, kTransB, desc_a, desc_b, scale_d, nullptr, d);
}
template <int kTransA, int kTransB>
void WgmmaSS128(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  Record(false, 128, kTransA, kTransB, desc_a, desc_b, scale_d, nullptr, d);
}
template <int kTransB>
void WgmmaRS64(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
  Record(true, 64, 0, kTransB, 0, desc_b, 1, a, d);
}
template <int kTransB>
void WgmmaRS128(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  Record(true, 128, 0, kTransB, 0, desc_b, 1, a, d);
}

}  // namespace boulder::kernels::cuda::wgmma

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

struct Mbar {
  int expected = 0, pending = 0;
  int64_t tx = 0;
  uint64_t phase = 0;  // completed phases
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
    m.pending = m.expected;
  }
}

uint32_t SharedBase() { return attn::SmemAddr(attn::smem); }
void FenceMbarrierInit() {}
void PrefetchTensorMap(const CUtensorMap*) {}
void StoreShared32(uint32_t addr, uint32_t v) {
  if (addr % 4 != 0 || addr + 4 > emu::g_block.smem_bytes) Die("st.shared.b32 out of bounds");
  std::memcpy(attn::smem + addr, &v, 4);
}
void StoreShared16(uint32_t addr, uint16_t v) {
  if (addr % 2 != 0 || addr + 2 > emu::g_block.smem_bytes) Die("st.shared.b16 out of bounds");
  std::memcpy(attn::smem + addr, &v, 2);
}
uint32_t LoadShared32(uint32_t addr) {
  if (addr % 4 != 0 || addr + 4 > emu::g_block.smem_bytes) Die("ld.shared.b32 out of bounds");
  uint32_t v;
  std::memcpy(&v, attn::smem + addr, 4);
  return v;
}
void MbarInit(uint32_t bar, int count) {
  if (bar % 8 != 0 || bar + 8 > emu::g_block.smem_bytes) Die("mbarrier outside shared memory");
  Mbar m;
  m.expected = m.pending = count;
  g_mbars[bar] = m;
}
// try_wait.parity succeeds once the phase of that parity has completed.
void MbarWait(uint32_t bar, uint32_t parity) {
  Mbar& m = MbarAt(bar);
  while ((m.phase & 1) == parity) emu::WaitWhile(&m.phase, m.phase);
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
  for (uint64_t r = 0; r < m.box_rows; ++r) {
    for (int c = 0; c < 128; ++c) {
      attn::smem[BoxByte(dst, int(r), c)] = m.ptr[(y + r) * m.stride + x * m.elem + c];
    }
  }
  Mbar& b = MbarAt(bar);
  b.tx -= int64_t(m.box_rows * 128);
  MaybeComplete(b);
}
void TmaStore(const CUtensorMap* map, int x, int y, uint32_t src) {
  if (src % 1024 != 0) Die("TMA store: a 128-byte-swizzled box must start 1024-byte aligned");
  emu::Me().bulk_open.push_back({map, x, y, src});
}
void BulkCommit() {
  emu::Fiber& f = emu::Me();
  f.bulk_groups.push_back(std::move(f.bulk_open));
  f.bulk_open.clear();
}
void BulkWaitAll() {
  emu::Fiber& f = emu::Me();
  for (const auto& group : f.bulk_groups) {
    for (const emu::BulkStore& st : group) {
      const EmulatedMap m = MapOf(static_cast<const CUtensorMap*>(st.map));
      if (uint64_t(st.x) + m.box_cols > m.cols || uint64_t(st.y) + m.box_rows > m.rows) {
        Die("TMA store: box outside the tensor (not emulated)");
      }
      auto* out = const_cast<unsigned char*>(m.ptr);
      for (uint64_t r = 0; r < m.box_rows; ++r) {
        for (int c = 0; c < 128; ++c) {
          out[(st.y + r) * m.stride + st.x * m.elem + c] = attn::smem[BoxByte(st.src, int(r), c)];
        }
      }
    }
  }
  f.bulk_groups.clear();
}
void BulkWaitRead() { BulkWaitAll(); }
void NamedBarrier(int id, int threads) {
  if (id <= 0 || id >= 16 || threads % 32 != 0) Die("bar.sync operands");
  emu::Rendezvous& r = emu::g_block.named[id];
  const uint64_t gen = r.gen;
  if (++r.count == threads) {
    r.count = 0;
    ++r.gen;
    return;
  }
  emu::WaitWhile(&r.gen, gen);
}
void NamedArrive(int id, int threads) {
  if (id <= 0 || id >= 16 || threads % 32 != 0) Die("bar.arrive operands");
  emu::Rendezvous& r = emu::g_block.named[id];
  if (++r.count == threads) {
    r.count = 0;
    ++r.gen;
  }
}
template <bool kAE4, bool kBE4, int R>
void WgmmaFp8(float (&d)[R], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  emu::WgOp op{false, 2 * R, 0, 0, desc_a, desc_b, scale_d, {0, 0, 0, 0}, d};
  op.fp8 = emu::kFp8 | (kAE4 ? emu::kAE4M3 : 0) | (kBE4 ? emu::kBE4M3 : 0);
  emu::Me().wg_open.push_back(op);
}

}  // namespace boulder::kernels::cuda::fp8gemm

#include "kernels/cuda/attention_bwd.cuh"
#include "kernels/cuda/attention_bwd_sm90.cuh"
#include "kernels/cuda/attention_fwd.cuh"
#include "kernels/cuda/attention_fwd_sm90.cuh"
#include "kernels/cuda/fp8_gemm_sm90.cuh"

namespace boulder::kernels::cuda::attn {
namespace {

// Runs kernel(args...) over a grid, one block at a time.
template <typename F>
void Launch(dim3 grid, int threads, size_t smem_bytes, F kernel) {
  if (smem_bytes > emu::kMaxSmem) Die("dynamic shared memory over the device limit");
  gridDim = grid;
  blockDim = dim3(threads, 1, 1);
  emu::g_block.smem_bytes = smem_bytes;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = make_uint3(x, y, z);
        std::memset(smem, 0xff, emu::kMaxSmem);  // NaN in BF16 and in FP32
        emu::RunBlock(threads, kernel);
      }
    }
  }
}

float RoundBF16(float f) { return __bfloat162float(__float2bfloat16(f)); }

struct Problem {
  int B, T, NH, HS;
  int C() const { return NH * HS; }
};

// float64 causal attention: out, lse (natural log of the scaled scores' sum of exponentials)
// and the gradient of qkv given dout.
void Reference(const Problem& pr, const std::vector<float>& qkv, const std::vector<float>& dout,
               std::vector<double>* out, std::vector<double>* lse, std::vector<double>* dqkv) {
  const int B = pr.B, T = pr.T, NH = pr.NH, HS = pr.HS, C = pr.C();
  const double scale = 1.0 / std::sqrt(double(HS));
  out->assign(size_t(B) * T * C, 0.0);
  lse->assign(size_t(B) * NH * T, 0.0);
  dqkv->assign(qkv.size(), 0.0);
  auto at = [&](int b, int t, int part, int h, int c) {
    return size_t(b) * T * 3 * C + size_t(t) * 3 * C + part * C + h * HS + c;
  };
  std::vector<double> p(T), dp(T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int q = 0; q < T; ++q) {
        double mx = -INFINITY;
        for (int k = 0; k <= q; ++k) {
          double s = 0;
          for (int c = 0; c < HS; ++c) s += double(qkv[at(b, q, 0, h, c)]) * qkv[at(b, k, 1, h, c)];
          p[k] = s * scale;
          mx = std::max(mx, p[k]);
        }
        double sum = 0;
        for (int k = 0; k <= q; ++k) sum += std::exp(p[k] - mx);
        (*lse)[(size_t(b) * NH + h) * T + q] = mx + std::log(sum);
        for (int k = 0; k <= q; ++k) p[k] = std::exp(p[k] - mx) / sum;
        double D = 0;
        for (int c = 0; c < HS; ++c) {
          double o = 0;
          for (int k = 0; k <= q; ++k) o += p[k] * qkv[at(b, k, 2, h, c)];
          (*out)[(size_t(b) * T + q) * C + h * HS + c] = o;
          D += o * dout[(size_t(b) * T + q) * C + h * HS + c];
        }
        for (int k = 0; k <= q; ++k) {
          double d = 0;
          for (int c = 0; c < HS; ++c)
            d += double(dout[(size_t(b) * T + q) * C + h * HS + c]) * qkv[at(b, k, 2, h, c)];
          dp[k] = p[k] * (d - D);  // dS
        }
        for (int k = 0; k <= q; ++k) {
          for (int c = 0; c < HS; ++c) {
            const double g = dout[(size_t(b) * T + q) * C + h * HS + c];
            (*dqkv)[at(b, q, 0, h, c)] += scale * dp[k] * qkv[at(b, k, 1, h, c)];
            (*dqkv)[at(b, k, 1, h, c)] += scale * dp[k] * qkv[at(b, q, 0, h, c)];
            (*dqkv)[at(b, k, 2, h, c)] += p[k] * g;
          }
        }
      }
    }
  }
}

std::vector<bf16> ToBf16(const std::vector<float>& v) {
  std::vector<bf16> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = __float2bfloat16(v[i]);
  return r;
}

template <typename T, typename Get>
double RelErr(const std::vector<T>& got, const std::vector<double>& want, Get get, size_t begin = 0,
              size_t step = 1, size_t len = 0) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (len && (i - begin) % step >= len) continue;
    if (len && i < begin) continue;
    const double g = get(got[i]);
    if (!std::isfinite(g)) return INFINITY;
    num += (g - want[i]) * (g - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

template <int HS>
void RunForward(const Problem& pr, const std::vector<bf16>& qkv, std::vector<bf16>* out,
                std::vector<float>* stats) {
  using Cfg = FwdCfg<HS>;
  const int C = pr.C();
  const bf16* q = qkv.data();
  bf16* o = out->data();
  float* st = stats->data();
  const float scale_log2 = kLog2e / std::sqrt(float(HS));
  const int T = pr.T, NH = pr.NH;
  Launch(dim3(pr.B * NH, (T + Cfg::kBq - 1) / Cfg::kBq), Cfg::kThreads, Cfg::kSmemBytes,
         [=] { FlashForwardKernel<HS>(o, st, q, T, C, NH, scale_log2); });
}

// Mirrors Backward<HS> in attention_bwd.cu.
template <int HS>
void RunBackward(const Problem& pr, const std::vector<bf16>& qkv, const std::vector<bf16>& out,
                 const std::vector<float>& stats, const std::vector<bf16>& dout, bool deterministic,
                 std::vector<bf16>* dqkv) {
  const int B = pr.B, T = pr.T, NH = pr.NH, C = pr.C(), Tp = PaddedT(T);
  const size_t n_rows = size_t(B) * NH * Tp;
  std::vector<float> Dp(n_rows, NAN), lse2(n_rows, NAN), dq_acc(size_t(B) * T * C, 0.f);
  const float scale = 1.f / std::sqrt(float(HS)), scale_log2 = scale * kLog2e;
  float *pD = Dp.data(), *pL = lse2.data(), *pA = dq_acc.data();
  const bf16 *pq = qkv.data(), *po = out.data(), *pdo = dout.data();
  const float* ps = stats.data();
  bf16* pdq = dqkv->data();
  Launch(dim3(unsigned((n_rows + 7) / 8)), 256, 0,
         [=] { PreprocessKernel<HS>(pD, pL, pdo, po, ps, B, T, Tp, C, NH); });
  const dim3 kv_grid(B * NH, (T + 127) / 128);
  if (!deterministic) {
    using Cfg = KVCfg<HS, true>;
    Launch(kv_grid, kBwdThreads, Cfg::kSmemBytes, [=] {
      FlashBackwardKVKernel<HS, true>(pdq, pA, pdo, pq, pL, pD, T, Tp, C, NH, scale, scale_log2);
    });
    const size_t n8 = dq_acc.size() / 8;
    Launch(dim3(unsigned((n8 + 255) / 256)), 256, 0,
           [=] { ConvertDQKernel(pdq, pA, n8, C, scale); });
    return;
  }
  using Cfg = KVCfg<HS, false>;
  Launch(kv_grid, kBwdThreads, Cfg::kSmemBytes, [=] {
    FlashBackwardKVKernel<HS, false>(pdq, nullptr, pdo, pq, pL, pD, T, Tp, C, NH, scale,
                                     scale_log2);
  });
  using QC = QCfg<HS>;
  Launch(dim3(B * NH, (T + QC::kBq - 1) / QC::kBq), kBwdThreads, QC::kSmemBytes,
         [=] { FlashBackwardQKernel<HS>(pdq, pdo, pq, pL, pD, T, Tp, C, NH, scale, scale_log2); });
}

// Mirror AttentionForwardSm90 (attention_fwd_sm90.cu) and Backward<HS> (attention_bwd.cu) with
// its wgmma kernels: preprocess, dK/dV, dQ (the same in both modes).
template <int HS>
void RunForwardSm90(const Problem& pr, const std::vector<bf16>& qkv, std::vector<bf16>* out,
                    std::vector<float>* stats) {
  using Cfg = Sm90FwdCfg<HS>;
  const int C = pr.C(), T = pr.T, NH = pr.NH;
  const bf16* q = qkv.data();
  bf16* o = out->data();
  float* st = stats->data();
  const float scale_log2 = kLog2e / std::sqrt(float(HS));
  Launch(dim3(pr.B * NH, (T + Cfg::kBq - 1) / Cfg::kBq), Cfg::kThreads, Cfg::kSmemBytes, [=] {
    FlashForwardSm90Kernel<HS>(o, st, q, T, C, NH, scale_log2, nullptr, nullptr, nullptr, nullptr);
  });
}
// With the FP8 cast of out (kFp8, as AttentionForwardSm90 with an AttentionFp8Cast).
template <int HS>
void RunForwardSm90Fp8(const Problem& pr, const std::vector<bf16>& qkv, std::vector<bf16>* out,
                       std::vector<float>* stats, std::vector<uint8_t>* codes, float scale,
                       float* amax, unsigned long long* counts) {
  using Cfg = Sm90FwdCfg<HS>;
  const int C = pr.C(), T = pr.T, NH = pr.NH;
  const bf16* q = qkv.data();
  bf16* o = out->data();
  float* st = stats->data();
  uint8_t* c8 = codes->data();
  const float scale_log2 = kLog2e / std::sqrt(float(HS));
  const float* sc = &scale;
  Launch(dim3(pr.B * NH, (T + Cfg::kBq - 1) / Cfg::kBq), Cfg::kThreads, Cfg::kFp8SmemBytes, [=] {
    FlashForwardSm90Kernel<HS, true>(o, st, q, T, C, NH, scale_log2, c8, sc, amax, counts);
  });
}

template <int HS>
void RunBackwardSm90(const Problem& pr, const std::vector<bf16>& qkv, const std::vector<bf16>& out,
                     const std::vector<float>& stats, const std::vector<bf16>& dout,
                     std::vector<bf16>* dqkv) {
  const int B = pr.B, T = pr.T, NH = pr.NH, C = pr.C(), Tp = PaddedT(T);
  const size_t n_rows = size_t(B) * NH * Tp;
  std::vector<float> Dp(n_rows, NAN), lse2(n_rows, NAN);
  const float scale = 1.f / std::sqrt(float(HS)), scale_log2 = scale * kLog2e;
  float *pD = Dp.data(), *pL = lse2.data();
  const bf16 *pq = qkv.data(), *po = out.data(), *pdo = dout.data();
  const float* ps = stats.data();
  bf16* pdq = dqkv->data();
  Launch(dim3(unsigned((n_rows + 7) / 8)), 256, 0,
         [=] { PreprocessKernel<HS>(pD, pL, pdo, po, ps, B, T, Tp, C, NH); });
  using KV = Sm90BwdCfg<HS>;
  Launch(dim3(B * NH, (T + KV::kBkv - 1) / KV::kBkv), KV::kThreads, KV::kSmemBytes, [=] {
    FlashBackwardKVSm90Kernel<HS>(pdq, pdo, pq, pL, pD, T, Tp, C, NH, scale, scale_log2);
  });
  using QC = Sm90QCfg<HS>;
  Launch(dim3(B * NH, (T + QC::kBq - 1) / QC::kBq), QC::kThreads, QC::kSmemBytes, [=] {
    FlashBackwardQSm90Kernel<HS>(pdq, pdo, pq, pL, pD, T, Tp, C, NH, scale, scale_log2);
  });
}

enum class Schedule { kLockstepLazyCopies, kGreedyEagerCopies, kGreedyLazyCopies };
enum class Kernels { kMmaSync, kWgmma };

template <int HS>
void Check(const Problem& pr, Schedule schedule, uint32_t seed,
           Kernels kernels = Kernels::kMmaSync) {
  const bool sm90 = kernels == Kernels::kWgmma;
  SCOPED_TRACE(testing::Message() << "B=" << pr.B << " T=" << pr.T << " NH=" << pr.NH
                                  << " HS=" << HS << " schedule " << int(schedule)
                                  << (sm90 ? " wgmma" : " mma.sync"));
  emu::g_greedy = schedule != Schedule::kLockstepLazyCopies;
  emu::g_eager_copies = schedule == Schedule::kGreedyEagerCopies;
  emu::g_late_products = false;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int C = pr.C();
  std::vector<float> qkv(size_t(pr.B) * pr.T * 3 * C), dout(size_t(pr.B) * pr.T * C);
  for (auto& x : qkv) x = RoundBF16(nd(rng));
  for (auto& x : dout) x = RoundBF16(nd(rng));
  std::vector<double> ref_out, ref_lse, ref_dqkv;
  Reference(pr, qkv, dout, &ref_out, &ref_lse, &ref_dqkv);

  const bf16 nan = __float2bfloat16(NAN);
  const std::vector<bf16> qkv_b = ToBf16(qkv), dout_b = ToBf16(dout);
  std::vector<bf16> out(size_t(pr.B) * pr.T * C, nan);
  std::vector<float> stats(size_t(pr.B) * pr.NH * pr.T, NAN);
  if (sm90) {
    RunForwardSm90<HS>(pr, qkv_b, &out, &stats);
  } else {
    RunForward<HS>(pr, qkv_b, &out, &stats);
  }
  const auto f16 = [](bf16 x) { return double(__bfloat162float(x)); };
  const auto f32 = [](float x) { return double(x); };
  EXPECT_LT(RelErr(out, ref_out, f16), 1e-2) << "out";
  EXPECT_LT(RelErr(stats, ref_lse, f32), 1e-4) << "stats";

  for (bool deterministic : {true, false}) {
    if (sm90 && !deterministic) continue;  // one path for both modes there
    SCOPED_TRACE(deterministic ? "deterministic" : "atomic dQ");
    std::vector<bf16> dqkv(qkv.size(), nan);
    if (sm90) {
      RunBackwardSm90<HS>(pr, qkv_b, out, stats, dout_b, &dqkv);
    } else {
      RunBackward<HS>(pr, qkv_b, out, stats, dout_b, deterministic, &dqkv);
    }
    // At T = 1 dQ and dK are exactly zero and a relative error against them means nothing
    // (the kernels leave ~1e-7 from dP − D): such a part must be tiny on the whole gradient's
    // scale instead, as in cuda_ops_test.
    double all = 0;
    for (double x : ref_dqkv) all += x * x;
    for (int part = 0; part < 3; ++part) {
      double want = 0, got = 0;
      for (size_t r = 0; r < size_t(pr.B) * pr.T; ++r) {
        for (int c = 0; c < C; ++c) {
          const size_t i = r * 3 * C + part * C + c;
          want += ref_dqkv[i] * ref_dqkv[i];
          const double g = f16(dqkv[i]);
          got += std::isfinite(g) ? g * g : INFINITY;
        }
      }
      if (std::sqrt(want) < 1e-4 * std::sqrt(all)) {
        EXPECT_LT(std::sqrt(got), 1e-3 * std::sqrt(all)) << "d"
                                                         << "qkv"[part] << " (zero)";
      } else {
        EXPECT_LT(RelErr(dqkv, ref_dqkv, f16, part * C, 3 * C, C), 2e-2) << "d"
                                                                         << "qkv"[part];
      }
    }
  }
}

constexpr Schedule kAllSchedules[] = {Schedule::kLockstepLazyCopies, Schedule::kGreedyEagerCopies,
                                      Schedule::kGreedyLazyCopies};

TEST(AttentionEmulationTest, Head64) {
  for (Schedule s : kAllSchedules) {
    Check<64>({2, 37, 2, 64}, s, 1);
    Check<64>({1, 200, 1, 64}, s, 2);
  }
  Check<64>({1, 1, 1, 64}, Schedule::kGreedyEagerCopies, 3);
  Check<64>({1, 128, 1, 64}, Schedule::kGreedyLazyCopies, 4);
}

TEST(AttentionEmulationTest, Head128) {
  for (Schedule s : kAllSchedules) Check<128>({1, 150, 2, 128}, s, 5);
  Check<128>({1, 64, 1, 128}, Schedule::kGreedyEagerCopies, 6);
}

// The sm_90a kernels (wgmma): tiles of 128 queries / 64 keys forward and 128 keys × 128 (head
// size 64) or 64 (128) queries backward, so T covers one row, partial tiles, exact multiples and
// the backward's half-diagonal steps.
TEST(AttentionEmulationTest, Head64Wgmma) {
  for (Schedule s : kAllSchedules) Check<64>({2, 37, 2, 64}, s, 11, Kernels::kWgmma);
  Check<64>({1, 200, 1, 64}, Schedule::kGreedyLazyCopies, 12, Kernels::kWgmma);
  Check<64>({1, 1, 1, 64}, Schedule::kGreedyEagerCopies, 13, Kernels::kWgmma);
  Check<64>({1, 256, 1, 64}, Schedule::kLockstepLazyCopies, 14, Kernels::kWgmma);
}

TEST(AttentionEmulationTest, Head128Wgmma) {
  for (Schedule s : kAllSchedules) Check<128>({1, 150, 2, 128}, s, 15, Kernels::kWgmma);
  Check<128>({1, 64, 1, 128}, Schedule::kGreedyEagerCopies, 16, Kernels::kWgmma);
  Check<128>({2, 1, 1, 128}, Schedule::kGreedyLazyCopies, 17, Kernels::kWgmma);
}

// The wgmma forward with the FP8 cast of its output (the projection's input in FP8 training):
// the same BF16 output and statistics as without it, and the codes, amax and counters CastFp8
// (the CPU backend's, on that output) gives. Some columns of V are tiny, so their outputs
// flush to zero; the scale saturates the largest outputs.
template <int HS>
void CheckFp8Cast(const Problem& pr, Schedule schedule, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "B=" << pr.B << " T=" << pr.T << " NH=" << pr.NH
                                  << " HS=" << HS << " schedule " << int(schedule) << " FP8 cast");
  emu::g_greedy = schedule != Schedule::kLockstepLazyCopies;
  emu::g_eager_copies = schedule == Schedule::kGreedyEagerCopies;
  emu::g_late_products = false;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int C = pr.C(), rows = pr.B * pr.T;
  std::vector<bf16> qkv(size_t(rows) * 3 * C);
  for (size_t i = 0; i < qkv.size(); ++i) {
    const bool tiny_v = int(i % (3 * C)) >= 2 * C && int(i % (3 * C)) % HS < 4;
    qkv[i] = __float2bfloat16(nd(rng) * (tiny_v ? 1e-7f : 1.f));
  }
  std::vector<bf16> plain(size_t(rows) * C), fused(plain.size());
  std::vector<float> plain_stats(size_t(pr.B) * pr.NH * pr.T), fused_stats(plain_stats.size());
  RunForwardSm90<HS>(pr, qkv, &plain, &plain_stats);
  float top = 0;
  for (const bf16& x : plain) top = std::max(top, std::fabs(__bfloat162float(x)));
  const float scale = 448.f / (0.6f * top);
  std::vector<uint8_t> codes(plain.size(), 0x7f);
  float amax = 0;
  unsigned long long counts[3] = {0, 0, 0};
  RunForwardSm90Fp8<HS>(pr, qkv, &fused, &fused_stats, &codes, scale, &amax, counts);
  ASSERT_EQ(std::memcmp(plain.data(), fused.data(), plain.size() * 2), 0) << "BF16 output";
  ASSERT_EQ(std::memcmp(plain_stats.data(), fused_stats.data(), plain_stats.size() * 4), 0);
  std::vector<float> x(plain.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = __bfloat162float(plain[i]);
  std::vector<uint8_t> want(plain.size());
  float want_amax = 0;
  uint64_t want_counts[3] = {0, 0, 0};
  cpu::CastFp8(want.data(), nullptr, x.data(), rows, C, Fp8Format::kE4M3, &scale, &want_amax,
               want_counts);
  size_t first = 0;
  while (first < want.size() && want[first] == codes[first]) ++first;
  EXPECT_EQ(first, want.size()) << "codes differ first at " << first / C << "," << first % C;
  EXPECT_EQ(amax, want_amax);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(counts[k], want_counts[k]) << "counter " << k;
  EXPECT_GT(want_counts[0], 0u) << "nothing saturated";
  EXPECT_GT(want_counts[1], 0u) << "nothing flushed to zero";
}

TEST(AttentionEmulationTest, WgmmaForwardCastsItsOutputToFp8) {
  for (Schedule s : kAllSchedules) CheckFp8Cast<64>({2, 150, 2, 64}, s, 21);
  CheckFp8Cast<128>({1, 100, 2, 128}, Schedule::kGreedyLazyCopies, 22);
}

}  // namespace
}  // namespace boulder::kernels::cuda::attn

// ---- fp8_gemm_sm90.cuh on the emulated GPU ---------------------------------------------------

namespace boulder::kernels::cuda::fp8gemm {
namespace {

// Mirrors Launch in fp8_gemm_sm90.cu: a persistent grid of min(tiles, sms) CTAs (sms small,
// so every CTA walks several tiles), one CTA at a time.
// kPingPong: Fp8GemmSm90PingPongKernel (BN 128, fast accumulation). kGelu: the fused cast of
// fc2's input into gelu_out (M × N codes) with gelu's scale and statistics.
template <int BN, bool kFast, bool kAE4, bool kBE4, bool kPingPong = false, bool kGelu = false>
void RunGemm(bf16* out, const uint8_t* a, const float* sa, const uint8_t* b, const float* sb,
             const bf16* bias, int M, int N, int K, bool accumulate, int sms,
             uint8_t* gelu_out = nullptr, GeluCastArgs gelu = {nullptr, nullptr, nullptr}) {
  using Cfg = std::conditional_t<kPingPong, PingPongCfg, GemmCfg<BN, kFast>>;
  if (Cfg::kSmemBytes > int(emu::kMaxSmem)) Die("dynamic shared memory over the device limit");
  CUtensorMap map_a, map_b, map_out, map_gelu;
  EncodeEmulatedMap(&map_a, a, K, M, 1, kBK, kBM);
  EncodeEmulatedMap(&map_b, b, K, N, 1, kBK, BN);
  EncodeEmulatedMap(&map_out, out, N, M, 2, 64, 64);
  if (kGelu) {
    EncodeEmulatedMap(&map_gelu, gelu_out, N, M, 1, 128, 64);
  } else {
    map_gelu = map_out;
  }
  const int tiles = (M / kBM) * (N / BN);
  gridDim = dim3(std::min(tiles, sms), 1, 1);
  blockDim = dim3(kThreads, 1, 1);
  emu::g_block.smem_bytes = Cfg::kSmemBytes;
  for (unsigned x = 0; x < gridDim.x; ++x) {
    blockIdx = make_uint3(x, 0, 0);
    std::memset(attn::smem, 0xff, emu::kMaxSmem);
    g_mbars.clear();
    emu::RunBlock(kThreads, [&] {
      if constexpr (kPingPong) {
        Fp8GemmSm90PingPongKernel<kAE4, kBE4, kGelu>(map_a, map_b, map_out, out, bias, sa, sb, M, N,
                                                     K, accumulate ? 1 : 0, map_gelu, gelu);
      } else {
        Fp8GemmSm90Kernel<BN, kFast, kAE4, kBE4, kGelu>(map_a, map_b, map_out, out, bias, sa, sb, M,
                                                        N, K, accumulate ? 1 : 0, map_gelu, gelu);
      }
    });
  }
}

struct GemmCase {
  int M, N, K;
  bool a_e4m3, b_e4m3, bias, accumulate;
};

// out = sa·sb·a·bᵀ (+ bias) (+ out) on FP8 codes of N(0, 1) values, against float64.
template <int BN, bool kFast, bool kAE4, bool kBE4, bool kPingPong = false>
void CheckGemm(const GemmCase& c, int sms, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << c.M << "x" << c.N << "x" << c.K << " BN " << BN
                                  << (kFast ? " fast" : " split") << (c.bias ? " bias" : "")
                                  << (c.accumulate ? " accumulate" : "") << " sms " << sms
                                  << (kPingPong ? " ping-pong" : ""));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const Fp8Format fa = kAE4 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
  const Fp8Format fb = kBE4 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
  std::vector<uint8_t> a(size_t(c.M) * c.K), b(size_t(c.N) * c.K);
  for (auto& x : a) x = cpu::EncodeFp8(nd(rng) * 4.f, fa);
  for (auto& x : b) x = cpu::EncodeFp8(nd(rng) * 4.f, fb);
  std::vector<bf16> bias(c.N), out(size_t(c.M) * c.N);
  for (auto& x : bias) x = __float2bfloat16(nd(rng));
  for (auto& x : out) x = c.accumulate ? __float2bfloat16(nd(rng)) : __float2bfloat16(NAN);
  const std::vector<bf16> init = out;
  const float sa = 0.125f, sb = 0.03f;
  RunGemm<BN, kFast, kAE4, kBE4, kPingPong>(out.data(), a.data(), &sa, b.data(), &sb,
                                            c.bias ? bias.data() : nullptr, c.M, c.N, c.K,
                                            c.accumulate, sms);
  double num = 0, den = 0, worst = 0, scale = 0;
  std::vector<double> want(out.size());
  for (int m = 0; m < c.M; ++m) {
    for (int n = 0; n < c.N; ++n) {
      double s = 0;
      for (int k = 0; k < c.K; ++k) {
        s += double(cpu::DecodeFp8(a[size_t(m) * c.K + k], fa)) *
             cpu::DecodeFp8(b[size_t(n) * c.K + k], fb);
      }
      double w = double(sa) * sb * s;
      if (c.bias) w += __bfloat162float(bias[n]);
      if (c.accumulate) w += __bfloat162float(init[size_t(m) * c.N + n]);
      want[size_t(m) * c.N + n] = w;
      scale = std::max(scale, std::fabs(w));
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    const double got = __bfloat162float(out[i]), e = got - want[i];
    if (!std::isfinite(got)) {
      ADD_FAILURE() << "output " << i / c.N << "," << i % c.N << " not written (" << got << ")";
      return;
    }
    num += e * e;
    den += want[i] * want[i];
    worst = std::max(worst, std::fabs(e) - std::fabs(want[i]) / 128);  // past BF16's rounding
  }
  EXPECT_LT(std::sqrt(num / den), 4e-3) << "relative L2 error";
  EXPECT_LT(worst, 1e-6 * scale) << "an element beyond BF16 rounding of the exact value";
}

// Tiles of 128 × 256 (fast accumulation) and 128 × 128; 1 to 3 CTAs, so a CTA walks one or
// several tiles and the stage ring (3 stages at 256, 5 at 128) wraps inside and across tiles.
TEST(Fp8GemmEmulationTest, WideTilesFastAccumulation) {
  emu::g_late_products = true;
  for (bool greedy : {false, true}) {
    emu::g_greedy = greedy;
    CheckGemm<256, true, true, true>({256, 512, 384, true, true, true, false}, 3, 21);
    CheckGemm<256, true, true, true>({128, 256, 128, true, true, false, false}, 1, 22);
  }
}

TEST(Fp8GemmEmulationTest, NarrowTilesSplitAccumulationAndAccumulate) {
  emu::g_late_products = true;
  for (bool greedy : {false, true}) {
    emu::g_greedy = greedy;
    CheckGemm<128, false, false, true>({128, 256, 768, false, true, false, false}, 1, 23);
    CheckGemm<128, false, true, false>({128, 256, 256, true, false, false, true}, 3, 24);
    CheckGemm<128, true, true, true>({256, 128, 640, true, true, true, false}, 1, 25);
  }
}

// The ping-pong kernel: the warpgroups' turns with an odd and an even number of tiles per CTA
// (6, 2, 2 and 1, 3 tiles), the stage ring (5 stages) wrapping inside and across tiles.
TEST(Fp8GemmEmulationTest, PingPongTiles) {
  emu::g_late_products = true;
  for (bool greedy : {false, true}) {
    emu::g_greedy = greedy;
    CheckGemm<128, true, true, true, true>({256, 384, 768, true, true, true, false}, 1, 26);
    CheckGemm<128, true, true, true, true>({128, 256, 384, true, true, false, false}, 1, 27);
    CheckGemm<128, true, true, false, true>({384, 128, 256, true, false, false, true}, 2, 28);
    CheckGemm<128, true, true, true, true>({384, 128, 128, true, true, true, false}, 1, 29);
  }
}

// The fused cast of fc2's input (kGelu): the BF16 output as CheckGemm checks it, and the
// codes and statistics exactly as GeluCastFp8 makes them from that output: g = bf16(GeluTanh(x))
// (common.cuh's, here on the host), E4M3 of g · scale (satfinite, the CPU backend's encoding),
// amax the largest |g|, saturated |g · scale| > 448, underflow non-zero g with a zero code. The
// scale is chosen so that some values saturate and some flush to zero.
template <int BN, bool kPingPong>
void CheckGeluGemm(int M, int N, int K, int sms, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << M << "x" << N << "x" << K << " BN " << BN << " sms " << sms
                                  << (kPingPong ? " ping-pong" : "") << " GELU cast");
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint8_t> a(size_t(M) * K), b(size_t(N) * K);
  for (auto& x : a) x = cpu::EncodeFp8(nd(rng) * 4.f, Fp8Format::kE4M3);
  for (auto& x : b) x = cpu::EncodeFp8(nd(rng) * 4.f, Fp8Format::kE4M3);
  std::vector<bf16> bias(N), out(size_t(M) * N, __float2bfloat16(NAN));
  for (auto& x : bias) x = __float2bfloat16(nd(rng));
  const float sa = 0.125f, sb = 0.03f;
  // The largest output, in float64, sets the scale: values above 0.7 of it saturate.
  double top = 0;
  for (int m = 0; m < M; ++m) {
    for (int n = 0; n < N; ++n) {
      double acc = 0;
      for (int k = 0; k < K; ++k) {
        acc += double(cpu::DecodeFp8(a[size_t(m) * K + k], Fp8Format::kE4M3)) *
               cpu::DecodeFp8(b[size_t(n) * K + k], Fp8Format::kE4M3);
      }
      top = std::max(top, double(sa) * sb * acc + __bfloat162float(bias[n]));
    }
  }
  const float scale = float(448.0 / (0.7 * top));
  std::vector<uint8_t> codes(size_t(M) * N, 0x7f);  // NaN codes: unwritten shows
  float amax = 0;
  unsigned long long counts[3] = {0, 0, 0};
  RunGemm<BN, true, true, true, kPingPong, true>(out.data(), a.data(), &sa, b.data(), &sb,
                                                 bias.data(), M, N, K, false, sms, codes.data(),
                                                 {&scale, &amax, counts});
  unsigned want_amax = 0;
  unsigned long long want[3] = {0, 0, 0};
  for (size_t i = 0; i < out.size(); ++i) {
    const float x = __bfloat162float(out[i]);
    ASSERT_TRUE(std::isfinite(x)) << "output " << i / N << "," << i % N << " not written";
    const float g = __bfloat162float(__float2bfloat16(GeluTanh(x)));
    const float y = g * scale;
    const uint8_t q = cpu::EncodeFp8(y, Fp8Format::kE4M3);
    ASSERT_EQ(codes[i], q) << "code " << i / N << "," << i % N << " of GELU(" << x << ")";
    unsigned bits;
    std::memcpy(&bits, &g, 4);
    want_amax = std::max(want_amax, bits & 0x7fffffffu);
    if (std::fabs(y) > 448.f) ++want[0];
    if (g != 0.f && (q & 0x7f) == 0) ++want[1];
  }
  unsigned got_amax;
  std::memcpy(&got_amax, &amax, 4);
  EXPECT_EQ(got_amax, want_amax) << "amax";
  EXPECT_EQ(counts[0], want[0]) << "saturated";
  EXPECT_EQ(counts[1], want[1]) << "underflow";
  EXPECT_EQ(counts[2], 0u) << "non-finite";
  EXPECT_GT(want[0], 0u) << "the test's scale saturates nothing";
  EXPECT_GT(want[1], 0u) << "the test's scale flushes nothing";
}

// Both tiles and the ping-pong kernel with the GELU cast: one CTA walking several tiles (the
// staging reused by the BF16 and the FP8 stores of each), and several CTAs.
TEST(Fp8GemmEmulationTest, FusedGeluCast) {
  emu::g_late_products = true;
  for (bool greedy : {false, true}) {
    emu::g_greedy = greedy;
    CheckGeluGemm<256, false>(256, 512, 256, 1, 30);
    CheckGeluGemm<128, false>(256, 256, 384, 3, 31);
    CheckGeluGemm<128, true>(384, 256, 256, 2, 32);
  }
}

}  // namespace
}  // namespace boulder::kernels::cuda::fp8gemm
