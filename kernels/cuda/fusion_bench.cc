// fusion_bench: what the backward's fused cuBLASLt epilogues and the fused residual+LayerNorm
// save, per op and per training step, on the benchmark workloads' shapes.
//
// Times through CudaBackend (CUDA events, median of --reps after a warm-up), each op with the
// fusion on and off (CudaBackend::set_fused_epilogues; for the LayerNorm the fused op against
// ResidualForward + LayerNormForward):
//   fc2+gelu bwd   MatmulBackwardGelu: fc2's data gradient with dGELU and fc1's bias gradient
//                  (DGELU_BGRAD) and fc2's weight gradient with its bias gradient (BGRADB);
//   fc2+dgelu bwd  the same op with the DGELU epilogue alone and fc1's bias gradient a column
//                  sum (CudaBackend::set_dgelu_epilogue), against the unfused kernels (not
//                  counted in the total);
//   qkv bwd        MatmulBackward with a bias gradient (BGRADB), likewise attn proj;
//   X 2 streams    each Linear's BF16 backward (and the LM head's) with the weight gradient's
//                  GEMM on a second stream beside the data gradient's, against one stream
//                  (CudaBackend::set_concurrent_weight_gradient; not counted in the total);
//   residual+ln    ResidualLayerNormForward;
//   ln+fp8 cast    ResidualLayerNormFp8Forward (FP8 GPUs only): the LayerNorm writing its
//                  Linear's FP8 input and transpose, against ResidualLayerNormForward + CastFp8
//                  (CudaBackend::set_fused_layernorm_fp8);
//   ln fp8 recomp  LayerNormFp8FromStats (FP8 GPUs only): the backward recomputing that FP8
//                  transpose from the kept input and statistics, against LayerNormFromStats +
//                  CastFp8; its fused time x 2 x layers is what the recomputation adds to a
//                  step (printed as "recompute adds");
//   ln bwd         LayerNormBackward per call, against the kernels before the one-pass block
//                  kernel for C >= 1024 (SetLayerNormReferenceKernels);
//   ln+fp8 q       the forward as training runs it (FP8 rows only: a row kernel), and each
//                  LayerNorm forward op against the kernels it ran before (the chunk loop,
//                  the FP8 ops on the 32-row tile: kernels::cuda::SetLayerNormReferenceKernels),
//                  and the forward with a transpose at 8, 16 and 32 warps per block.
// "per step" multiplies by the op's count in one step (layers, or 2 x layers for the LayerNorm).
//
//   fusion_bench [--workloads seed,gpt2,h2048] [--reps 20] [--deterministic]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/ops.h"

