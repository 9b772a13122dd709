#include "kernels/cpu/cpu_backend.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace boulder::kernels::cpu {
namespace {

using ::testing::HasSubstr;

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_STREQ(DTypeName(DType::kF32), "fp32");
  EXPECT_STREQ(DTypeName(DType::kF64), "fp64");
  EXPECT_STREQ(DTypeName(DType::kBF16), "bf16");
}

TEST(CpuBackendTest, DescribesItself) {
  auto f32 = NewCpuBackend(3);
  EXPECT_EQ(f32->name(), "cpu");
  EXPECT_EQ(f32->compute_dtype(), DType::kF32);
  EXPECT_EQ(f32->state_dtype(), DType::kF32);
  EXPECT_EQ(static_cast<CpuBackend<float>*>(f32.get())->num_threads(), 3);
  auto f64 = NewCpuBackendF64();
  EXPECT_EQ(f64->compute_dtype(), DType::kF64);
  EXPECT_EQ(f64->state_dtype(), DType::kF64);
  EXPECT_EQ(static_cast<CpuBackend<double>*>(f64.get())->num_threads(), 1);
  // 0 = every core this process may use.
  EXPECT_GE(CpuBackend<float>(0).num_threads(), 1);
  EXPECT_TRUE(f32->Synchronize().ok());
}

TEST(CpuBackendTest, TracksAllocationsAndPeak) {
  auto be = NewCpuBackend(1);
  const MemoryStats empty = be->GetMemoryStats();
  EXPECT_EQ(empty.allocated_bytes, 0);
  EXPECT_EQ(empty.peak_bytes, 0);
  EXPECT_GT(empty.device_total_bytes, int64_t{1} << 20);

  auto a = be->Alloc(1000);
  auto b = be->Alloc(24);
  auto z = be->Alloc(0);
  ASSERT_TRUE(a.ok() && b.ok() && z.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*a) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*b) % 64, 0u);
  EXPECT_NE(*z, nullptr);
  MemoryStats s = be->GetMemoryStats();
  EXPECT_EQ(s.allocated_bytes, 1024);
  EXPECT_EQ(s.reserved_bytes, 1024);
  EXPECT_EQ(s.peak_bytes, 1024);

  be->Free(*a);
  s = be->GetMemoryStats();
  EXPECT_EQ(s.allocated_bytes, 24);
  EXPECT_EQ(s.reserved_bytes, 24);
  EXPECT_EQ(s.peak_bytes, 1024);
  be->Free(*b);
  be->Free(*z);
  be->Free(nullptr);
  EXPECT_EQ(be->GetMemoryStats().allocated_bytes, 0);
}

TEST(CpuBackendTest, ImpossibleAllocationIsResourceExhausted) {
  auto be = NewCpuBackend(1);
  const size_t huge = std::numeric_limits<size_t>::max() / 2;
  auto p = be->Alloc(huge);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(p.status().message(), HasSubstr(std::to_string(huge) + " bytes"));
  EXPECT_EQ(be->GetMemoryStats().allocated_bytes, 0);
}

TEST(CpuBackendTest, CopiesConvertBetweenDtypes) {
  auto be = NewCpuBackend(1);
  const std::vector<float> src = {1.0f, -2.5f, 3.1415926f, 1e-3f, 0.0f};
  const size_t n = src.size();

  auto f32 = be->Alloc(n * 4);
  ASSERT_TRUE(f32.ok());
  be->CopyFromHostF32(*f32, DType::kF32, src.data(), n);
  std::vector<float> back(n);
  be->CopyToHostF32(back.data(), *f32, DType::kF32, n);
  EXPECT_EQ(back, src);

  auto f64 = be->Alloc(n * 8);
  ASSERT_TRUE(f64.ok());
  be->CopyFromHostF32(*f64, DType::kF64, src.data(), n);
  EXPECT_EQ(static_cast<double*>(*f64)[2], static_cast<double>(src[2]));
  be->CopyToHostF32(back.data(), *f64, DType::kF64, n);
  EXPECT_EQ(back, src);

  auto raw = be->Alloc(n * 4);
  ASSERT_TRUE(raw.ok());
  be->CopyFromHost(*raw, src.data(), n * 4);
  std::vector<float> raw_back(n);
  be->CopyToHost(raw_back.data(), *raw, n * 4);
  EXPECT_EQ(raw_back, src);

  be->Memset0(*raw, n * 4);
  be->CopyToHost(raw_back.data(), *raw, n * 4);
  EXPECT_EQ(raw_back, std::vector<float>(n, 0.0f));
  for (void* p : {*f32, *f64, *raw}) be->Free(p);
}

