#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/test_util.h"

namespace boulder::kernels::cpu {
namespace {

// Shapes here are small int constants, so their products cannot overflow int.
// NOLINTBEGIN(bugprone-implicit-widening-of-multiplication-result)

using testutil::Buf;
using testutil::Dot;
using testutil::ExpectAccumulated;
using testutil::ExpectAllClose;
using testutil::NumericGrad;
using testutil::RandomVector;

constexpr int kB = 2, kT = 5, kC = 8;
constexpr int kV = 3;  // fewer tokens than positions: the backward must add repeats up

std::vector<int32_t> Tokens() {
  std::vector<int32_t> tokens(kB * kT);
  for (int i = 0; i < kB * kT; ++i) tokens[i] = (i * 7 + i / 3) % kV;
  return tokens;
}

TEST(EncoderTest, ForwardAddsTokenAndPositionRows) {
  auto be = NewCpuBackendF64();
  const auto tokens = Tokens();
  const auto wte_v = RandomVector(kV * kC, 1), wpe_v = RandomVector(kT * kC, 2);
  Buf<int32_t> tok(be.get(), tokens.size());
  be->CopyFromHost(tok.get(), tokens.data(), tokens.size() * sizeof(int32_t));
  Buf<double> wte(be.get(), wte_v), wpe(be.get(), wpe_v), out(be.get(), kB * kT * kC);
  out.Poison();
  be->EncoderForward(out.get(), tok.get(), wte.get(), wpe.get(), kB, kT, kC);
  std::vector<double> want(kB * kT * kC);
  for (int n = 0; n < kB * kT; ++n) {
    for (int c = 0; c < kC; ++c) {
      want[n * kC + c] = wte_v[tokens[n] * kC + c] + wpe_v[(n % kT) * kC + c];
    }
  }
  ExpectAllClose(want, out.get(), 0, "out");
}

TEST(EncoderTest, BackwardMatchesFiniteDifferencesAndAccumulates) {
  auto be = NewCpuBackendF64();
  const auto tokens = Tokens();
  Buf<int32_t> tok(be.get(), tokens.size());
  be->CopyFromHost(tok.get(), tokens.data(), tokens.size() * sizeof(int32_t));
  Buf<double> wte(be.get(), RandomVector(kV * kC, 11)), wpe(be.get(), RandomVector(kT * kC, 12));
  Buf<double> out(be.get(), kB * kT * kC);
  const auto r = RandomVector(kB * kT * kC, 13);
  auto loss = [&] {
    be->EncoderForward(out.get(), tok.get(), wte.get(), wpe.get(), kB, kT, kC);
    return Dot(r, out.get());
  };
  const auto fd_wte = NumericGrad(wte.get(), wte.size(), loss);
  const auto fd_wpe = NumericGrad(wpe.get(), wpe.size(), loss);

  const auto dwte0 = RandomVector(kV * kC, 14), dwpe0 = RandomVector(kT * kC, 15);
  Buf<double> dwte(be.get(), dwte0), dwpe(be.get(), dwpe0), dout(be.get(), r);
  for (int call = 1; call <= 2; ++call) {
    SCOPED_TRACE(call);
    be->EncoderBackward(dwte.get(), dwpe.get(), dout.get(), tok.get(), kB, kT, kC);
    ExpectAccumulated(dwte0, dwte.get(), call, fd_wte, 1e-9, "dwte");
    ExpectAccumulated(dwpe0, dwpe.get(), call, fd_wpe, 1e-9, "dwpe");
  }
}

// NOLINTEND(bugprone-implicit-widening-of-multiplication-result)

}  // namespace
}  // namespace boulder::kernels::cpu