namespace {

using boulder::kernels::DType;
using boulder::kernels::cuda::CudaBackend;

struct Workload {
  std::string name;
  int N, C, F, layers, V, Vp;  // V, Vp: vocabulary and its padded width
};

void Die(const std::string& what) {
  std::fprintf(stderr, "fusion_bench: %s\n", what.c_str());
  std::exit(1);
}

class Bench {
 public:
  Bench(CudaBackend* be, int reps) : be_(be), reps_(reps) {
    cudaEventCreate(&start_);
    cudaEventCreate(&stop_);
  }
  ~Bench() {
    for (void* p : bufs_) be_->Free(p);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  // A BF16 buffer of n random values (scale 0.05).
  void* Buf(size_t n) {
    auto p = be_->Alloc(n * 2);
    if (!p.ok()) Die(std::string(p.status().message()));
    std::vector<float> v(n);
    std::normal_distribution<float> d(0.f, 0.05f);
    for (float& x : v) x = d(rng_);
    be_->CopyFromHostF32(*p, DType::kBF16, v.data(), n);
    bufs_.push_back(*p);
    return *p;
  }
  float* F32(size_t n) {
    auto p = be_->Alloc(n * 4);
    if (!p.ok()) Die(std::string(p.status().message()));
    bufs_.push_back(*p);
    return static_cast<float*>(*p);
  }
  // Median milliseconds of one call of op (the backend's stream is the default one's peer:
  // synchronise around the events through the backend).
  double Time(const std::function<void()>& op) {
    op();  // warm-up: plans, autotuning, scratch growth
    if (!be_->Synchronize().ok()) Die(be_->Synchronize().ToString());
    std::vector<float> ms;
    for (int r = 0; r < reps_; ++r) {
      cudaEventRecord(start_, be_->stream());
      op();
      cudaEventRecord(stop_, be_->stream());
      cudaEventSynchronize(stop_);
      float t = 0;
      cudaEventElapsedTime(&t, start_, stop_);
      ms.push_back(t);
    }
    if (!be_->Synchronize().ok()) Die(be_->Synchronize().ToString());
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

 private:
  CudaBackend* be_;
  int reps_;
  std::mt19937 rng_{1};
  std::vector<void*> bufs_;
  cudaEvent_t start_, stop_;
};

void Row(const char* what, double fused, double unfused, int count, double* saved) {
  std::printf("  %-14s fused %8.3f ms  unfused %8.3f ms  saves %7.3f ms/op, %7.3f ms/step\n", what,
              fused, unfused, unfused - fused, (unfused - fused) * count);
  *saved += (unfused - fused) * count;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Times each fused op against its unfused form"};
  std::string names = "seed,gpt2,h2048";
  int reps = 20;
  bool deterministic = false;
  app.add_option("--workloads", names, "comma-separated: seed, gpt2, h2048");
  app.add_option("--reps", reps, "timed calls each (median reported)")->check(CLI::PositiveNumber);
  app.add_flag("--deterministic", deterministic,
               "training.deterministic's kernels (the heuristic's first GEMM algorithm)");
  CLI11_PARSE(app, argc, argv);
  const Workload all[] = {{"seed", 32 * 256, 768, 3072, 4, 96, 128},
                          {"gpt2", 16 * 1024, 768, 3072, 12, 50257, 50304},
                          {"h2048", 8 * 1024, 2048, 8192, 8, 96, 128}};
  auto created = CudaBackend::Create(0);
  if (!created.ok()) Die(std::string(created.status().message()));
  CudaBackend* be = created->get();
  be->SetDeterministic(deterministic);
  std::printf("fusion_bench: median of %d reps%s\n", reps,
              deterministic ? ", deterministic (heuristic's first algorithm)" : "");
  for (const Workload& w : all) {
    if (("," + names + ",").find("," + w.name + ",") == std::string::npos) continue;
    const size_t N = w.N, C = w.C, F = w.F;
    std::printf("%s: N=%d C=%d F=%d, %d layers\n", w.name.c_str(), w.N, w.C, w.F, w.layers);
    Bench b(be, reps);
    double saved = 0;
    {
      void *pre = b.Buf(N * F), *gelu = b.Buf(N * F), *w2 = b.Buf(C * F), *dy = b.Buf(N * C),
           *dpre = b.Buf(N * F), *db1 = b.Buf(F), *dw2 = b.Buf(C * F), *db2 = b.Buf(C);
      auto op = [&] {
        be->MatmulBackwardGelu(dpre, db1, pre, dw2, db2, dy, gelu, w2, w.N, w.F, w.C);
      };
      be->set_fused_epilogues(true);
      const double fused = b.Time(op);
      be->set_fused_epilogues(false);
      be->set_dgelu_epilogue(true);
      const double dgelu = b.Time(op);
      be->set_dgelu_epilogue(false);
      const double unfused = b.Time(op);
      Row("fc2+gelu bwd", fused, unfused, w.layers, &saved);
      double ignored = 0;
      Row("fc2+dgelu bwd", dgelu, unfused, w.layers, &ignored);
    }
    const struct {
      const char* name;
      int oc;
    } linears[] = {{"qkv bwd", 3 * w.C}, {"proj bwd", w.C}};
    for (const auto& l : linears) {
      const size_t OC = l.oc;
      void *x = b.Buf(N * C), *wt = b.Buf(OC * C), *dy = b.Buf(N * OC), *dx = b.Buf(N * C),
           *dw = b.Buf(OC * C), *db = b.Buf(OC);
      auto op = [&] { be->MatmulBackward(dx, dw, db, dy, nullptr, x, wt, w.N, w.C, l.oc); };
      be->set_fused_epilogues(true);
      const double fused = b.Time(op);
      be->set_fused_epilogues(false);
      const double unfused = b.Time(op);
      Row(l.name, fused, unfused, w.layers, &saved);
    }
    {
      // The weight gradient's GEMM on a second stream beside the data gradient's
      // (set_concurrent_weight_gradient) against one stream, each Linear's backward as training
      // runs it (not counted in the total): "fused" is two streams.
      be->set_fused_epilogues(false);
      be->set_dgelu_epilogue(true);
      struct Lin {
        const char* name;
        int c, oc, count;
        bool gelu;
      };
      const Lin lins[] = {{"qkv 2 streams", w.C, 3 * w.C, w.layers, false},
                          {"proj 2 streams", w.C, w.C, w.layers, false},
                          {"fc1 2 streams", w.C, w.F, w.layers, false},
                          {"fc2 2 streams", w.F, w.C, w.layers, true},
                          {"head 2 streams", w.C, w.Vp, 1, false}};
      double ignored = 0, total = 0;
      for (const Lin& l : lins) {
        const size_t c = l.c, oc = l.oc;
        void *x = b.Buf(N * c), *wt = b.Buf(oc * c), *dy = b.Buf(N * oc), *dx = b.Buf(N * c),
             *dw = b.Buf(oc * c), *db = l.oc == w.Vp ? nullptr : b.Buf(oc),
             *pre = l.gelu ? b.Buf(N * c) : nullptr, *dpb = l.gelu ? b.Buf(c) : nullptr;
        auto op = [&] {
          if (l.gelu) {
            be->MatmulBackwardGelu(dx, dpb, pre, dw, db, dy, x, wt, w.N, l.c, l.oc);
          } else {
            be->MatmulBackward(dx, dw, db, dy, nullptr, x, wt, w.N, l.c, l.oc);
          }
        };
        be->set_concurrent_weight_gradient(true);
        const double two = b.Time(op);
        be->set_concurrent_weight_gradient(false);
        const double one = b.Time(op);
        be->set_concurrent_weight_gradient(true);
        Row(l.name, two, one, l.count, &ignored);
        total += (one - two) * l.count;
      }
      std::printf("  2 streams save %.3f ms/step over these backwards\n", total);
    }
    {
      void *a = b.Buf(N * C), *x = b.Buf(N * C), *res = b.Buf(N * C), *out = b.Buf(N * C),
           *lw = b.Buf(C), *lb = b.Buf(C);
      float *mean = b.F32(N), *rstd = b.F32(N);
      const double fused = b.Time(
          [&] { be->ResidualLayerNormForward(res, out, mean, rstd, a, x, lw, lb, w.N, w.C); });
      const double unfused = b.Time([&] {
        be->ResidualForward(res, a, x, N * C);
        be->LayerNormForward(out, mean, rstd, res, lw, lb, w.N, w.C);
      });
      Row("residual+ln", fused, unfused, 2 * w.layers, &saved);
    }
    {
      // LayerNormBackward on its own (the one-pass kernel where C allows): per call and step.
      void *dy = b.Buf(N * C), *x = b.Buf(N * C), *dx = b.Buf(N * C), *lw = b.Buf(C),
           *dw = b.Buf(C), *db = b.Buf(C);
      float *mean = b.F32(N), *rstd = b.F32(N);
      // Against the kernels before the one-pass block kernel (SetLayerNormReferenceKernels):
      // for C = 768 the same kernel (warp per row), else a column pass and a row pass.
      auto op = [&] { be->LayerNormBackward(dx, dw, db, dy, x, lw, mean, rstd, w.N, w.C); };
      const double ms = b.Time(op);
      boulder::kernels::cuda::SetLayerNormReferenceKernels(true);
      const double ref = b.Time(op);
      boulder::kernels::cuda::SetLayerNormReferenceKernels(false);
      const int calls = 2 * w.layers + 1;
      auto gbs = [&](double t) { return N * C * 8.0 / (t * 1e-3) / 1e9; };
      std::printf(
          "  %-14s %8.3f ms/op (%4.0f GB/s), reference %6.3f (%4.0f GB/s)  x%d  %7.3f vs %7.3f "
          "ms/step\n",
          "ln bwd", ms, gbs(ms), ref, gbs(ref), calls, ms * calls, ref * calls);
    }
    {
      // The fused softmax + cross-entropy over the logits (in place), once per step.
      const size_t Vp = w.Vp;
      void* logits = b.Buf(N * Vp);
      float* losses = b.F32(N);
      auto t = be->Alloc(N * sizeof(int32_t));
      if (!t.ok()) Die(std::string(t.status().message()));
      std::vector<int32_t> targets(N);
      for (size_t i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((i * 7919) % w.V);
      be->CopyFromHost(*t, targets.data(), N * sizeof(int32_t));
      const double ms = b.Time([&] {
        be->SoftmaxCrossEntropy(losses, logits, static_cast<const int32_t*>(*t), w.N, w.V, w.Vp,
                                1.f / w.N);
      });
      std::printf("  %-14s %8.3f ms/op (%4.0f GB/s)  x1  %7.3f ms/step\n", "cross-entropy", ms,
                  N * Vp * 4.0 / (ms * 1e-3) / 1e9, ms);
      be->Free(*t);
    }
    if (be->Fp8Supported().ok()) {
      // FP8 training's ln_1 / ln_2: LayerNorm writing its Linear's FP8 input (row-major and
      // transposed) against ResidualLayerNormForward + CastFp8.
      void *a = b.Buf(N * C), *x = b.Buf(N * C), *res = b.Buf(N * C), *out = b.Buf(N * C),
           *lw = b.Buf(C), *lb = b.Buf(C);
      float *mean = b.F32(N), *rstd = b.F32(N), *scale = b.F32(1), *amax = b.F32(1);
      const float one = 1.0f;
      be->CopyFromHost(scale, &one, sizeof(one));
      auto* q = static_cast<uint8_t*>(static_cast<void*>(b.F32(N * C / 4)));
      auto* q_t = static_cast<uint8_t*>(static_cast<void*>(b.F32(N * C / 4)));
      auto* counts = static_cast<uint64_t*>(static_cast<void*>(b.F32(2 * 4)));
      auto op = [&] {
        be->ResidualLayerNormFp8Forward(res, out, mean, rstd, a, x, lw, lb, w.N, w.C, q, q_t,
                                        boulder::kernels::Fp8Format::kE4M3, scale, amax, counts);
      };
      be->set_fused_layernorm_fp8(true);
      const double fused = b.Time(op);
      be->set_fused_layernorm_fp8(false);
      const double unfused = b.Time(op);
      be->set_fused_layernorm_fp8(true);
      Row("ln+fp8 cast", fused, unfused, 2 * w.layers, &saved);
      // The backward's recomputation of qkv's and fc1's FP8 input transpose.
      auto recompute = [&] {
        be->LayerNormFp8FromStats(nullptr, q_t, out, res, mean, rstd, lw, lb, w.N, w.C,
                                  boulder::kernels::Fp8Format::kE4M3, scale, amax, counts);
      };
      const double re_fused = b.Time(recompute);
      be->set_fused_layernorm_fp8(false);
      const double re_unfused = b.Time(recompute);
      be->set_fused_layernorm_fp8(true);
      Row("ln fp8 recomp", re_fused, re_unfused, 2 * w.layers, &saved);
      std::printf("  recompute adds %.3f ms/step (%4.0f GB/s)\n", re_fused * 2 * w.layers,
                  N * C * 3.0 / (re_fused * 1e-3) / 1e9);
      // The forward as training runs it (FP8 rows only: the row kernel), and each forward op
      // against the kernels it ran before (SetLayerNormReferenceKernels).
      auto op_q = [&] {
        be->ResidualLayerNormFp8Forward(res, out, mean, rstd, a, x, lw, lb, w.N, w.C, q, nullptr,
                                        boulder::kernels::Fp8Format::kE4M3, scale, amax, counts);
      };
      auto op_bf16 = [&] {
        be->ResidualLayerNormForward(res, out, mean, rstd, a, x, lw, lb, w.N, w.C);
      };
      const double now[4] = {b.Time(op), b.Time(op_q), b.Time(recompute), b.Time(op_bf16)};
      boulder::kernels::cuda::SetLayerNormReferenceKernels(true);
      const double tile[4] = {b.Time(op), b.Time(op_q), b.Time(recompute), b.Time(op_bf16)};
      boulder::kernels::cuda::SetLayerNormReferenceKernels(false);
      const char* names[4] = {"ln+fp8 q,qT", "ln+fp8 q", "ln fp8 recomp", "residual+ln"};
      const double bytes[4] = {8.0, 7.0, 3.0, 8.0};  // per element moved
      for (int i = 0; i < 4; ++i) {
        std::printf(
            "  %-14s %7.3f ms/op (%4.0f GB/s), reference %7.3f (%4.0f GB/s)"
            "  x%d  %7.3f vs %7.3f ms/step\n",
            names[i], now[i], N * C * bytes[i] / (now[i] * 1e-3) / 1e9, tile[i],
            N * C * bytes[i] / (tile[i] * 1e-3) / 1e9, 2 * w.layers, now[i] * 2 * w.layers,
            tile[i] * 2 * w.layers);
      }
      // The forward with a transpose at each block size (kernels::cuda::SetLayerNormFp8BlockWarps;
      // "auto" is the launcher's choice).
      std::printf("  ln+fp8 q,qT per block size:");
      for (const int warps : {0, 8, 16, 32}) {
        boulder::kernels::cuda::SetLayerNormFp8BlockWarps(warps);
        const double ms = b.Time(op);
        if (warps == 0) {
          std::printf("  auto %.4f ms", ms);
        } else {
          std::printf("  %d warps %.4f ms", warps, ms);
        }
      }
      boulder::kernels::cuda::SetLayerNormFp8BlockWarps(0);
      std::printf("\n");
    }
    std::printf("  total saved per step: %.3f ms; fused GEMMs run unfused (no algorithm): %d\n",
                saved, be->unfused_fallbacks());
  }
  return 0;
}
