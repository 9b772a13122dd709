// Launchers of the CUDA kernels behind CudaBackend. Each takes an explicit stream, checks the
// launch and returns its error (cudaSuccess otherwise); none synchronises. Activations and
// weights are BF16, reductions accumulate in FP32. Shapes as in kernels/backend.h.
//
// Scratch: launchers that need temporary device memory take it from a Scratch the caller
// owns; it grows before first use, so a step's second run (and a CUDA-graph capture of it)
// allocates nothing. Once a graph has recorded its address (keep_retired), growing keeps the
// old buffer alive until the Scratch is destroyed. A Scratch given a DeviceBytes adds what it
// holds (the current buffer and any retired ones) to it, so a backend's memory report counts it.
#ifndef BOULDER_KERNELS_CUDA_OPS_H_
#define BOULDER_KERNELS_CUDA_OPS_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace boulder::kernels::cuda {

using bf16 = __nv_bfloat16;

// Device bytes held now and their high-water mark. Not thread-safe.
struct DeviceBytes {
  int64_t live = 0;
  int64_t peak = 0;
  void Add(int64_t n) {
    live += n;
    if (live > peak) peak = live;
  }
  void Sub(int64_t n) { live -= n; }
};

// A growable device buffer for temporaries. Not thread-safe.
class Scratch {
 public:
  explicit Scratch(DeviceBytes* count = nullptr) : count_(count) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch();
  // Returns at least `bytes` of device memory, reallocating (and losing the contents) if the
  // current buffer is smaller. Null on allocation failure (see last_error()).
  void* Get(size_t bytes);
  size_t capacity() const { return bytes_; }
  cudaError_t last_error() const { return err_; }
  // From now on a reallocation keeps the replaced buffer (a recorded graph may still use it).
  void keep_retired() { keep_retired_ = true; }

 private:
  void Count(int64_t n) {
    if (count_ != nullptr) n >= 0 ? count_->Add(n) : count_->Sub(-n);
  }

  DeviceBytes* count_;
  bool keep_retired_ = false;
  std::vector<void*> retired_;
  size_t retired_bytes_ = 0;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  cudaError_t err_ = cudaSuccess;
};

// ---- elementwise.cu ----
// Up to kMax byte ranges of one buffer (by value: a kernel argument, so a graph records it).
struct ZeroRangeList {
  static constexpr int kMax = 64;
  struct Range {
    size_t offset, bytes;
  };
  Range ranges[kMax];
  int count = 0;
};
// Zeroes every range of the list, offsets from base, in one launch.
cudaError_t ZeroRanges(void* base, const ZeroRangeList& list, cudaStream_t s);
cudaError_t EncoderForward(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe,
                           int B, int T, int C, cudaStream_t s);
cudaError_t ResidualForward(bf16* out, const bf16* a, const bf16* b, size_t n, cudaStream_t s);
cudaError_t F32ToBF16(bf16* out, const float* in, size_t n, cudaStream_t s);
cudaError_t BF16ToF32(float* out, const bf16* in, size_t n, cudaStream_t s);
cudaError_t Argmax(int32_t* out, const bf16* logits, int N, int V, int Vp, cudaStream_t s);
// out = gelu_tanh(inp), n elements.
cudaError_t GeluForward(bf16* out, const bf16* inp, size_t n, cudaStream_t s);
// dpre = dout * gelu_tanh'(pre), in place over dout (n elements).
cudaError_t GeluBackwardInPlace(bf16* dout, const bf16* pre, size_t n, cudaStream_t s);

// dst += src (n elements, each rounded once to BF16): a GEMM epilogue's bias gradient, which
// cuBLASLt writes with '=', added into the parameter gradient.
cudaError_t Accumulate(bf16* dst, const bf16* src, size_t n, cudaStream_t s);

// ---- encoder_backward.cu ---- deterministic: tokens sorted (stable), rows summed in order.
cudaError_t EncoderBackward(bf16* dwte, bf16* dwpe, const bf16* dout, const int32_t* tokens, int B,
                            int T, int C, Scratch& scratch, cudaStream_t s);

