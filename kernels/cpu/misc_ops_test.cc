// Residual, NormSquared, Argmax and the GELU/tanh helpers.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/test_util.h"

namespace boulder::kernels::cpu {
namespace {

using testutil::Buf;
using testutil::ExpectAllClose;
using testutil::NumericGrad;
using testutil::RandomVector;

TEST(ResidualTest, AddsAndAllowsInPlace) {
  auto be = NewCpuBackend(2);
  const size_t n = 100003;  // large enough to run on the team, odd for the vector tail
  const auto a = RandomVector(n, 1), b = RandomVector(n, 2);
  Buf<float> abuf(be.get(), a), bbuf(be.get(), b), out(be.get(), n);
  out.Poison();
  be->ResidualForward(out.get(), abuf.get(), bbuf.get(), n);
  std::vector<double> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = static_cast<double>(abuf[i]) + bbuf[i];
  ExpectAllClose(want, out.get(), 1e-7, "out");
  be->ResidualForward(abuf.get(), abuf.get(), bbuf.get(), n);
  ExpectAllClose(out.ToVector(), abuf.get(), 0, "in place");
}

TEST(NormSquaredTest, SumsSquaresAcrossChunks) {
  for (size_t n : {size_t{0}, size_t{5}, size_t{300007}}) {
    SCOPED_TRACE(n);
    auto be = NewCpuBackend(2);
    const auto x = RandomVector(n, 3);
    Buf<float> buf(be.get(), std::max<size_t>(n, 1));
    buf.Set(x);
    Buf<float> out(be.get(), 1);
    out.Poison();
    be->NormSquared(out.get(), buf.get(), n);
    double want = 0;
    for (size_t i = 0; i < n; ++i) want += static_cast<double>(buf[i]) * buf[i];
    EXPECT_NEAR(out[0], want, 1e-6 * want) << "n=" << n;
  }
}

TEST(ArgmaxTest, FirstMaximumAmongRealColumns) {
  auto be = NewCpuBackendF64();
  const int N = 4, V = 5, Vp = 8;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> x = {
      0,   3,  1,  3,  2,  /*padding*/ 9, 9, 9,  // tie: the first 3 wins; padding ignored
      -5,  -4, -3, -2, -1, /*padding*/ 0, 0, 0,  // all negative: last column
      nan, 1,  2,  0,  0,  /*padding*/ 0, 0, 0,  // a NaN first gives way to numbers
      7,   7,  7,  7,  7,  /*padding*/ 8, 8, 8,  // all equal: column 0
  };
  Buf<double> logits(be.get(), x);
  Buf<int32_t> out(be.get(), N);
  be->Argmax(out.get(), logits.get(), N, V, Vp);
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[1], 4);
  EXPECT_EQ(out[2], 2);
  EXPECT_EQ(out[3], 0);
}

TEST(GeluTest, FastTanhIsAccurate) {
  double max_err = 0;
  for (float x = -12.0f; x <= 12.0f; x += 1.0f / 1024) {
    max_err = std::max(max_err, std::fabs(FastTanh(x) - std::tanh(static_cast<double>(x))));
  }
  EXPECT_LT(max_err, 5e-7);
  EXPECT_EQ(FastTanh(1e-5f), 1e-5f);
  EXPECT_EQ(FastTanh(-0.0f), -0.0f);
}

TEST(GeluTest, ForwardAndGradient) {
  std::vector<double> x = RandomVector(64, 5, -6, 6);
  x.push_back(0.0);
  for (double xi : x) {
    const double u = std::sqrt(2 / M_PI) * (xi + 0.044715 * xi * xi * xi);
    const double want = 0.5 * xi * (1 + std::tanh(u));
    EXPECT_NEAR(Gelu<double>(xi), want, 1e-15) << xi;
    EXPECT_NEAR(Gelu<float>(static_cast<float>(xi)), want, 1e-6 * (1 + std::fabs(xi))) << xi;
    double y = xi;
    const auto fd = NumericGrad(&y, 1, [&] { return Gelu<double>(y); });
    EXPECT_NEAR(GeluGrad<double>(xi), fd[0], 1e-9) << xi;
    // In float, FastTanh's 4e-7 error is multiplied by x·du (up to ~10 where tanh is not
    // yet ±1).
    EXPECT_NEAR(GeluGrad<float>(static_cast<float>(xi)), fd[0], 5e-6) << xi;
  }
}

// The replica checksum: every byte and its position count, the value does not depend on the
// backend (the cpu backend hashes in place, the default copies first), and a partial last
// word is zero-padded.
TEST(ChecksumTest, DependsOnEveryByteAndItsPlace) {
  std::vector<uint8_t> bytes(1003);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>((i * 131 + 7) % 251);
  const uint64_t h = ChecksumHost(bytes.data(), bytes.size());
  EXPECT_NE(h, 0u);
  EXPECT_EQ(ChecksumHost(bytes.data(), bytes.size()), h);
  for (size_t i : {size_t{0}, size_t{1}, size_t{500}, size_t{1002}}) {
    for (int bit : {0, 7}) {
      std::vector<uint8_t> flipped = bytes;
      flipped[i] ^= static_cast<uint8_t>(1u << bit);
      EXPECT_NE(ChecksumHost(flipped.data(), flipped.size()), h) << "byte " << i << " bit " << bit;
    }
  }
  // Two words swapped: the same multiset of words, another checksum.
  std::vector<uint8_t> swapped = bytes;
  std::swap_ranges(swapped.begin(), swapped.begin() + 4, swapped.begin() + 8);
  EXPECT_NE(ChecksumHost(swapped.data(), swapped.size()), h);
  // The last word zero-padded: 1003 bytes read as 1004 with a zero byte.
  std::vector<uint8_t> padded = bytes;
  padded.push_back(0);
  EXPECT_EQ(ChecksumHost(padded.data(), padded.size()), h);
  EXPECT_EQ(ChecksumHost(bytes.data(), 0), 0u);

  std::unique_ptr<Backend> be = NewCpuBackend(1);
  absl::StatusOr<void*> p = be->Alloc(bytes.size());
  ASSERT_TRUE(p.ok());
  be->CopyFromHost(*p, bytes.data(), bytes.size());
  absl::StatusOr<uint64_t> got = be->Checksum(*p, bytes.size());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, h);
  got = be->Backend::Checksum(*p, bytes.size());  // the default: a host copy, then the same
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, h);
  be->Free(*p);
}

}  // namespace
}  // namespace boulder::kernels::cpu
