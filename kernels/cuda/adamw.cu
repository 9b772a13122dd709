// AdamW over the one flat parameter buffer: FP32 master weights and moments, BF16 working
// weights and gradients. The master weights are the working weights' bits and a 16-bit low half
// each (the default; kernels/split_master.h: the same FP32 values, 26 bytes moved per parameter
// instead of 28) or an FP32 copy (BOULDER_MASTER_WEIGHTS=fp32). The clipping factor is computed
// on the device from the gradient's sum of squares, so the step needs no host sync (and can live
// in a CUDA graph). The learning rate and the bias corrections come either as arguments or, for
// a recorded step, from a device array written before each replay (AdamWStepValues); both forms
// run the same kernel, so their results are bit-identical. The device-array form can also skip
// the whole update when the gradient norm is not finite (an FP8 step replayed from a graph).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/split_master.h"

namespace boulder::kernels::cuda {
namespace {

// One element's update (every form of the kernel runs exactly this).
__device__ __forceinline__ float AdamWOne(float g, float& m, float& v, float p, float lr,
                                          float beta1, float beta2, float eps, float decay,
                                          float bc1, float bc2) {
  m = beta1 * m + (1.f - beta1) * g;
  v = beta2 * v + (1.f - beta2) * g * g;
  return p - lr * ((m / bc1) / (sqrtf(v / bc2) + eps) + decay * p);
}

// Thread i updates elements [8i, 8i + 8) with 16- and 32-byte accesses when the buffers allow
// (vec8: n of them are whole groups of 8 and every pointer is 16-byte aligned), element i
// otherwise.
// decay_bits: one bit per element from bit decay_offset (kVec8: decay_offset % 8 == 0, so a
// thread's 8 elements are one byte's bits).
template <bool kVec8>
__global__ void AdamWKernel(bf16* params, AdamWMaster master, const bf16* grads, float* m, float* v,
                            const uint8_t* decay_bits, size_t decay_offset, size_t n, float lr,
                            float beta1, float beta2, float eps, float wd, float bc1, float bc2,
                            float grad_scale, const float* norm_sq, float max_norm,
                            const float* step) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= (kVec8 ? n / 8 : n)) return;
  if (step != nullptr) {
    // step[3] != 0: a step whose gradients are not finite is skipped on the device (FP8).
    if (step[3] != 0.f && norm_sq != nullptr && !isfinite(*norm_sq)) return;
    lr = step[0];
    bc1 = step[1];
    bc2 = step[2];
  }
  float scale = grad_scale;
  if (max_norm > 0.f && norm_sq != nullptr) {
    float norm = sqrtf(*norm_sq);
    if (norm > max_norm) scale *= max_norm / norm;
  }
  if constexpr (kVec8) {
    const size_t e = 8 * i;
    const Bf16x8 gv = Load8(grads + e);
    float mv[8], vv[8], pv[8];
    *reinterpret_cast<float4*>(mv) = *reinterpret_cast<const float4*>(m + e);
    *reinterpret_cast<float4*>(mv + 4) = *reinterpret_cast<const float4*>(m + e + 4);
    *reinterpret_cast<float4*>(vv) = *reinterpret_cast<const float4*>(v + e);
    *reinterpret_cast<float4*>(vv + 4) = *reinterpret_cast<const float4*>(v + e + 4);
    uint16_t lo[8];
    if (master.f32) {
      *reinterpret_cast<float4*>(pv) = *reinterpret_cast<const float4*>(master.f32 + e);
      *reinterpret_cast<float4*>(pv + 4) = *reinterpret_cast<const float4*>(master.f32 + e + 4);
    } else {
      const Bf16x8 p8 = Load8(params + e);
      if (master.low) {
        *reinterpret_cast<uint4*>(lo) = *reinterpret_cast<const uint4*>(master.low + e);
#pragma unroll
        for (int k = 0; k < 8; ++k) pv[k] = JoinMaster(__bfloat16_as_ushort(p8.v[k]), lo[k]);
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) pv[k] = __bfloat162float(p8.v[k]);
      }
    }
    const uint32_t mask = decay_bits != nullptr ? decay_bits[decay_offset / 8 + i] : 0xffu;
    Bf16x8 out;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      pv[k] = AdamWOne(__bfloat162float(gv.v[k]) * scale, mv[k], vv[k], pv[k], lr, beta1, beta2,
                       eps, (mask >> k) & 1u ? wd : 0.f, bc1, bc2);
      if (master.low) {
        uint16_t hi;
        SplitMaster(pv[k], &hi, &lo[k]);
        out.v[k] = __ushort_as_bfloat16(hi);
      } else {
        out.v[k] = __float2bfloat16(pv[k]);
      }
    }
    *reinterpret_cast<float4*>(m + e) = *reinterpret_cast<const float4*>(mv);
    *reinterpret_cast<float4*>(m + e + 4) = *reinterpret_cast<const float4*>(mv + 4);
    *reinterpret_cast<float4*>(v + e) = *reinterpret_cast<const float4*>(vv);
    *reinterpret_cast<float4*>(v + e + 4) = *reinterpret_cast<const float4*>(vv + 4);
    if (master.f32) {
      *reinterpret_cast<float4*>(master.f32 + e) = *reinterpret_cast<const float4*>(pv);
      *reinterpret_cast<float4*>(master.f32 + e + 4) = *reinterpret_cast<const float4*>(pv + 4);
    } else if (master.low) {
      *reinterpret_cast<uint4*>(master.low + e) = *reinterpret_cast<const uint4*>(lo);
    }
    Store8(params + e, out);
  } else {
    float mi = m[i], vi = v[i];
    const float p0 = master.f32   ? master.f32[i]
                     : master.low ? JoinMaster(__bfloat16_as_ushort(params[i]), master.low[i])
                                  : __bfloat162float(params[i]);
    const size_t bit = decay_offset + i;
    const float decay =
        (decay_bits == nullptr || (decay_bits[bit / 8] >> (bit % 8)) & 1u) ? wd : 0.f;
    const float p = AdamWOne(__bfloat162float(grads[i]) * scale, mi, vi, p0, lr, beta1, beta2, eps,
                             decay, bc1, bc2);
    m[i] = mi;
    v[i] = vi;
    if (master.low) {
      uint16_t hi, lo;
      SplitMaster(p, &hi, &lo);
      master.low[i] = lo;
      params[i] = __ushort_as_bfloat16(hi);
      return;
    }
    if (master.f32) master.f32[i] = p;
    params[i] = __float2bfloat16(p);
  }
}

