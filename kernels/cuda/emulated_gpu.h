// An emulated GPU for the device code of this folder's kernels, compiled as host C++: included
// by exactly one translation unit of each emulation test (attention_emulation_test.cc,
// fp8_gemm_emulation_test.cc), before anything else, since it defines the emulator's state and
// the CUDA built-ins the kernels call. Runs on any machine, so fragment layouts, tile index
// arithmetic, masks, padding and pipelining are tested without a GPU (cuda_ops_test and
// cuda_fp8_test, label gpu, run the same kernels on the device).
//
// The emulation: every CUDA thread of a block is a fiber on one OS thread (started with
// makecontext, switched with _setjmp/_longjmp, which unlike swapcontext make no system call),
// switched at barriers. __syncthreads, __syncwarp, named barriers, shuffles, warp reductions and
// the PTX primitives ldmatrix and mma.sync are warp- or block-wide rendezvous implementing the
// PTX ISA's fragment layouts; the sm_90a kernels' wgmma products (attention_{fwd,bwd}_sm90.cuh)
// are recorded at issue and run at the warpgroup-wide wait that retires them (so a read of the
// accumulators before that wait sees stale values, and shared memory is read as it is then),
// decoding the shared-memory descriptors and the 128-byte swizzle as wgmma.cuh describes them;
// shared and global memory are host memory; shared memory is poisoned with NaN before each
// block, and every shared access of the primitives is bounds- and alignment-checked. cp.async
// copies land either when issued or only at the cp.async.wait that covers them (both are run:
// the first exposes a refill racing with readers, the second a read before the data landed).
// A deadlock (threads waiting at different barriers) fails the test. The FP8 GEMM's TMA loads,
// TMA stores, mbarriers and FP8 wgmma are emulated too (emulated_gpu_tma.h); its tests run the
// wgmma products late (g_late_products), so a stage freed before the products reading it
// retire is refilled under them, and its TMA stores read the staging only at the bulk wait, so
// staging overwritten before that wait shows; with g_late_loads a TMA load lands only when a
// thread waits on its barrier, so a stage read without that wait shows.
//
// Shared memory written through the generic proxy (st.shared) and read by a TMA store must be
// fenced (fence.proxy.async) by its writer before the store is issued, or the test fails.
//
// What it cannot see: device-only numerics (exp2f is exact here, ex2.approx on the GPU), the
// real timing of cp.async, the async proxy's other orderings (cp.async and plain stores before
// wgmma reads are not tracked), and anything in the launchers (attention_fwd*.cu,
// attention_bwd*.cu, fp8_gemm_sm90.cu), whose launch sequences the tests mirror. That the
// emulated descriptor and swizzle semantics match the hardware's is checked by the same kernels
// passing cuda_ops_test and cuda_fp8_test on an H200.
#ifndef BOULDER_KERNELS_CUDA_EMULATED_GPU_H_
#define BOULDER_KERNELS_CUDA_EMULATED_GPU_H_
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

// A bulk-group operation (a TMA store, a 1-D bulk copy): checked and recorded at issue, done
// when the issuing thread's wait retires its group (cp.async.bulk.wait_group), so overwriting
// the staging before that wait shows in the output.
using BulkOp = std::function<void()>;

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
  std::vector<BulkOp> bulk_open;  // both kinds in one group list, as on the GPU
  std::deque<std::vector<BulkOp>> bulk_groups;
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

// The proxies of shared memory: a byte written through the generic proxy (st.shared, the FP8
// GEMM's staging) is unfenced until its writer executes fence.proxy.async; an async-proxy read
// (a TMA store's source) of an unfenced byte fails the test, since on the GPU it may not see
// the write. By shared address: the writer's thread index + 1, or 0.
std::vector<int> g_unfenced;
std::vector<std::vector<uint32_t>> g_unfenced_by_thread;
void NoteGenericWrite(uint32_t addr, int bytes);
void FenceProxyAsync();
void CheckAsyncProxyRead(uint32_t addr, const char* what);

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

void NoteGenericWrite(uint32_t addr, int bytes);

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
  g_unfenced.assign(kMaxSmem, 0);
  g_unfenced_by_thread.assign(threads, {});
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
        if (!f.bulk_open.empty() || !f.bulk_groups.empty()) {
          Die("a TMA store or bulk copy was never waited for");
        }
      }
      for (const Rendezvous& r : b.named) {
        if (r.count != 0) Die("a named barrier was left with arrivals no thread waited for");
      }
      return;
    }
    if (!progressed) Die("deadlock: threads wait at barriers that never complete");
  }
}

void NoteGenericWrite(uint32_t addr, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    if (g_unfenced[addr + i] == 0) g_unfenced_by_thread[Tid()].push_back(addr + i);
    g_unfenced[addr + i] = Tid() + 1;
  }
}
void FenceProxyAsync() {
  for (uint32_t a : g_unfenced_by_thread[Tid()]) {
    if (g_unfenced[a] == Tid() + 1) g_unfenced[a] = 0;
  }
  g_unfenced_by_thread[Tid()].clear();
}
void CheckAsyncProxyRead(uint32_t addr, const char* what) {
  if (g_unfenced[addr] != 0) {
    std::fprintf(stderr,
                 "emulated GPU: %s reads shared byte %u, which thread %d wrote without a "
                 "fence.proxy.async after it\n",
                 what, addr, g_unfenced[addr] - 1);
    Die("a generic-proxy write read by the async proxy without fence.proxy.async");
  }
}

