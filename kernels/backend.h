// The compute backend interface: allocation, copies and the fused ops a GPT training step is
// made of. The model (worker/engine/) is written once over this interface; `cpu` (reference,
// OpenBLAS) and, later, `cuda` (fused kernels, cuBLASLt) implement it.
//
// Knows no model, job, protobuf or control plane.
//
// Buffers and dtypes. A backend has two element types:
//   - compute_dtype(): activations, working weights, parameter gradients and activation
//     gradients (cpu: FP32, or FP64 for the double-precision test backend; cuda: BF16).
//   - state_dtype(): master weights and AdamW moments (cpu: same as compute; cuda: FP32).
// Pointers typed `void*` point at compute_dtype() elements unless the comment says otherwise;
// `float*` scalars-on-device (losses, norms) are always FP32. On the cpu backend "device"
// memory is host memory.
//
// Accumulate semantics (as llm.c): parameter gradients use +=, activation gradients use =,
// except where an op says it accumulates (the residual stream's gradient), and except the
// weight gradients of MatmulBackward and MatmulBackwardGelu while SetWeightGradientOverwrite is
// on (=: a step's first micro-batch, so those gradients need no zeroing and their GEMMs need not
// read them).
//
// Layouts (row-major): activations [N, C] with N = B*T; Linear weights [OC, C] (out, in), so a
// forward is out = inp · Wᵀ + b; qkv is [B, T, 3C] with q, k, v each [B, T, NH, HS].
//
// Thread-safety: a Backend is used by one thread. Ops are enqueued in order on the backend's
// stream; Synchronize() waits for them and reports the first asynchronous error.
#ifndef BOULDER_KERNELS_BACKEND_H_
#define BOULDER_KERNELS_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/checksum.h"

namespace boulder::kernels {

enum class DType { kF32, kF64, kBF16 };

size_t DTypeSize(DType t);
const char* DTypeName(DType t);

struct MemoryStats {
  int64_t allocated_bytes = 0;     // live allocations made through Alloc
  int64_t peak_bytes = 0;          // high-water mark of allocated_bytes
  int64_t reserved_bytes = 0;      // held from the system (>= allocated)
  int64_t device_total_bytes = 0;  // the device's memory (cpu: physical RAM)
};

// The two OCP FP8 formats: E4M3 (max 448, no infinities) and E5M2 (max 57344). FP8 buffers
// hold one byte per element in that encoding, on every backend.
enum class Fp8Format { kE4M3, kE5M2 };

const char* Fp8FormatName(Fp8Format f);  // "e4m3", "e5m2"
float Fp8Max(Fp8Format f);               // 448, 57344

// Counters a CastFp8 adds to, per tensor (uint64 device array of kFp8CountersPerTensor).
enum Fp8Counter { kFp8Saturated = 0, kFp8Underflow = 1, kFp8NonFinite = 2 };
inline constexpr int kFp8CountersPerTensor = 3;

// One cast of Backend::CastFp8Batch: CastFp8's arguments but the format.
struct Fp8CastJob {
  uint8_t* out = nullptr;
  uint8_t* out_t = nullptr;
  const void* inp = nullptr;
  int rows = 0, cols = 0;
  const float* scale = nullptr;
  float* amax = nullptr;
  uint64_t* counts = nullptr;
};

// Which parameters an AdamW call decays: element i of the call decays where bit offset + i of
// `bits` is set (bit k is bit k % 8 of byte k / 8). One bit per trainable parameter (a byte
// per parameter was 1 of the 29 bytes the update moves per parameter, and 384 MiB on the
// hidden-2048 model), so a model keeps one packed mask and each call points into it at its
// first element. bits null: every element decays. A device buffer (host memory on cpu).
struct DecayBits {
  const uint8_t* bits = nullptr;
  size_t offset = 0;
};

// One bit per element of a 0/1 byte mask, in DecayBits's order.
std::vector<uint8_t> PackDecayBits(const std::vector<uint8_t>& mask);

// The replica checksum (Backend::Checksum) of `bytes` bytes at host `data`: the wrapping sum,
// over the 32-bit little-endian words w_i (the last one zero-padded), of
// ChecksumTerm(w_i, i) (kernels/checksum.h). A sum of integers, so every summation order, and
// so every backend, gives the same value; the index in each term makes it depend on where each
// word is, and the mix (SplitMix64's finalizer) on every bit of it.
uint64_t ChecksumHost(const void* data, size_t bytes);

// Epilogue of a Linear forward GEMM.
enum class Epilogue {
  kNone,      // out = inp·Wᵀ (+ bias)
  kGelu,      // pre = inp·Wᵀ + bias; out = gelu_tanh(pre); pre_gelu receives pre
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;  // "cpu", "cuda"
  // How this backend runs FP8 training where its environment chooses (which GEMM, which casts
  // are fused into the op before them), one line for the job's log; "" where nothing is
  // configurable (the default).
  virtual std::string Fp8Settings() const { return ""; }
  virtual DType compute_dtype() const = 0;
  virtual DType state_dtype() const = 0;
  // How the master weights are kept where state_dtype() is wider than compute_dtype() (else
  // there are none). kStateDtype: master[i] is the state-dtype value. kBf16LowHalves (BF16
  // compute, FP32 state): master[i] is a uint16_t, the low half of the FP32 master, and the
  // working weight params[i] its rounded high half (kernels/split_master.h): the two hold the
  // FP32 value exactly in 4 bytes, and AdamW moves 2 bytes per parameter less.
  enum class MasterLayout { kStateDtype, kBf16LowHalves };
  virtual MasterLayout master_layout() const { return MasterLayout::kStateDtype; }
  // Bytes per trainable parameter of the master buffer (0 where there is none).
  size_t master_bytes_per_param() const {
    if (state_dtype() == compute_dtype()) return 0;
    return master_layout() == MasterLayout::kBf16LowHalves ? 2 : DTypeSize(state_dtype());
  }

