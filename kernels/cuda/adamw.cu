// AdamW over the one flat parameter buffer: FP32 master weights and moments, BF16 working
// weights and gradients. The clipping factor is computed on the device from the gradient's
// sum of squares, so the step needs no host sync (and can live in a CUDA graph). The learning
// rate and the bias corrections come either as arguments or, for a recorded step, from a device
// array written before each replay (AdamWStepValues); both forms run the same kernel, so their
// results are bit-identical. The device-array form can also skip the whole update when the
// gradient norm is not finite (an FP8 step replayed from a graph).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace boulder::kernels::cuda {
namespace {

__global__ void AdamWKernel(bf16* params, float* master, const bf16* grads, float* m, float* v,
                            const uint8_t* decay_mask, size_t n, float lr, float beta1, float beta2,
                            float eps, float wd, float bc1, float bc2, float grad_scale,
                            const float* norm_sq, float max_norm, const float* step) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
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
  float g = __bfloat162float(grads[i]) * scale;
  float mi = beta1 * m[i] + (1.f - beta1) * g;
  float vi = beta2 * v[i] + (1.f - beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  float p = master ? master[i] : __bfloat162float(params[i]);
  float decay = (decay_mask == nullptr || decay_mask[i]) ? wd : 0.f;
  p -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + decay * p);
  if (master) master[i] = p;
  params[i] = __float2bfloat16(p);
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

cudaError_t AdamW(bf16* params, float* master, const bf16* grads, float* m, float* v,
                  const uint8_t* decay_mask, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int t, float grad_scale, const float* norm_sq,
                  float max_norm, const float* step, cudaStream_t s) {
  float bc1 = 0.f, bc2 = 0.f;
  if (step == nullptr) BiasCorrections(beta1, beta2, t, &bc1, &bc2);
  AdamWKernel<<<CeilDiv(n, 512), 512, 0, s>>>(params, master, grads, m, v, decay_mask, n, lr, beta1,
                                              beta2, eps, weight_decay, bc1, bc2, grad_scale,
                                              norm_sq, max_norm, step);
  return cudaGetLastError();
}

}  // namespace boulder::kernels::cuda