// ---- layernorm.cu, layernorm_fp8.cu (FP8) ----
cudaError_t LayerNormForward(bf16* out, float* mean, float* rstd, const bf16* inp,
                             const bf16* weight, const bf16* bias, int N, int C, cudaStream_t s);
// residual = a + b (BF16, as ResidualForward; may alias a or b), then out = LayerNorm(residual)
// as LayerNormForward, in one kernel: bit-identical to the two.
cudaError_t ResidualLayerNormForward(bf16* residual, bf16* out, float* mean, float* rstd,
                                     const bf16* a, const bf16* b, const bf16* weight,
                                     const bf16* bias, int N, int C, cudaStream_t s);
// Backend::ResidualLayerNormFp8Forward without the BF16 output: residual null -> y =
// LayerNorm(a), else residual = a + b and y = LayerNorm(residual); fp8_out [N, C] and
// fp8_out_t [C, N] (either may be null) = CastFp8(y) with its statistics, bit-identical to
// the unfused kernels. Only when LayerNormFp8Fusable (N, C multiples of 8, 16-byte-aligned
// BF16 operands, 8-byte-aligned FP8 outputs, a 32-row FP8 tile of C columns fits in shared
// memory); otherwise cudaErrorInvalidValue without launching.
bool LayerNormFp8Fusable(const void* residual, const void* a, const void* b, const void* weight,
                         const void* bias, const void* fp8_out, const void* fp8_out_t, int N,
                         int C);
cudaError_t ResidualLayerNormFp8Forward(bf16* residual, float* mean, float* rstd, const bf16* a,
                                        const bf16* b, const bf16* weight, const bf16* bias, int N,
                                        int C, uint8_t* fp8_out, uint8_t* fp8_out_t, bool e4m3,
                                        const float* scale, float* amax, unsigned long long* counts,
                                        cudaStream_t s);
// Backend::LayerNormFp8FromStats: out = LayerNormForward's out again from the mean and rstd
// it saved for inp (bit-identical), and the fused form without the BF16 output (fp8_out,
// fp8_out_t either may be null; only when LayerNormFp8Fusable(nullptr, inp, nullptr, ...),
// otherwise cudaErrorInvalidValue without launching), bit-identical to the FP8 forward's bytes
// and statistics for the inputs that gave inp, mean and rstd.
cudaError_t LayerNormFromStats(bf16* out, const bf16* inp, const float* mean, const float* rstd,
                               const bf16* weight, const bf16* bias, int N, int C, cudaStream_t s);
cudaError_t LayerNormFp8FromStats(const bf16* inp, const float* mean, const float* rstd,
                                  const bf16* weight, const bf16* bias, int N, int C,
                                  uint8_t* fp8_out, uint8_t* fp8_out_t, bool e4m3,
                                  const float* scale, float* amax, unsigned long long* counts,
                                  cudaStream_t s);
// The LayerNorm forwards hold a row in registers for C = 768 and 2048, the backward for C =
// 1024, 2048 and 4096 runs one pass with a row spread over a block,
// ResidualLayerNormFp8Forward without fp8_out_t runs a row kernel (a warp per row, no shared
// tile) and LayerNormFp8FromStats the cast-transpose tile kernel of CastFp8. On, they run the
// kernels they ran before (chunk loops; the FP8 ops the 32-row-tile kernel the forward with a
// transpose runs), which give the same bits: for fusion_bench's and the tests' comparisons.
// Not thread-safe: set it before launching.
void SetLayerNormReferenceKernels(bool on);
// Warps per block of the LayerNorm + FP8 kernel with a transpose (ResidualLayerNormFp8Forward
// with fp8_out_t, and the reference kernels): 8, 16 or 32 (1 to 4 rows per warp; the same
// bytes), or 0 (the default: 8, or 16 where 8 would give fewer than 3 blocks per SM). For
// fusion_bench and the tests. Not thread-safe: set it before launching.
void SetLayerNormFp8BlockWarps(int warps);
cudaError_t LayerNormBackward(bf16* dinp, bf16* dweight, bf16* dbias, const bf16* dout,
                              const bf16* inp, const bf16* weight, const float* mean,
                              const float* rstd, int N, int C, Scratch& scratch, cudaStream_t s);

