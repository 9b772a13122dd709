// Same inputs -> bit-identical outputs: run to run with 2 threads for every op, and across
// thread counts (1, 2, 3) for every op but the GEMMs (OpenBLAS's edge kernels sum in another
// order when the split moves). Shapes are large enough that every op, GEMMs included, runs
// on a team (see WorthParallel).
#include <cstdint>
#include <cstring>
#include <functional>
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
using testutil::RandomVector;

constexpr int kB = 4, kT = 64, kC = 128, kNH = 4, kN = kB * kT;
constexpr int kOC = 192, kV = 96, kVp = 128;

// Runs `op` on a fresh FP32 backend with `threads` threads; `op` fills `out` with the bytes
// of everything the op wrote.
using Op = std::function<void(Backend*, std::vector<char>* out)>;

std::vector<char> Run(const Op& op, int threads) {
  auto be = NewCpuBackend(threads);
  std::vector<char> out;
  op(be.get(), &out);
  return out;
}

template <typename S>
void Append(std::vector<char>* out, const S* data, size_t n) {
  const char* p = reinterpret_cast<const char*>(data);
  out->insert(out->end(), p, p + n * sizeof(S));
}

std::vector<int32_t> Tokens(int n, int vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 31 + 7) % vocab;
  return t;
}

void ExpectDeterministic(const Op& op, bool across_thread_counts = true) {
  const std::vector<char> first = Run(op, 2);
  ASSERT_FALSE(first.empty());
  EXPECT_TRUE(first == Run(op, 2)) << "two runs with 2 threads differ";
  if (across_thread_counts) {
    EXPECT_TRUE(first == Run(op, 1)) << "1 and 2 threads differ";
    EXPECT_TRUE(first == Run(op, 3)) << "3 and 2 threads differ";
  }
}

TEST(DeterminismTest, Encoder) {
  ExpectDeterministic([](Backend* be, std::vector<char>* out) {
    const auto tokens = Tokens(kN, 17);  // repeated tokens: the scatter-add must not race
    Buf<int32_t> tok(be, kN);
    be->CopyFromHost(tok.get(), tokens.data(), kN * sizeof(int32_t));
    Buf<float> wte(be, RandomVector(17 * kC, 1)), wpe(be, RandomVector(kT * kC, 2));
    Buf<float> act(be, kN * kC), dout(be, RandomVector(kN * kC, 3));
    Buf<float> dwte(be, RandomVector(17 * kC, 4)), dwpe(be, RandomVector(kT * kC, 5));
    be->EncoderForward(act.get(), tok.get(), wte.get(), wpe.get(), kB, kT, kC);
    be->EncoderBackward(dwte.get(), dwpe.get(), dout.get(), tok.get(), kB, kT, kC);
    Append(out, act.get(), act.size());
    Append(out, dwte.get(), dwte.size());
    Append(out, dwpe.get(), dwpe.size());
  });
}

TEST(DeterminismTest, LayerNorm) {
  ExpectDeterministic([](Backend* be, std::vector<char>* out) {
    Buf<float> inp(be, RandomVector(kN * kC, 1)), w(be, RandomVector(kC, 2));
    Buf<float> b(be, RandomVector(kC, 3)), act(be, kN * kC), mean(be, kN), rstd(be, kN);
    Buf<float> dout(be, RandomVector(kN * kC, 4)), dinp(be, RandomVector(kN * kC, 5));
    Buf<float> dw(be, RandomVector(kC, 6)), db(be, RandomVector(kC, 7));
    be->LayerNormForward(act.get(), mean.get(), rstd.get(), inp.get(), w.get(), b.get(), kN, kC);
    be->LayerNormBackward(dinp.get(), dw.get(), db.get(), dout.get(), inp.get(), w.get(),
                          mean.get(), rstd.get(), kN, kC);
    for (const Buf<float>* x : {&act, &mean, &rstd, &dinp, &dw, &db}) {
      Append(out, x->get(), x->size());
    }
  });
}