  // ---- memory ----------------------------------------------------------------------------
  // Allocates `bytes` of device memory (uninitialised). RESOURCE_EXHAUSTED names the size.
  virtual absl::StatusOr<void*> Alloc(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
  virtual void Memset0(void* ptr, size_t bytes) = 0;
  // Memset0 of every range (byte offsets from base), in one launch where the backend can (the
  // default: one Memset0 each).
  struct ByteRange {
    size_t offset = 0, bytes = 0;
  };
  virtual void Memset0Ranges(void* base, const std::vector<ByteRange>& ranges);
  // Copies n elements between host FP32 and a device buffer of `dtype`, converting.
  virtual void CopyFromHostF32(void* dst, DType dtype, const float* src, size_t n) = 0;
  virtual void CopyToHostF32(float* dst, const void* src, DType dtype, size_t n) = 0;
  // Raw byte copies host<->device (integer tokens, opaque state).
  virtual void CopyFromHost(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  // Waits for all enqueued work; returns the first asynchronous error, if any.
  virtual absl::Status Synchronize() = 0;
  // ChecksumHost of `bytes` bytes at `data` (backend memory), after the work enqueued so far.
  // Synchronizes. The default copies the bytes to the host; the cuda backend reduces on the
  // device and copies 8 bytes.
  virtual absl::StatusOr<uint64_t> Checksum(const void* data, size_t bytes);
  virtual MemoryStats GetMemoryStats() const = 0;

  // ---- ops -------------------------------------------------------------------------------
  // out[B,T,C] = wte[tokens[b,t]] + wpe[t].  tokens: int32 device buffer [B,T].
  virtual void EncoderForward(void* out, const int32_t* tokens, const void* wte,
                              const void* wpe, int B, int T, int C) = 0;
  // dwte += scatter(dout by token), dwpe += sum over batch. Deterministic (no atomics).
  virtual void EncoderBackward(void* dwte, void* dwpe, const void* dout,
                               const int32_t* tokens, int B, int T, int C) = 0;

  // LayerNorm over the last dim C of inp[N,C]: out = (x-mean)*rstd*weight + bias.
  // mean, rstd: FP32 device buffers [N] saved for the backward.
  virtual void LayerNormForward(void* out, float* mean, float* rstd, const void* inp,
                                const void* weight, const void* bias, int N, int C) = 0;
  // The residual add and the LayerNorm after it: residual[N,C] = a + b (as ResidualForward;
  // residual may alias a or b), then out = LayerNorm(residual) as LayerNormForward. The
  // default runs those two; cuda fuses them into one pass with the same results. (The
  // backward needs no counterpart: LayerNormBackward already adds into the residual stream's
  // gradient.)
  virtual void ResidualLayerNormForward(void* residual, void* out, float* mean, float* rstd,
                                        const void* a, const void* b, const void* weight,
                                        const void* bias, int N, int C);
  // dinp += (accumulates into the residual stream's gradient); dweight, dbias +=.
  virtual void LayerNormBackward(void* dinp, void* dweight, void* dbias, const void* dout,
                                 const void* inp, const void* weight, const float* mean,
                                 const float* rstd, int N, int C) = 0;

  // out[N,OC] = epilogue(inp[N,C] · weight[OC,C]ᵀ + bias[OC]); bias may be null.
  // For kGelu, pre_gelu[N,OC] receives the pre-activation (needed by the backward).
  virtual void MatmulForward(void* out, void* pre_gelu, const void* inp, const void* weight,
                             const void* bias, int N, int C, int OC, Epilogue epilogue) = 0;
  // Given dout[N,OC]: if pre_gelu is non-null, dout is first multiplied by gelu'(pre_gelu)
  // (in place: dout is overwritten with the pre-activation gradient). Then
  // dinp = dout·weight (=, skipped when dinp is null), dweight += doutᵀ·inp,
  // dbias += Σ_rows dout (skipped when dbias is null); dweight is skipped when null (a
  // frozen weight: no gradient computed).
  virtual void MatmulBackward(void* dinp, void* dweight, void* dbias, void* dout,
                              const void* pre_gelu, const void* inp, const void* weight,
                              int N, int C, int OC) = 0;
  // From now on MatmulBackward and MatmulBackwardGelu write dweight with '=' (on) or '+=' (off,
  // the default); their bias gradients accumulate either way. Applies to the ops called after
  // it, recorded ones included (a recording backend records the switch in order).
  virtual void SetWeightGradientOverwrite(bool on) { weight_gradient_overwrite_ = on; }
  bool weight_gradient_overwrite() const { return weight_gradient_overwrite_; }

  // The backward of a Linear whose input is GELU(pre) (the MLP's fc2), with that GELU's
  // backward and the previous Linear's bias gradient fused in (cuda: one GEMM, cuBLASLt's
  // DGELU_BGRAD epilogue). Given dout[N,OC] and pre[N,C]:
  //   dpre = (dout·weight) ⊙ gelu_tanh'(pre)   (=; the gradient w.r.t. pre, [N,C]);
  //   dpre_bias += Σ_rows dpre                 (skipped when null);
  //   dweight += doutᵀ·inp, dbias += Σ_rows dout (each skipped when null), inp = GELU(pre).
  // The same as MatmulBackward(dpre, dweight, dbias, dout, nullptr, inp, weight, N, C, OC),
  // GeluBackward(dpre, pre, N*C), BiasBackward(dpre_bias, dpre, N, C): the default.
  virtual void MatmulBackwardGelu(void* dpre, void* dpre_bias, const void* pre, void* dweight,
                                  void* dbias, void* dout, const void* inp, const void* weight,
                                  int N, int C, int OC);

  // Causal multi-head self-attention. qkv[B,T,3C] -> out[B,T,C]; stats: FP32 [B,NH,T]
  // (log-sum-exp of each query row's scaled scores) saved for the backward.
  virtual void AttentionForward(void* out, float* stats, const void* qkv, int B, int T,
                                int C, int NH) = 0;
  // FP8 training's attention forward with the projection's input cast, where the backend fuses
  // them: AttentionForward(out, stats, qkv, B, T, C, NH), then
  // CastFp8(fp8_out, nullptr, out, B·T, C, format, scale, amax, counts).
  // CONTRACT: out, stats, fp8_out's bytes and the statistics as those two calls give them.
  // Returns false, having done nothing, where the backend does not take the call (the
  // default): the caller then runs the two. fp8_out [B·T, C] may not overlap qkv or out.
  virtual bool AttentionForwardFp8Cast(void* out, float* stats, const void* qkv, int B, int T,
                                       int C, int NH, uint8_t* fp8_out, Fp8Format format,
                                       const float* scale, float* amax, uint64_t* counts) {
    return false;
  }
  // dqkv = (not +=) gradient w.r.t. qkv given dout.
  virtual void AttentionBackward(void* dqkv, const void* dout, const void* qkv,
                                 const void* out, const float* stats, int B, int T, int C,
                                 int NH) = 0;

  // out = a + b, n elements.
  virtual void ResidualForward(void* out, const void* a, const void* b, size_t n) = 0;

  // Fused softmax + cross-entropy over logits[N,Vp] (the first V columns are real, the rest
  // padding). losses[N] (FP32) receives -log p(target). Logits are overwritten in place
  // with dlogits = (softmax - onehot) * dloss (padding columns get 0). targets: int32 [N].
  virtual void SoftmaxCrossEntropy(float* losses, void* logits, const int32_t* targets,
                                   int N, int V, int Vp, float dloss) = 0;

  // Sum of squares of n compute-dtype elements, written to *out (FP32 device scalar).
  virtual void NormSquared(float* out, const void* x, size_t n) = 0;

  // The same sum of squares, written to *out (accumulate: added to *out), where the backend
  // may run it beside the ops enqueued after it until JoinNormSquared() (the CUDA backend: on
  // a stream of its own forked from the op stream here, so a gradient bucket's share of the
  // norm overlaps the rest of the backward). The calls between two joins run in the order
  // made, so a sum over several of them is deterministic. REQUIRES: nothing enqueued before
  // the join writes x or *out.
  virtual void NormSquaredBeside(float* out, const void* x, size_t n, bool accumulate) = 0;
  // Ops enqueued after this run after every NormSquaredBeside() enqueued before it.
  virtual void JoinNormSquared() = 0;

  // One AdamW step over n parameters (decoupled weight decay, applied where `decay` says).
  // The gradient is scaled by grad_scale * clip, where clip = min(1, max_norm / sqrt(*norm_sq))
  // when max_norm > 0 (read on device: no host sync), else 1.
  // master: the master weights as master_layout() says (null when the state dtype equals the
  // compute dtype: then params are updated directly; with kBf16LowHalves params and master
  // together are the FP32 master, read and written as one). m, v: state-dtype moments. t:
  // 1-based step.
  virtual void AdamW(void* params, void* master, const void* grads, void* m, void* v,
                     DecayBits decay, size_t n, float lr, float beta1, float beta2, float eps,
                     float weight_decay, int t, float grad_scale, const float* norm_sq,
                     float max_norm) = 0;

  // AdamW with the per-step values read on the device when it runs, so that one recorded
  // AdamW (a CUDA graph) serves every step. SetAdamWStep enqueues writing lr and step t (with
  // beta1/beta2's bias corrections) into `step`, kAdamWStepFloats FP32 device elements; call it
  // outside a capture (recorded, it would bake the values in). AdamWDeviceStep is AdamW above
  // with lr and t taken from `step` and the same beta1 and beta2: bit-identical results.
  // skip_non_finite: that AdamWDeviceStep leaves params, master and moments untouched when
  // *norm_sq is inf or NaN (the device-side skip of an FP8 step replayed from a graph; the
  // host reads the norm after it to count the skip).
  static constexpr int kAdamWStepFloats = 4;
  virtual void SetAdamWStep(float* step, float lr, int t, float beta1, float beta2,
                            bool skip_non_finite) = 0;
  virtual void AdamWDeviceStep(void* params, void* master, const void* grads, void* m, void* v,
                               DecayBits decay, size_t n, const float* step, float beta1,
                               float beta2, float eps, float weight_decay, float grad_scale,
                               const float* norm_sq, float max_norm) = 0;

  // Argmax over each row of logits[N,V] (first V columns) into int32 out[N]; used by greedy
  // generation.
  virtual void Argmax(int32_t* out, const void* logits, int N, int V, int Vp) = 0;

  // ---- reproducibility -------------------------------------------------------------------
  // When on, every op gives bit-identical results for identical inputs from run to run (no
  // atomics in reductions, no timing-based algorithm choice). When off, a backend may use
  // faster kernels whose last bits vary between runs (cuda: the attention backward adds dQ
  // with FP32 atomics, and GEMM algorithms are autotuned by timing). Call before the first op.
  // The cpu backend is always deterministic and ignores this. Default: off.
  virtual void SetDeterministic(bool on) {}

  // ---- FP8 (precision fp8; Transformer Engine's delayed scaling) -------------------------
  // OK when this backend runs the FP8 ops below natively. FAILED_PRECONDITION with the reason
  // otherwise (the cpu backend runs them as an exact rounding emulation, for tests and
  // debugging; a GPU below compute capability 8.9 cannot run them at all).
  virtual absl::Status Fp8Supported() const = 0;

  // q = fp8(inp · *scale), round to nearest even, saturating finite values beyond the
  // format's max to ±max (NaN stays NaN). inp[rows, cols] compute dtype; out[rows, cols] and
  // out_t[cols, rows] (its transpose) FP8, either may be null. Statistics over inp:
  //   *amax = max(*amax, max |inp|) (NaN when inp holds a NaN);
  //   counts[kFp8Saturated] += elements with finite inp and |inp·scale| > max;
  //   counts[kFp8Underflow] += elements with finite non-zero inp that became ±0;
  //   counts[kFp8NonFinite] += inf and NaN elements.
  // scale, amax: FP32 device scalars; counts: uint64 device array [kFp8CountersPerTensor].
  virtual void CastFp8(uint8_t* out, uint8_t* out_t, const void* inp, int rows, int cols,
                       Fp8Format format, const float* scale, float* amax, uint64_t* counts) = 0;
  // out[cols, rows] = the transpose of in[rows, cols], FP8 bytes as they are (a cast's
  // row-major output turned into the transpose CastFp8 would have written: the same bytes).
  virtual void TransposeFp8(uint8_t* out, const uint8_t* in, int rows, int cols) = 0;
  // CastFp8 of every job, each in `format` (the FP8 weights of a step: many small casts). The
  // bytes and statistics are exactly CastFp8's per job; the jobs' outputs must not overlap
  // each other or any input. Default: CastFp8 per job; the cuda backend batches them into a
  // few launches.
  virtual void CastFp8Batch(const std::vector<Fp8CastJob>& jobs, Fp8Format format);
  // LayerNorm writing its output as FP8 for the Linear after it (Transformer Engine's fused
  // LayerNorm + cast). residual null: y = LayerNorm(a) as LayerNormForward (b unused). residual
  // not null: residual = a + b, y = LayerNorm(residual) as ResidualLayerNormForward (residual
  // may alias a or b). mean, rstd as LayerNormForward. out [N, C] (compute dtype, required) is
  // the unfused path's buffer for y: its contents afterwards are unspecified (the default
  // writes y there, a fused backend need not). fp8_out [N, C] and fp8_out_t [C, N] (either may
  // be null, not both) = CastFp8(y), with CastFp8's statistics into amax and counts.
  // CONTRACT: the FP8 bytes, amax and counters are exactly those of CastFp8 applied to the
  // compute-dtype LayerNorm output (rounded to the compute dtype first, then scaled and
  // converted), and residual, mean and rstd exactly those of the unfused ops: the fused and
  // unfused forms are bit-identical on every backend. The default runs the LayerNorm into out,
  // then CastFp8; the cuda backend fuses them into one pass where the shapes allow.
  virtual void ResidualLayerNormFp8Forward(void* residual, void* out, float* mean, float* rstd,
                                           const void* a, const void* b, const void* weight,
                                           const void* bias, int N, int C, uint8_t* fp8_out,
                                           uint8_t* fp8_out_t, Fp8Format format, const float* scale,
                                           float* amax, uint64_t* counts);
  // The backward's recomputation of that FP8 output from the LayerNorm's kept input and
  // statistics (the FP8 path keeps no LayerNorm output per layer): inp [N, C] holds the rows
  // that were normalised (ResidualLayerNormFp8Forward's a, or its residual), mean and rstd [N]
  // what that LayerNorm saved; y = (x - mean) * rstd * weight + bias in the compute dtype,
  // exactly as the forward computed it from the same statistics; fp8_out [N, C] and fp8_out_t
  // [C, N] (either may be null, not both) = CastFp8(y) with CastFp8's statistics into amax and
  // counts. scratch: [N, C] compute dtype for y where the backend does not fuse; its contents
  // afterwards are unspecified.
  // CONTRACT: the FP8 bytes, amax and counters are exactly those ResidualLayerNormFp8Forward
  // (and so LayerNormForward followed by CastFp8) gave for the inputs that produced inp, mean
  // and rstd, on every backend.
  virtual void LayerNormFp8FromStats(uint8_t* fp8_out, uint8_t* fp8_out_t, void* scratch,
                                     const void* inp, const float* mean, const float* rstd,
                                     const void* weight, const void* bias, int N, int C,
                                     Fp8Format format, const float* scale, float* amax,
                                     uint64_t* counts) = 0;

  // The backward's cast of a Linear's output gradient dout[rows, cols] (compute dtype):
  //   g = dout ⊙ gelu_tanh'(pre) when pre is not null (fc1), else dout;
  //   dbias[c] += Σ_rows g[r, c] when dbias is not null;
  //   out, out_t = CastFp8(g) with CastFp8's statistics.
  // dout's contents afterwards are unspecified (it may hold g, or be unchanged). The default
  // runs GeluBackward, BiasBackward and CastFp8 in turn; the cuda backend fuses them into one
  // pass where the shapes allow.
  virtual void CastFp8Grad(uint8_t* out, uint8_t* out_t, void* dout, const void* pre,
                           void* dbias, int rows, int cols, Fp8Format format, const float* scale,
                           float* amax, uint64_t* counts);

  // out[M,N] (compute dtype) = (a[M,K]·(*a_scale_inv)) · (b[N,K]·(*b_scale_inv))ᵀ + bias[N]
  // with FP8 a and b (both K-contiguous: cuBLASLt's FP8 GEMM is TN only), FP32 accumulation.
  // accumulate: out += instead of = (bias must then be null). fast_accum: let the GPU
  // accumulate in lower precision inside its tensor-core pipeline (forward GEMMs only).
  // a and b may not both be E5M2. REQUIRES (cuda): M, N, K multiples of 16.
  virtual void MatmulFp8(void* out, const uint8_t* a, Fp8Format a_format, const float* a_scale_inv,
                         const uint8_t* b, Fp8Format b_format, const float* b_scale_inv,
                         const void* bias, int M, int N, int K, bool accumulate,
                         bool fast_accum) = 0;

  // fc2's FP8 input recomputed from fc1's pre-activation pre[rows, cols] (compute dtype):
  //   g = gelu_tanh(pre) rounded to the compute dtype, exactly as GeluForward computes it;
  //   out, out_t = CastFp8(g) with CastFp8's statistics (over g; either output may be null).
  // scratch: [rows, cols] compute dtype; the default (GeluForward into scratch, then CastFp8)
  // writes g there, a backend that fuses the two may leave it untouched: its contents
  // afterwards are unspecified. The cuda backend's fused kernel gives the default's bytes.
  virtual void GeluCastFp8(uint8_t* out, uint8_t* out_t, void* scratch, const void* pre, int rows,
                           int cols, Fp8Format format, const float* scale, float* amax,
                           uint64_t* counts);

  // fc1's FP8 forward and fc2's input cast in one op, where the backend fuses them:
  //   MatmulFp8(pre, a, a_format, a_scale_inv, b, b_format, b_scale_inv, bias, M, N, K,
  //             /*accumulate=*/false, /*fast_accum=*/true);
  //   GeluCastFp8(gelu_out, nullptr, <scratch>, pre, M, N, gelu_format, gelu_scale, gelu_amax,
  //               gelu_counts);
  // CONTRACT: pre, gelu_out's bytes and the statistics as those two calls give them. Returns
  // false, having done nothing, where the backend does not take the call (the default): the
  // caller then runs the two. gelu_out [M, N] may not overlap a, b, bias or pre.
  virtual bool MatmulFp8GeluCast(void* pre, uint8_t* gelu_out, const uint8_t* a, Fp8Format a_format,
                                 const float* a_scale_inv, const uint8_t* b, Fp8Format b_format,
                                 const float* b_scale_inv, const void* bias, int M, int N, int K,
                                 Fp8Format gelu_format, const float* gelu_scale, float* gelu_amax,
                                 uint64_t* gelu_counts) {
    return false;
  }

  // The FP8 MLP backward's two casts that read fc1's pre-activation pre[rows, cols], in one
  // pass where the backend fuses them (the cuda backend, for aligned multiples of 8):
  //   GeluCastFp8(nullptr, in_t, scratch, pre, rows, cols, in_format, in_scale, in_amax,
  //               in_counts)                      — fc2's recomputed input transpose;
  //   CastFp8Grad(g_out, g_out_t, dout, pre, dbias, rows, cols, g_format, g_scale, g_amax,
  //               g_counts)                       — fc1's gradient cast (dGELU, bias gradient).
  // CONTRACT: in_t, g_out, g_out_t, g_amax, g_counts and dbias exactly as those two calls in
  // that order give them (the default runs them); in_amax and in_counts (the recomputation's
  // statistics, which training discards) may be written or left untouched. scratch as
  // GeluCastFp8's; it may overlap g_out and g_out_t (written after it is read), not in_t,
  // dout or pre.
  virtual void GeluCastFp8AndGrad(uint8_t* in_t, Fp8Format in_format, const float* in_scale,
                                  float* in_amax, uint64_t* in_counts, uint8_t* g_out,
                                  uint8_t* g_out_t, void* dout, const void* pre, void* dbias,
                                  int rows, int cols, Fp8Format g_format, const float* g_scale,
                                  float* g_amax, uint64_t* g_counts, void* scratch);

  // out = gelu_tanh(inp), n elements (the FP8 fc1's epilogue, where its GEMM does not fuse it).
  virtual void GeluForward(void* out, const void* inp, size_t n) = 0;
  // dout *= gelu_tanh'(pre), in place, n elements.
  virtual void GeluBackward(void* dout, const void* pre, size_t n) = 0;
  // dbias[c] += Σ_rows dout[r, c], dout [N, OC].
  virtual void BiasBackward(void* dbias, const void* dout, int N, int OC) = 0;

  // The delayed-scaling update (kernels/fp8_recipe.h) of n tensors at once: rolls each
  // history (row i of history [n, history_len]) with amax[i], zeroes amax[i], and sets
  // scale[i] and scale_inv[i * scale_inv_stride]. All FP32 device arrays; fp8_max[i] is tensor
  // i's format max. Bit-identical on every backend. (The stride lets every scale_inv sit on its
  // own aligned slot: cuBLASLt's FP8 GEMMs reject scale pointers that are only 4-byte aligned.)
  // skip_if_non_finite: null, or a device FP32 scalar (the step's gradient sum of squares):
  // when it is inf or NaN the update does nothing at all (scales and histories kept, the amaxes
  // left for the caller to discard), as for a skipped step.
  virtual void Fp8ScaleUpdate(float* scale, float* scale_inv, int scale_inv_stride,
                              float* history, float* amax, const float* fp8_max, int n,
                              int history_len, bool use_history_max, int margin,
                              const float* skip_if_non_finite) = 0;

  // ---- graph capture (optional) -----------------------------------------------------------
  // Work recorded once and replayed as one launch (a CUDA graph): no per-op launch cost.
  // Opaque; must not outlive the backend that recorded it.
  class Graph {
   public:
    virtual ~Graph() = default;
    virtual int64_t num_nodes() const = 0;  // recorded kernels, copies and memsets
  };
  // Starts recording: until EndCapture(), the ops and Memset0 calls on this backend enqueue
  // nothing and are recorded instead, with every pointer and host-side argument baked in.
  // In between, call nothing that moves data to or from the host, waits for the device or
  // allocates (Copy*, Synchronize, Alloc, Free, GetMemoryStats is fine), and keep profiling off.
  // UNIMPLEMENTED: this backend cannot record (cpu): run the ops eagerly instead.
  // FAILED_PRECONDITION: already recording, profiling on, or an earlier error is pending.
  virtual absl::Status BeginCapture() {
    return absl::UnimplementedError(name() + " backend: no graph capture");
  }
  // Ends recording and prepares the graph for replay. An error of a recorded op, or of the
  // capture itself (a forbidden call in between), is returned here; the recorded work never
  // ran, so the backend stays usable and the same ops can run eagerly.
  virtual absl::StatusOr<std::unique_ptr<Graph>> EndCapture() {
    return absl::UnimplementedError(name() + " backend: no graph capture");
  }
  // Enqueues one run of `graph` (asynchronous like any op; errors surface in Synchronize()).
  // REQUIRES: graph came from this backend's EndCapture().
  virtual void Replay(const Graph& graph) {}

  // ---- profiling (optional) ----------------------------------------------------------------
  // When enabled, the backend times every op on the device (events around each launch, no
  // host sync) and ProfileReport() returns a table of total time per op; backends without
  // device timers return "".
  virtual void EnableProfiling(bool on) {}
  virtual std::string ProfileReport() { return ""; }

 protected:
  bool weight_gradient_overwrite_ = false;  // see SetWeightGradientOverwrite
};

// The CPU reference backend (FP32, OpenBLAS GEMMs, threads across `num_threads` cores; 0 =
// all cores).
std::unique_ptr<Backend> NewCpuBackend(int num_threads = 0);
// The same algorithms in FP64: used by tests that compare against finite differences.
std::unique_ptr<Backend> NewCpuBackendF64(int num_threads = 1);

// True when this build contains the CUDA backend (it was built with a CUDA toolkit).
bool CudaBackendBuilt();
// The CUDA backend on `device`: BF16 compute, FP32 optimizer state. FAILED_PRECONDITION, with
// the reason, when this build has no CUDA backend, there is no such device, or its compute
// capability is below 8.0.
absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int device = 0);

}  // namespace boulder::kernels

#endif  // BOULDER_KERNELS_BACKEND_H_
