// fp8_cast_bench: the FP8 casts of a training step, per call and per step, on the benchmark
// workloads' shapes: CastFp8 (row-major + transposed, at widths C and F),
// CastFp8Grad (the backward's fused cast of each Linear's output gradient: dGELU for fc1, the
// bias gradient, row-major + transposed) and GeluCastFp8 (the backward's recomputed transpose of
// fc2's input from fc1's pre-activation: transposed only; also row-major + transposed; and
// row-major only, the forward's, as are the attention projection's input casts, against the
// instance of the tile kernel that ran before the one without the transposed tile), each
// GELU cast three ways: the tile kernel GeluCastFp8 runs, the per-element kernel it keeps for
// unaligned shapes (GeluCastFp8AnyShape: the kernel GeluCastFp8 was before the tile kernel), and
// the Backend default (GeluForward into a BF16 scratch, then CastFp8). Times through
// CudaBackend (CUDA events, median of --reps after a warm-up). Last, the MLP backward's fused
// GeluCastFp8AndGrad against the two casts it replaces (GB/s: the fused op's bytes, 7 per
// element, and the two casts', 9), on the grid planned for the fused kernel and on CastFp8Grad's
// own (kernels::cuda::SetFp8GeluGradFusedGrid); and the backward's FP8 weight transposes
// (TransposeFp8, the four of a layer) on its 128 x 128 and 64 x 64 tile kernels. GB/s counts each input read once
// and each output written once (for the default: the fused op's bytes, not its own).
//
//   fp8_cast_bench [--workloads seed,gpt2,h2048] [--reps 20]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/fp8_gelu_ops.h"
#include "kernels/cuda/fp8_ops.h"