TEST(DeterminismTest, MatmulWithGelu) {
  ExpectDeterministic(
      [](Backend* be, std::vector<char>* out) {
        Buf<float> inp(be, RandomVector(kN * kC, 1)), w(be, RandomVector(kOC * kC, 2, -.1, .1));
        Buf<float> b(be, RandomVector(kOC, 3)), act(be, kN * kOC), pre(be, kN * kOC);
        Buf<float> dout(be, RandomVector(kN * kOC, 4)), dinp(be, kN * kC);
        Buf<float> dw(be, RandomVector(kOC * kC, 5)), db(be, RandomVector(kOC, 6));
        be->MatmulForward(act.get(), pre.get(), inp.get(), w.get(), b.get(), kN, kC, kOC,
                          Epilogue::kGelu);
        be->MatmulBackward(dinp.get(), dw.get(), db.get(), dout.get(), pre.get(), inp.get(),
                           w.get(), kN, kC, kOC);
        for (const Buf<float>* x : {&act, &pre, &dout, &dinp, &dw, &db}) {
          Append(out, x->get(), x->size());
        }
      },
      /*across_thread_counts=*/false);
}

TEST(DeterminismTest, Attention) {
  ExpectDeterministic([](Backend* be, std::vector<char>* out) {
    Buf<float> qkv(be, RandomVector(kN * 3 * kC, 1)), act(be, kN * kC);
    Buf<float> stats(be, kB * kNH * kT), dout(be, RandomVector(kN * kC, 2));
    Buf<float> dqkv(be, kN * 3 * kC);
    be->AttentionForward(act.get(), stats.get(), qkv.get(), kB, kT, kC, kNH);
    be->AttentionBackward(dqkv.get(), dout.get(), qkv.get(), act.get(), stats.get(), kB, kT, kC,
                          kNH);
    for (const Buf<float>* x : {&act, &stats, &dqkv}) Append(out, x->get(), x->size());
  });
}

TEST(DeterminismTest, CrossEntropyArgmaxResidual) {
  ExpectDeterministic([](Backend* be, std::vector<char>* out) {
    const int N = 512;
    const auto targets = Tokens(N, kV);
    Buf<int32_t> tgt(be, N), best(be, N);
    be->CopyFromHost(tgt.get(), targets.data(), N * sizeof(int32_t));
    Buf<float> logits(be, RandomVector(N * kVp, 1, -5, 5)), losses(be, N);
    be->Argmax(best.get(), logits.get(), N, kV, kVp);
    be->SoftmaxCrossEntropy(losses.get(), logits.get(), tgt.get(), N, kV, kVp, 1.0f / N);
    Buf<float> a(be, RandomVector(N * kVp, 2)), sum(be, N * kVp);
    be->ResidualForward(sum.get(), a.get(), logits.get(), N * kVp);
    Append(out, best.get(), N);
    for (const Buf<float>* x : {&logits, &losses, &sum}) Append(out, x->get(), x->size());
  });
}

TEST(DeterminismTest, NormAndAdamW) {
  ExpectDeterministic([](Backend* be, std::vector<char>* out) {
    const size_t n = 140001;  // a few NormSquared chunks
    Buf<float> params(be, RandomVector(n, 1)), grads(be, RandomVector(n, 2));
    Buf<float> m(be, RandomVector(n, 3, 0, 0.1)), v(be, RandomVector(n, 4, 0, 0.01));
    Buf<float> norm(be, 1);
    be->NormSquared(norm.get(), grads.get(), n);
    be->AdamW(params.get(), nullptr, grads.get(), m.get(), v.get(), DecayBits{}, n, 1e-3f, 0.9f,
              0.95f, 1e-8f, 0.1f, 3, 1.0f, norm.get(), 1.0f);
    for (const Buf<float>* x : {&norm, &params, &m, &v}) Append(out, x->get(), x->size());
  });
}

// NOLINTEND(bugprone-implicit-widening-of-multiplication-result)

}  // namespace
}  // namespace boulder::kernels::cpu