// bar.sync id (threads arrive at it, then all continue) and bar.arrive id (arrive only).
void NamedSync(int id, int threads) {
  if (id <= 0 || id >= 16 || threads % 32 != 0) Die("bar.sync operands");
  Rendezvous& r = g_block.named[id];
  const uint64_t gen = r.gen;
  if (++r.count == threads) {
    r.count = 0;
    ++r.gen;
    return;
  }
  WaitWhile(&r.gen, gen);
}
void NamedArrive(int id, int threads) {
  if (id <= 0 || id >= 16 || threads % 32 != 0) Die("bar.arrive operands");
  Rendezvous& r = g_block.named[id];
  if (++r.count == threads) {
    r.count = 0;
    ++r.gen;
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
  emu::NamedSync(kId, kThreads);
}

}  // namespace boulder::kernels::cuda::attn

namespace boulder::kernels::cuda::wgmma {

using emu::Die;

// Shared memory by address (wgmma.cuh): each write is noted as the generic proxy's, so an
// async-proxy read (wgmma, TMA store, bulk copy) of it without a fence in between dies.
void StoreShared32(uint32_t addr, uint32_t v) {
  if (addr % 4 != 0 || addr + 4 > emu::g_block.smem_bytes) Die("st.shared.b32 out of bounds");
  std::memcpy(attn::smem + addr, &v, 4);
  emu::NoteGenericWrite(addr, 4);
}
void StoreShared16(uint32_t addr, uint16_t v) {
  if (addr % 2 != 0 || addr + 2 > emu::g_block.smem_bytes) Die("st.shared.b16 out of bounds");
  std::memcpy(attn::smem + addr, &v, 2);
  emu::NoteGenericWrite(addr, 2);
}
uint32_t LoadShared32(uint32_t addr) {
  if (addr % 4 != 0 || addr + 4 > emu::g_block.smem_bytes) Die("ld.shared.b32 out of bounds");
  uint32_t v;
  std::memcpy(&v, attn::smem + addr, 4);
  return v;
}

// Bulk groups (wgmma.cuh): one list per thread for TMA stores (emulated_gpu_tma.h) and 1-D
// copies. A 1-D copy checks at issue that its source bytes were fenced after their generic
// writes and reads them at the wait that retires its group, so a staging overwritten before
// that wait shows; with g_eager_copies it reads them at issue instead, so bytes not yet
// written then show.
void BulkStore(void* dst, uint32_t src, uint32_t bytes) {
  if (bytes % 16 != 0 || src % 16 != 0 || reinterpret_cast<uintptr_t>(dst) % 16 != 0) {
    Die("bulk copy: size and addresses must be multiples of 16");
  }
  if (src + bytes > emu::g_block.smem_bytes) Die("bulk copy: source outside shared memory");
  for (uint32_t i = 0; i < bytes; ++i) emu::CheckAsyncProxyRead(src + i, "bulk copy");
  std::vector<unsigned char> read;
  if (emu::g_eager_copies) read.assign(attn::smem + src, attn::smem + src + bytes);
  emu::Me().bulk_open.push_back([dst, src, bytes, read = std::move(read)] {
    std::memcpy(dst, read.empty() ? attn::smem + src : read.data(), bytes);
  });
}
void BulkCommit() {
  emu::Fiber& f = emu::Me();
  f.bulk_groups.push_back(std::move(f.bulk_open));
  f.bulk_open.clear();
}
template <int N>
void BulkWaitRead() {
  emu::Fiber& f = emu::Me();
  while (f.bulk_groups.size() > size_t(N)) {
    for (const emu::BulkOp& op : f.bulk_groups.front()) op();
    f.bulk_groups.pop_front();
  }
}
void BulkWaitAll() { BulkWaitRead<0>(); }

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

// d (+)= A·B for a product m64nNk{K} (N = ops[0]->n) into each of the warpgroup's 128 threads'
// accumulators (ops[t]: thread t's record of it), in float64 from the decoded operands:
// warp w's thread (g, q) holds rows 16w + g (+ 8) and, in 8-column block j, columns 8j + 2q
// (+ 1), as wgmma.cuh describes.
template <int K>
void Accumulate(const std::vector<const emu::WgOp*>& ops, const double (&A)[64][K],
                const double (&B)[K][256]) {
  const emu::WgOp& o = *ops[0];
  for (int t = 0; t < 128; ++t) {
    const int w = t / 32, g = (t % 32) / 4, q = t % 4;
    for (int j = 0; j < o.n / 8; ++j) {
      for (int e = 0; e < 4; ++e) {
        const int m = 16 * w + g + (e >> 1) * 8, n = 8 * j + 2 * q + (e & 1);
        double acc = o.scale_d ? double(ops[t]->d[4 * j + e]) : 0.0;
        for (int k = 0; k < K; ++k) acc += A[m][k] * B[k][n];
        ops[t]->d[4 * j + e] = float(acc);
      }
    }
  }
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
  Accumulate(ops, A, B);
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
  Accumulate(ops, A, B);
}

void Fence() {}
void FenceProxyAsync() { emu::FenceProxyAsync(); }
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
void WgmmaSS256(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  Record(false, 256, 0, 0, desc_a, desc_b, scale_d, nullptr, d);
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

#endif  // BOULDER_KERNELS_CUDA_EMULATED_GPU_H_