TEST(CpuBackendTest, Bf16RoundsToNearestEven) {
  auto be = NewCpuBackend(1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // bf16 keeps 8 significand bits: near 1 its spacing is 2^-7.
  const std::vector<float> src = {1.0f + 0x1p-8f,      // halfway, even neighbour below -> 1
                                  1.0f + 3 * 0x1p-8f,  // halfway, even neighbour above -> 1 + 2^-6
                                  1.0f + 0x1p-8f + 0x1p-12f,  // just above halfway -> 1 + 2^-7
                                  -3.0f,
                                  65536.0f,
                                  nan};
  const std::vector<float> want = {1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, -3.0f, 65536.0f};
  auto buf = be->Alloc(src.size() * 2);
  ASSERT_TRUE(buf.ok());
  be->CopyFromHostF32(*buf, DType::kBF16, src.data(), src.size());
  std::vector<float> back(src.size());
  be->CopyToHostF32(back.data(), *buf, DType::kBF16, src.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(back[i], want[i]) << i;
  EXPECT_TRUE(std::isnan(back.back()));
  be->Free(*buf);
}

// MatmulFp8GeluCast (the cpu backend takes it: the Model's fused fc1 + fc2-input-cast path)
// gives what MatmulFp8 then GeluCastFp8 give: the pre-activation, the codes, amax and counters,
// over more rows than one of its GELU bands holds (bands of about 1M values), added to
// statistics that already hold something.
TEST(CpuBackendTest, MatmulFp8GeluCastIsTheGemmThenGeluCastFp8) {
  auto be = NewCpuBackend(2);
  const int M = 4160, N = 384, K = 32;
  std::vector<uint8_t> a(size_t(M) * K), b(size_t(N) * K);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>((i * 37 + 11) % 126);
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = static_cast<uint8_t>(((i * 53 + 5) % 126) | 0x80 * (i % 3 == 0));
  std::vector<float> bias(N);
  for (int n = 0; n < N; ++n) bias[n] = 0.25f * (n % 9) - 1.f;
  const float sa = 0.5f, sb = 0.0625f, scale = 24.f;
  std::vector<float> pre[2], g(size_t(M) * N);
  std::vector<uint8_t> codes[2];
  float amax[2] = {3.f, 3.f};
  uint64_t counts[2][kFp8CountersPerTensor] = {{1, 2, 0}, {1, 2, 0}};
  for (int k = 0; k < 2; ++k) {
    pre[k].assign(size_t(M) * N, NAN);
    codes[k].assign(size_t(M) * N, 0x7f);
  }
  ASSERT_TRUE(be->MatmulFp8GeluCast(pre[0].data(), codes[0].data(), a.data(), Fp8Format::kE4M3, &sa,
                                    b.data(), Fp8Format::kE4M3, &sb, bias.data(), M, N, K,
                                    Fp8Format::kE4M3, &scale, &amax[0], counts[0]));
  be->MatmulFp8(pre[1].data(), a.data(), Fp8Format::kE4M3, &sa, b.data(), Fp8Format::kE4M3, &sb,
                bias.data(), M, N, K, false, true);
  be->GeluCastFp8(codes[1].data(), nullptr, g.data(), pre[1].data(), M, N, Fp8Format::kE4M3, &scale,
                  &amax[1], counts[1]);
  EXPECT_EQ(std::memcmp(pre[0].data(), pre[1].data(), pre[0].size() * sizeof(float)), 0);
  EXPECT_EQ(codes[0], codes[1]);
  EXPECT_EQ(amax[0], amax[1]);
  EXPECT_GT(amax[1], 3.f);
  for (int c = 0; c < kFp8CountersPerTensor; ++c) EXPECT_EQ(counts[0][c], counts[1][c]) << c;
  EXPECT_GT(counts[1][0], 1u) << "nothing saturated";
  EXPECT_GT(counts[1][1], 2u) << "nothing flushed to zero";
}

// AttentionForwardFp8Cast (taken here: the Model's fused attention + projection-input cast)
// gives what AttentionForward then CastFp8 give.
TEST(CpuBackendTest, AttentionForwardFp8CastIsTheForwardThenCastFp8) {
  auto be = NewCpuBackend(2);
  const int B = 2, T = 33, NH = 2, C = 128;
  std::vector<float> qkv(size_t(B) * T * 3 * C);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = std::sin(0.37f * float(i)) * (1 + i % 5);
  std::vector<float> out[2], stats[2];
  std::vector<uint8_t> codes[2];
  const float scale = 300.f;
  float amax[2] = {0.f, 0.f};
  uint64_t counts[2][kFp8CountersPerTensor] = {{0, 0, 0}, {0, 0, 0}};
  for (int k = 0; k < 2; ++k) {
    out[k].assign(size_t(B) * T * C, NAN);
    stats[k].assign(size_t(B) * NH * T, NAN);
    codes[k].assign(size_t(B) * T * C, 0x7f);
  }
  ASSERT_TRUE(be->AttentionForwardFp8Cast(out[0].data(), stats[0].data(), qkv.data(), B, T, C, NH,
                                          codes[0].data(), Fp8Format::kE4M3, &scale, &amax[0],
                                          counts[0]));
  be->AttentionForward(out[1].data(), stats[1].data(), qkv.data(), B, T, C, NH);
  be->CastFp8(codes[1].data(), nullptr, out[1].data(), B * T, C, Fp8Format::kE4M3, &scale, &amax[1],
              counts[1]);
  EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(stats[0].data(), stats[1].data(), stats[0].size() * sizeof(float)), 0);
  EXPECT_EQ(codes[0], codes[1]);
  EXPECT_EQ(amax[0], amax[1]);
  EXPECT_GT(amax[1], 0.f);
  for (int c = 0; c < kFp8CountersPerTensor; ++c) EXPECT_EQ(counts[0][c], counts[1][c]) << c;
  EXPECT_GT(counts[1][0], 0u) << "nothing saturated";
}

}  // namespace
}  // namespace boulder::kernels::cpu