// ---- reduce.cu ----
// out[c] += Σ_k partial[k, c] over k = 0..chunks-1 in that order (deterministic), BF16 out
// [C], FP32 partial [chunks, C]: the last pass of ColumnSumAccumulate, shared with the FP8
// backward cast's bias gradient.
cudaError_t ColumnFinish(bf16* out, const float* partial, int chunks, int C, cudaStream_t s);

// *sum = kernels::ChecksumHost of `bytes` bytes at `data` (4-byte aligned), reduced on the
// device (integer sums: any order gives the same value).
cudaError_t Checksum(const void* data, size_t bytes, unsigned long long* sum, cudaStream_t s);
// dbias[c] += Σ_rows x[r, c], deterministic two-stage column sum (x is [N, C]).
cudaError_t ColumnSumAccumulate(bf16* dbias, const bf16* x, int N, int C, Scratch& scratch,
                                cudaStream_t s);
// x = bf16(x ⊙ gelu'(pre)) (GeluBackwardInPlace) and dbias += Σ_rows x (ColumnSumAccumulate)
// in one pass over x where C % 8 == 0 and x, pre are 16-byte aligned: bit-identical to the
// two ops in sequence (which it runs otherwise).
cudaError_t GeluBackwardColumnSum(bf16* x, const bf16* pre, bf16* dbias, int N, int C,
                                  Scratch& scratch, cudaStream_t s);
// *out = Σ x², deterministic (fixed grid, fixed-order final sum).
cudaError_t NormSquared(float* out, const bf16* x, size_t n, Scratch& scratch, cudaStream_t s);
// The same with accumulate: *out += Σ x² (the same partial sums; only the last add differs).
cudaError_t NormSquared(float* out, const bf16* x, size_t n, bool accumulate, Scratch& scratch,
                        cudaStream_t s);
// The scratch bytes NormSquared takes (the same for every n), so a caller can size a Scratch
// before a graph capture.
size_t NormSquaredScratchBytes();

// ---- crossentropy.cu ----
cudaError_t SoftmaxCrossEntropy(float* losses, bf16* logits, const int32_t* targets, int N, int V,
                                int Vp, float dloss, cudaStream_t s);

// ---- adamw.cu ----
// step: null, or the device array AdamWStepValues wrote (lr and t are then taken from it).
// decay_bits, decay_offset: Backend::AdamW's DecayBits (kernels/backend.h): element i decays
// where bit decay_offset + i of decay_bits is set, or everywhere when decay_bits is null.
// master: the FP32 master weights, one of: none (both null: params are the weights), an FP32
// copy (f32), or the low halves that with params' BF16 bits hold them (low, kernels/
// split_master.h: params are read as the master's high halves and written as its rounding).
struct AdamWMaster {
  float* f32 = nullptr;
  uint16_t* low = nullptr;
};
cudaError_t AdamW(bf16* params, AdamWMaster master, const bf16* grads, float* m, float* v,
                  const uint8_t* decay_bits, size_t decay_offset, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int t, float grad_scale,
                  const float* norm_sq, float max_norm, const float* step, cudaStream_t s);
// Writes lr and t's bias corrections into step[Backend::kAdamWStepFloats] (one tiny kernel);
// skip_non_finite: AdamW with this step array then leaves everything untouched when *norm_sq is
// inf or NaN.
cudaError_t AdamWStepValues(float* step, float lr, int t, float beta1, float beta2,
                            bool skip_non_finite, cudaStream_t s);

