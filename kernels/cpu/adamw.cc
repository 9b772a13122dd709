#include "kernels/cpu/adamw.h"

#include <cmath>
#include <cstdint>

#include "kernels/cpu/parallel.h"

namespace boulder::kernels::cpu {
namespace {

// The per-element constants of one step, in the compute type.
template <typename S>
struct StepConst {
  S scale, beta1, one_minus_beta1, beta2, one_minus_beta2, inv_bc1, inv_bc2, eps, lr, wd;
};

// The loop body specialised on whether there is a master copy and a decay mask, so each
// variant is a branch-free loop the compiler vectorises.
template <typename S, bool kMaster, bool kMask>
void Step(int threads, S* params, S* master, const S* grads, S* m, S* v, DecayBits decay, size_t n,
          const StepConst<S>& k) {
  const int64_t count = static_cast<int64_t>(n);
  const bool parallel = WorthParallel(threads, n * 4);
#pragma omp parallel for simd num_threads(threads) schedule(static) if (parallel)
  for (int64_t i = 0; i < count; ++i) {
    const S g = grads[i] * k.scale;
    const S mi = k.beta1 * m[i] + k.one_minus_beta1 * g;
    const S vi = k.beta2 * v[i] + k.one_minus_beta2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const S w = kMaster ? master[i] : params[i];
    const size_t bit = decay.offset + static_cast<size_t>(i);
    const S wd = kMask ? ((decay.bits[bit / 8] >> (bit % 8)) & 1u ? k.wd : S{0}) : k.wd;
    const S updated = w - k.lr * ((mi * k.inv_bc1) / (std::sqrt(vi * k.inv_bc2) + k.eps) + wd * w);
    if (kMaster) master[i] = updated;
    params[i] = updated;
  }
}

}  // namespace

template <typename S>
void AdamW(int threads, S* params, S* master, const S* grads, S* m, S* v, DecayBits decay, size_t n,
           const AdamWParams& p) {
  double clip = 1.0;
  if (p.max_norm > 0) {
    const double norm = std::sqrt(static_cast<double>(*p.norm_sq));
    if (norm > p.max_norm) clip = p.max_norm / norm;
  }
  StepConst<S> k;
  k.scale = static_cast<S>(static_cast<double>(p.grad_scale) * clip);
  k.beta1 = p.beta1;
  k.one_minus_beta1 = S{1} - static_cast<S>(p.beta1);
  k.beta2 = p.beta2;
  k.one_minus_beta2 = S{1} - static_cast<S>(p.beta2);
  k.inv_bc1 = static_cast<S>(1.0 / (1.0 - std::pow(static_cast<double>(p.beta1), p.t)));
  k.inv_bc2 = static_cast<S>(1.0 / (1.0 - std::pow(static_cast<double>(p.beta2), p.t)));
  k.eps = p.eps;
  k.lr = p.lr;
  k.wd = p.weight_decay;
  if (master != nullptr) {
    if (decay.bits != nullptr) {
      Step<S, true, true>(threads, params, master, grads, m, v, decay, n, k);
    } else {
      Step<S, true, false>(threads, params, master, grads, m, v, decay, n, k);
    }
  } else if (decay.bits != nullptr) {
    Step<S, false, true>(threads, params, master, grads, m, v, decay, n, k);
  } else {
    Step<S, false, false>(threads, params, master, grads, m, v, decay, n, k);
  }
}

template void AdamW<float>(int, float*, float*, const float*, float*, float*, DecayBits, size_t,
                           const AdamWParams&);
template void AdamW<double>(int, double*, double*, const double*, double*, double*, DecayBits,
                            size_t, const AdamWParams&);

}  // namespace boulder::kernels::cpu