namespace {

using boulder::kernels::DType;
using boulder::kernels::Fp8Format;
using boulder::kernels::cuda::CudaBackend;

void Die(const std::string& what) {
  std::fprintf(stderr, "fp8_cast_bench: %s\n", what.c_str());
  std::exit(1);
}

struct Workload {
  std::string name;
  int N, C, F, layers;
};

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
  void* Raw(size_t bytes) {
    auto p = be_->Alloc(bytes);
    if (!p.ok()) Die(std::string(p.status().message()));
    bufs_.push_back(*p);
    return *p;
  }
  // n BF16 values, normal with standard deviation sd.
  void* Bf16(size_t n, float sd) {
    void* p = Raw(n * 2);
    std::vector<float> v(n);
    std::normal_distribution<float> d(0.f, sd);
    for (float& x : v) x = d(rng_);
    be_->CopyFromHostF32(p, DType::kBF16, v.data(), n);
    return p;
  }
  float* F32(float value) {
    float* p = static_cast<float*>(Raw(sizeof(float)));
    be_->CopyFromHostF32(p, DType::kF32, &value, 1);
    return p;
  }
  double Time(const std::function<void()>& op) {
    op();
    if (absl::Status s = be_->Synchronize(); !s.ok()) Die(s.ToString());
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
    if (absl::Status s = be_->Synchronize(); !s.ok()) Die(s.ToString());
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

 private:
  CudaBackend* be_;
  int reps_;
  std::mt19937 rng_{7};
  std::vector<void*> bufs_;
  cudaEvent_t start_, stop_;
};

double Row(const char* what, int rows, int cols, double ms, double bytes, int per_step) {
  std::printf("  %-22s %6d x %-5d %8.1f us %7.0f GB/s  x%-3d %7.3f ms/step\n", what, rows, cols,
              ms * 1e3, bytes / (ms * 1e-3) / 1e9, per_step, ms * per_step);
  return ms * per_step;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Times the FP8 casts of a training step"};
  std::string names = "seed,gpt2,h2048";
  int reps = 20;
  app.add_option("--workloads", names, "comma-separated: seed, gpt2, h2048");
  app.add_option("--reps", reps, "timed calls each (median reported)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  const Workload all[] = {{"seed", 32 * 256, 768, 3072, 4},
                          {"gpt2", 16 * 1024, 768, 3072, 12},
                          {"h2048", 8 * 1024, 2048, 8192, 8}};
  auto created = CudaBackend::Create(0);
  if (!created.ok()) Die(std::string(created.status().message()));
  CudaBackend* be = created->get();
  if (absl::Status s = be->Fp8Supported(); !s.ok()) Die(s.ToString());
  std::printf("fp8_cast_bench: median of %d reps\n", reps);
  for (const Workload& w : all) {
    if (("," + names + ",").find("," + w.name + ",") == std::string::npos) continue;
    std::printf("%s: N=%d C=%d F=%d, %d layers\n", w.name.c_str(), w.N, w.C, w.F, w.layers);
    Bench b(be, reps);
    const size_t N = w.N, widest = std::max(3 * w.C, w.F);
    void* x = b.Bf16(N * widest, 1.0f);
    void* pre = b.Bf16(N * w.F, 1.0f);
    void* dout = b.Bf16(N * widest, 1e-3f);
    void* dbias = b.Bf16(widest, 0.f);
    uint8_t* out = static_cast<uint8_t*>(b.Raw(N * widest));
    uint8_t* out_t = static_cast<uint8_t*>(b.Raw(N * widest));
    uint64_t* counts = static_cast<uint64_t*>(b.Raw(3 * sizeof(uint64_t)));
    float* amax = b.F32(0.f);
    float* act_scale = b.F32(100.f);     // E4M3: |x| up to 4.48 stays finite
    float* grad_scale = b.F32(16384.f);  // E5M2
    double fwd = 0, bwd = 0;
    for (int cols : {w.C, w.F}) {
      const double ms = b.Time([&] {
        be->CastFp8(out, out_t, x, w.N, cols, Fp8Format::kE4M3, act_scale, amax, counts);
      });
      // Not a training step's casts any more (the LayerNorms cast in their own kernel,
      // fusion_bench; the other forward casts are row-major only, below): per step 0.
      Row(cols == w.C ? "cast (out, out_t) C" : "cast (out, out_t) F", w.N, cols, ms,
          N * cols * 4.0, 0);
    }
    const struct {
      const char* name;
      int cols;
      bool gelu;
    } grads[] = {{"grad qkv", 3 * w.C, false},
                 {"grad proj / fc2", w.C, false},
                 {"grad fc1 (dgelu)", w.F, true}};
    for (const auto& g : grads) {
      const double ms = b.Time([&] {
        be->CastFp8Grad(out, out_t, dout, g.gelu ? pre : nullptr, dbias, w.N, g.cols,
                        Fp8Format::kE5M2, grad_scale, amax, counts);
      });
      bwd += Row(g.name, w.N, g.cols, ms, N * g.cols * (g.gelu ? 6.0 : 4.0),
                 g.cols == w.C ? 2 * w.layers : w.layers);
    }
    // GeluCastFp8 at fc2's input [N, F]: per step once per layer with out_t only (backward).
    void* scratch = b.Raw(N * w.F * 2);
    double gelu = 0;
    for (bool both : {false, true}) {
      uint8_t* o = both ? out : nullptr;
      const double bytes = N * w.F * (both ? 4.0 : 3.0);
      const int per_step = both ? 0 : w.layers;
      gelu += Row(both ? "gelu cast (out, out_t)" : "gelu cast (out_t)", w.N, w.F, b.Time([&] {
        be->GeluCastFp8(o, out_t, scratch, pre, w.N, w.F, Fp8Format::kE4M3, act_scale, amax,
                        counts);
      }),
                  bytes, per_step);
      Row("  any-shape kernel", w.N, w.F, b.Time([&] {
        boulder::kernels::cuda::GeluCastFp8AnyShape(
            o, out_t, static_cast<const __nv_bfloat16*>(pre), w.N, w.F, /*e4m3=*/true, act_scale,
            amax, reinterpret_cast<unsigned long long*>(counts), be->stream());
      }),
          bytes, per_step);
      Row("  default (gelu+cast)", w.N, w.F, b.Time([&] {
        be->Backend::GeluCastFp8(o, out_t, scratch, pre, w.N, w.F, Fp8Format::kE4M3, act_scale,
                                 amax, counts);
      }),
          bytes, per_step);
    }
    // The forward's row-major-only casts (fc2's input from fc1's pre-activation, the attention
    // projection's input): the kRowsOnly tile-kernel instance, then the instance that forms the
    // transposed tile anyway (SetFp8CastRowsOnlyKernels(false), what ran before it).
    for (const bool rows_only : {true, false}) {
      boulder::kernels::cuda::SetFp8CastRowsOnlyKernels(rows_only);
      const double g = b.Time([&] {
        be->GeluCastFp8(out, nullptr, scratch, pre, w.N, w.F, Fp8Format::kE4M3, act_scale, amax,
                        counts);
      });
      const double q = b.Time([&] {
        be->CastFp8(out, nullptr, x, w.N, w.C, Fp8Format::kE4M3, act_scale, amax, counts);
      });
      const double step_g =
          Row(rows_only ? "gelu cast (out)" : "  with the tile", w.N, w.F, g, N * w.F * 3.0,
              w.layers);
      const double step_q =
          Row(rows_only ? "cast fwd q (attn out)" : "  with the tile", w.N, w.C, q, N * w.C * 3.0,
              w.layers);
      if (rows_only) {
        gelu += step_g;
        fwd += step_q;
      }
    }
    boulder::kernels::cuda::SetFp8CastRowsOnlyKernels(true);
    // The MLP backward's two casts over fc1's pre-activation (fc2's recomputed input transpose,
    // fc1's gradient cast with dGELU and the bias gradient): one kernel (GeluCastFp8AndGrad)
    // against the two (CudaBackend::set_fused_gelu_grad(false)); per step once per layer.
    // Each on the grid planned for one wave of the fused kernel (the default) and on the grid
    // planned for CastFp8Grad's own kernel (SetFp8GeluGradFusedGrid(false), what ran before).
    uint8_t* in_t = static_cast<uint8_t*>(b.Raw(N * w.F));
    for (const bool fused_grid : {true, false}) {
      boulder::kernels::cuda::SetFp8GeluGradFusedGrid(fused_grid);
      for (const bool fused : {true, false}) {
        be->set_fused_gelu_grad(fused);
        const double ms = b.Time([&] {
          be->GeluCastFp8AndGrad(in_t, Fp8Format::kE4M3, act_scale, amax, counts, out, out_t,
                                 dout, pre, dbias, w.N, w.F, Fp8Format::kE5M2, grad_scale, amax,
                                 counts, scratch);
        });
        const char* name = fused_grid ? (fused ? "gelu recomp + grad fc1" : "  two casts")
                                      : (fused ? "  (cast grad's grid)" : "  two (cast grad's)");
        const double step =
            Row(name, w.N, w.F, ms, N * w.F * (fused ? 7.0 : 9.0), w.layers);
        if (fused && fused_grid) bwd += step;
      }
    }
    boulder::kernels::cuda::SetFp8GeluGradFusedGrid(true);
    be->set_fused_gelu_grad(true);
    // The backward's weight transposes where the layout keeps none (TransposeFp8 of qkv's,
    // the projection's, fc1's and fc2's FP8 weight, once per layer each): the 128 x 128 tile
    // kernel, then the 64 x 64 one it replaced (SetFp8WideTranspose(false)). GB/s: one byte
    // read and one written per weight.
    {
      const int shapes[4][2] = {{3 * w.C, w.C}, {w.C, w.C}, {w.F, w.C}, {w.C, w.F}};
      uint8_t* wq = static_cast<uint8_t*>(b.Raw(size_t(w.F) * w.C));
      uint8_t* wt = static_cast<uint8_t*>(b.Raw(size_t(w.F) * w.C));
      for (const bool wide : {true, false}) {
        boulder::kernels::cuda::SetFp8WideTranspose(wide);
        double ms = 0, bytes = 0;
        for (const auto& shape : shapes) {
          ms += b.Time([&] { be->TransposeFp8(wt, wq, shape[0], shape[1]); });
          bytes += 2.0 * shape[0] * shape[1];
        }
        Row(wide ? "weight transposes" : "  64 x 64 tiles", 4, w.C, ms, bytes, w.layers);
      }
      boulder::kernels::cuda::SetFp8WideTranspose(true);
    }
    if (absl::Status s = be->Synchronize(); !s.ok()) Die(s.ToString());
    std::printf("  per step: forward casts %.3f ms, backward casts %.3f ms, gelu casts %.3f ms\n",
                fwd, bwd, gelu);
  }
  return 0;
}