// ---- attention_fwd.cu, attention_bwd.cu ---- causal flash attention, head size 64 or 128,
// 1 <= T <= kMaxAttentionT (tiles of 64 rows index grid dimension y). qkv, out, dout and dqkv
// must be 16-byte aligned (cudaErrorMisalignedAddress otherwise); other unsupported shapes
// give cudaErrorInvalidValue.
constexpr int kMaxAttentionT = 65535 * 64;
// Which forward kernel: kAuto takes kWgmma where AttentionWgmmaAvailable(), else kMmaSync (the
// two compute the same thing to BF16 rounding; tests and attention_bench name one).
// kWgmma where it is not available gives cudaErrorNotSupported.
enum class AttentionKernel { kAuto, kMmaSync, kWgmma };
// Which wgmma forward: kPlain attention_fwd_sm90.cuh's (the default), kPipelined
// attention_fwd_sm90_pipelined.cuh's (each warpgroup's softmax under its next products; the same
// outputs bit for bit) at two blocks per multiprocessor at head size 64 and one at 128 (where
// two would cap registers at 128 and ptxas serialises the products), kPipelinedOneBlock the
// same at one block per multiprocessor at both. Not yet timed on a GPU: attention_bench times
// all three.
enum class AttentionFwdVariant { kPlain, kPipelined, kPipelinedOneBlock };
cudaError_t AttentionForward(bf16* out, float* stats, const bf16* qkv, int B, int T, int C, int NH,
                             cudaStream_t s, AttentionKernel kernel = AttentionKernel::kAuto,
                             AttentionFwdVariant variant = AttentionFwdVariant::kPlain);
// attention_fwd_sm90.cu: true when the current device is compute capability 9.0 and this build
// carries sm_90a code for the wgmma forward.
bool AttentionWgmmaAvailable();
// Whether `kernel` runs wgmma on the current device (kAuto: AttentionWgmmaAvailable(), asked
// once per device); false for kWgmma where it is not available.
bool AttentionUsesWgmma(AttentionKernel kernel);
// fp8 (FP8 training, Backend::AttentionForwardFp8Cast): the kernel also writes out's E4M3
// codes (x · *scale, CastFp8's encoding) into fp8->out ([B·T, C] bytes, 8-byte aligned) and
// adds CastFp8's statistics of out to fp8->amax and fp8->counts (saturated, underflow,
// non-finite): the bytes and statistics of CastFp8(fp8->out, nullptr, out, B·T, C, ...).
struct AttentionFp8Cast {
  uint8_t* out;
  const float* scale;
  float* amax;
  unsigned long long* counts;
};
cudaError_t AttentionForwardSm90(bf16* out, float* stats, const bf16* qkv, int B, int T, int C,
                                 int NH, cudaStream_t s, const AttentionFp8Cast* fp8 = nullptr,
                                 AttentionFwdVariant variant = AttentionFwdVariant::kPlain);
// deterministic: dQ accumulates in registers in a fixed order (two kernels, bit-reproducible);
// otherwise, with mma.sync, one kernel adds it with FP32 atomics (faster there; last bits vary
// between runs). With wgmma both modes run the two kernels, which are faster there. `kernel`
// picks as for the forward.
// How the wgmma backward gets dQ (both ways deterministic, the same to BF16 rounding):
// kRecompute, a second kernel recomputing S and dP per (query, key) tile; kStoredDs, the dK/dV
// kernel also writes dS (BF16, the causal blocks: DsBufferBytes in attention_bwd_sm90.cuh, from
// `scratch`) and the second kernel only multiplies it by K. kAuto: AttentionDqDefault(head
// size), the measured faster one (kStoredDs at head size 128, kRecompute at 64).
enum class AttentionDq { kAuto, kRecompute, kStoredDs };
AttentionDq AttentionDqDefault(int head_size);
cudaError_t AttentionBackward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* stats, int B, int T, int C, int NH, bool deterministic,
                              Scratch& scratch, cudaStream_t s,
                              AttentionKernel kernel = AttentionKernel::kAuto,
                              AttentionDq dq = AttentionDq::kAuto);
// attention_bwd_sm90.cu: the backward's dK/dV and dQ kernels on wgmma (both modes: the dQ
// kernel is deterministic and faster than atomics there), given the preprocess arrays
// (attention_bwd.cuh); ds: the stored-dS buffer (DsBufferBytes) for AttentionDq::kStoredDs, or
// null to recompute.
cudaError_t AttentionBackwardSm90(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse2,
                                  const float* Dp, int B, int T, int Tp, int C, int NH,
                                  cudaStream_t s, unsigned char* ds = nullptr);

}  // namespace boulder::kernels::cuda

#endif  // BOULDER_KERNELS_CUDA_OPS_H_