__global__ void SetStepKernel(float* step, float lr, float bc1, float bc2, float skip) {
  step[0] = lr;
  step[1] = bc1;
  step[2] = bc2;
  step[3] = skip;
}

// The bias corrections 1 - beta^t, computed on the host in FP32 for both forms.
void BiasCorrections(float beta1, float beta2, int t, float* bc1, float* bc2) {
  *bc1 = 1.f - powf(beta1, float(t));
  *bc2 = 1.f - powf(beta2, float(t));
}

}  // namespace

cudaError_t AdamWStepValues(float* step, float lr, int t, float beta1, float beta2,
                            bool skip_non_finite, cudaStream_t s) {
  float bc1, bc2;
  BiasCorrections(beta1, beta2, t, &bc1, &bc2);
  SetStepKernel<<<1, 1, 0, s>>>(step, lr, bc1, bc2, skip_non_finite ? 1.f : 0.f);
  return cudaGetLastError();
}

cudaError_t AdamW(bf16* params, AdamWMaster master, const bf16* grads, float* m, float* v,
                  const uint8_t* decay_bits, size_t decay_offset, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int t, float grad_scale,
                  const float* norm_sq, float max_norm, const float* step, cudaStream_t s) {
  float bc1 = 0.f, bc2 = 0.f;
  if (step == nullptr) BiasCorrections(beta1, beta2, t, &bc1, &bc2);
  // Without weight decay the mask changes nothing (every element's decay term is 0 * p either
  // way): not reading it saves its bit per parameter.
  if (weight_decay == 0.f) decay_bits = nullptr;
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const size_t groups = n / 8;
  const bool vec8 = groups > 0 && aligned(params) && aligned(master.f32) && aligned(master.low) &&
                    aligned(grads) && aligned(m) && aligned(v) &&
                    (decay_bits == nullptr || decay_offset % 8 == 0);
  if (vec8) {
    AdamWKernel<true><<<CeilDiv(groups, 256), 256, 0, s>>>(
        params, master, grads, m, v, decay_bits, decay_offset, n, lr, beta1, beta2, eps,
        weight_decay, bc1, bc2, grad_scale, norm_sq, max_norm, step);
    const size_t done = 8 * groups;
    if (done == n) return cudaGetLastError();
    // The tail (fewer than 8 elements), element by element.
    AdamWMaster tail;
    if (master.f32) tail.f32 = master.f32 + done;
    if (master.low) tail.low = master.low + done;
    AdamWKernel<false><<<1, 8, 0, s>>>(params + done, tail,
                                       grads + done, m + done, v + done, decay_bits,
                                       decay_offset + done, n - done, lr, beta1, beta2, eps,
                                       weight_decay, bc1, bc2, grad_scale, norm_sq, max_norm, step);
    return cudaGetLastError();
  }
  AdamWKernel<false><<<CeilDiv(n, 512), 512, 0, s>>>(
      params, master, grads, m, v, decay_bits, decay_offset, n, lr, beta1, beta2, eps, weight_decay,
      bc1, bc2, grad_scale, norm_sq, max_norm, step);
  return cudaGetLastError();
}

}  // namespace boulder::kernels::cuda
