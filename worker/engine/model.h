// A pre-LN GPT-2 model trained over a kernels::Backend: forward, explicit backward, AdamW.
//
//   x = wte[tokens] + wpe[positions]
//   per layer: x += attn_proj(attention(qkv(ln_1(x)))); x += fc2(gelu_tanh(fc1(ln_2(x))))
//   logits = ln_f(x) · W_headᵀ   (W_head = wte when tie_embeddings; its gradient then
//                                 accumulates both uses)
//
// Parameters, gradients and AdamW moments are each one contiguous device buffer laid out by
// ParamLayout (see param_layout.h); activations live in one arena allocated at construction
// for at most max(B*T, context) token rows, so a step allocates nothing.
//
// Typical step (grad_accum_steps micro-batches):
//   ZeroGrad(); for each micro-batch: Forward(tokens, targets); Backward();
//   OptimizerStep(lr, t);
//
// Ownership: the Model does not own the Backend, which must outlive it; it owns (and frees)
// every buffer it allocated. Thread-safety: none; use a Model from one thread (as its Backend).
#ifndef BOULDER_WORKER_ENGINE_MODEL_H_
#define BOULDER_WORKER_ENGINE_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/backend.h"
#include "worker/engine/fp8_state.h"
#include "worker/engine/param_layout.h"

namespace boulder::engine {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // applied to 2-D matrices only
  float grad_clip = 1.0f;     // global-norm clip; 0 disables
};

// What the backward recomputes instead of keeping from the forward (activation checkpointing):
//   kNone  nothing: every layer keeps its activations, GELU's output (fc2's input) included;
//   kGelu  GELU's output is one [rows, F] buffer shared by all layers, recomputed from the
//          layer's kept fc1 output (the pre-activation) before fc2's weight gradient (llm.c's
//          `recompute`);
//   kMlp   the MLP's fc1 output ([rows, F] per layer, the largest) is also shared by all
//          layers and recomputed from ln_2's output in the backward;
//   kFull  a layer keeps only its output (the next layer's input); everything inside a layer
//          is shared by all layers and recomputed from the layer's input in the backward.
// The recomputation runs the same ops on the same inputs, so the loss and the gradients are
// bit-identical to kNone's on the cpu backend; the arena (activation_bytes()) shrinks. (On cuda
// the recomputed GELU is computed from the BF16 pre-activation, where the forward's GEMM
// epilogue, whose output kNone keeps, used the FP32 one: in kGelu, kMlp and kFull fc2's weight
// gradient sees values within one BF16 rounding of the forward's; those three are
// bit-identical to one another.) FP8 training never keeps GELU's output (fc2's backward
// recomputes its FP8 input transpose from fc_pre, model_fp8.cc): there kGelu is kNone. In
// FP8 the recomputed Linears cast with the step's scales and FP8 weights and record no amax or
// counters (the forward did); the FP8 transposes of qkv's and fc1's inputs are kept per layer
// in every mode (model_fp8.cc says which FP8 operands the backward recomputes).
enum class Recompute { kNone, kGelu, kMlp, kFull };

// training.activation_checkpointing's value as a Recompute: "none" (or empty), "gelu", "mlp"
// or "full"; anything else is INVALID_ARGUMENT naming the field and the choices.
absl::StatusOr<Recompute> ParseRecompute(absl::string_view mode);

struct ModelOptions {
  ModelConfig config;
  int batch_size = 1;        // B of a training micro-batch
  int seq_len = 1;           // T of a training micro-batch; <= config.context
  int grad_accum_steps = 1;  // micro-batches per optimizer step (scales the loss gradient)
  // Data-parallel ranks whose gradients are summed (DataParallel all-reduces with SUM): the
  // loss gradient is 1/(B*T*grad_accum_steps*gradient_ranks), each rank's share of the mean over
  // the global batch. So a rank's activation gradients equal, value for value, those one worker
  // with the whole global batch computes for the same rows, and FP8 casts them alike (also at
  // the initial scale 1, where E5M2 would round and flush a rank-mean gradient N times larger
  // differently).
  int gradient_ranks = 1;
  AdamWConfig adamw;
  uint64_t seed = 0;  // parameter init
  // Frozen parameters get no gradient (the weight-gradient GEMMs are skipped), no gradient
  // storage and no optimizer state; the optimizer leaves them bit-identical.
  std::vector<int> freeze_layers;  // 0-based layers, each in [0, layers)
  bool freeze_embeddings = false;  // wte and wpe (and the head when tied)
  Recompute recompute = Recompute::kNone;
  // FP8 training (model_fp8.cc): the qkv, attention-projection, fc1 and fc2 GEMMs of training
  // forwards and backwards run in FP8 with delayed scaling; the LM head, attention and
  // inference forwards (ForwardLogits, Generate) stay in the compute dtype.
  Fp8Options fp8;
  // FP8 only: keep every Linear's FP8 input transpose and FP8 weight transpose per layer, as
  // before the backward recomputed them (model_fp8.cc): more memory, the same weight
  // gradients up to fc2's recomputed GELU (bit-identical on the cpu emulation). For tests
  // that compare the two layouts; the memory estimate counts the default (false).
  bool fp8_keep_transposes = false;
  // FP8 only: keep every Linear's FP8 weight transpose per layer, cast with the weights once
  // per step (Model::CastFp8Weights), instead of casting it again in every backward into one
  // shared buffer. The trainer sets it where common::EstimateTrainingMemory says FP8 then
  // still takes no more memory than BF16 (fp8_keeps_weight_transposes); the bytes are the same.
  bool fp8_keep_weight_transposes = false;
  // FP8 only, without recompute: keep qkv's and fc1's FP8 input transposes per layer (their
  // LayerNorm writes them in the forward) instead of recomputing them in the backward
  // (LayerNormFp8FromStats). Set like fp8_keep_weight_transposes
  // (fp8_keeps_ln_input_transposes); the bytes are the same.
  bool fp8_keep_ln_input_transposes = false;
  // FP8 only: offer fc1's forward GEMM and fc2's input cast to the backend as one op
  // (Backend::MatmulFp8GeluCast; the FP8 GELU lands in the GELU output's buffer, which FP8
  // training leaves unused) where fc2's input transpose is not kept. Where the backend does
  // not take it, the two run as before. For tests that compare the two; the bytes are the same.
  bool fp8_fuse_gelu_cast = true;
  // FP8 only: offer the attention forward and the projection's input cast to the backend as
  // one op (Backend::AttentionForwardFp8Cast, into the shared FP8 input scratch) where the
  // projection's input transpose is not kept; where the backend does not take it, the two run
  // as before. For tests that compare the two; the bytes are the same.
  bool fp8_fuse_attention_cast = true;
  // ZeroGrad() leaves the Linear and LM-head weight gradients (which every backward writes
  // whole) to the step's first backward, whose weight-gradient GEMMs then write them with '='
  // (Backend::SetWeightGradientOverwrite): no memset of them, and no read of them by the GEMMs.
  // The results are the same values (0 + x = x); off: ZeroGrad() zeroes every gradient and
  // every backward accumulates. The trainer turns it off with BOULDER_WEIGHT_GRAD_OVERWRITE=off.
  bool overwrite_first_weight_gradients = true;
  // With one micro-batch per step and one gradient rank: the backward computes the gradient
  // norm's sum of squares bucket by bucket, as each bucket's gradients become final, beside
  // the rest of the backward (Backend::NormSquaredBeside), and the optimizer step (and
  // GradNorm()) use that instead of a pass over all gradients after the backward. The same
  // norm up to FP32 rounding (a sum of per-bucket sums); deterministic. Off (the default until
  // it has run on a GPU: bench/next_gpu_call.sh tests and times it): one pass after the
  // backward. The trainer turns it on with BOULDER_GRAD_NORM=backward.
  bool grad_norm_in_backward = false;
};

class Model {
 public:
  // Allocates and initialises parameters (deterministically from options.seed), zeroed
  // gradients and moments, and the activation arena.
  // INVALID_ARGUMENT: an impossible shape (names the field); RESOURCE_EXHAUSTED: an
  // allocation failed (from the backend, naming the size).
  static absl::StatusOr<std::unique_ptr<Model>> Create(kernels::Backend* backend,
                                                       const ModelOptions& options);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Training forward over one micro-batch: tokens and targets are host arrays [B*T] of ids in
  // [0, V). Returns the mean cross-entropy loss and leaves the logits' gradient (scaled by
  // 1/(B*T*grad_accum_steps)) ready for Backward().
  // INVALID_ARGUMENT: wrong sizes or an id outside [0, V).
  absl::StatusOr<double> Forward(absl::Span<const int32_t> tokens,
                                 absl::Span<const int32_t> targets);

  // Inference forward over tokens [B*T] (any B, T with T <= context and B*T <= the arena's
  // rows); the logits [B*T, Vp] are then readable through logits(). Invalidates a pending
  // Backward(). INVALID_ARGUMENT: bad shape or token ids.
  absl::Status ForwardLogits(absl::Span<const int32_t> tokens, int B, int T);

  // Accumulates (+=) the gradients of the last Forward()'s loss into grads().
  // FAILED_PRECONDITION: no training Forward() since the last Backward()/ForwardLogits().
  absl::Status Backward();

  // Sets grads() to zero. With options.overwrite_first_weight_gradients the weight gradients
  // that the next Backward() writes whole are not zeroed now: that backward writes them with
  // '=' (the same values), or grads(), GradNorm() or OptimizerStep() zero them first if they
  // come before it.
  void ZeroGrad();

  // Called by Backward() as soon as the gradients of bucket i (layout().Buckets()[i]) are
  // final for this micro-batch, so a data-parallel all-reduce can start while the backward
  // goes on: i = L+1 (final LN, head) first, then the layers L..1, then 0 (embeddings). On an
  // asynchronous backend "final" means enqueued on its stream. Empty: nothing is called.
  void set_on_bucket_ready(std::function<void(int bucket)> f) { on_bucket_ready_ = std::move(f); }

  // Global L2 norm of grads() (before clipping); synchronises with the backend.
  absl::StatusOr<float> GradNorm();
  // Whether the norm of grads() as they are now is computed already, by the last backward
  // (ModelOptions::grad_norm_in_backward) or by a GradNorm() since, so GradNorm() and
  // OptimizerStep() make no pass of their own. For tests and logs.
  bool grad_norm_computed() const { return grad_norm_ready_; }

  // One AdamW step with learning rate `lr` (t: 1-based step count, for bias correction),
  // clipping the gradient to adamw.grad_clip by global norm. Returns the gradient's norm
  // before clipping.
  absl::StatusOr<float> OptimizerStep(float lr, int t);

  // ---- The training step as device work only (model_graph.cc) ----------------------------
  // Forward(), Backward() and OptimizerStep() are these pieces with their host syncs; a CUDA
  // graph (step_graph.h) records EnqueueTrainingForward(), EnqueueBackward() and
  // EnqueueOptimizerStep() once and replays them, calling UploadBatch() and SetOptimizerStep()
  // before and ReadLoss() and ReadGradNorm() after each replay. The Enqueue* calls neither
  // synchronise nor allocate; recording them is valid without on_bucket_ready. FP8: a recorded
  // forward casts the weights if they are stale when it is recorded (so the recording of an
  // optimizer step's first micro-batch casts them and a later one doesn't), and the casts'
  // element tallies are host-side (Fp8State::elements(): StepGraph replays them).
  //
  // Validates one training micro-batch (as Forward()) and copies it into the model's token
  // buffers (synchronises). Invalidates a pending Backward().
  absl::Status UploadBatch(absl::Span<const int32_t> tokens, absl::Span<const int32_t> targets);
  // Enqueues the training forward and the loss over the uploaded batch; the logits' gradient
  // is left for EnqueueBackward(), the per-token losses on the device for ReadLoss().
  void EnqueueTrainingForward();
  // Enqueues the backward of the last training forward (Backward() without checks or sync).
  // first_of_step: the first backward after a ZeroGrad() that deferred the weight gradients
  // (defers_zero_grad()), which writes them with '=' instead of adding to them. A recorded
  // backward replays with the choice it was recorded with: StepGraph takes the pending
  // ZeroGrad() before replaying a first_of_step one (TakePendingZeroGrad) and flushes it
  // before any other (FlushPendingZeroGrad).
  void EnqueueBackward(bool first_of_step);
  // Whether ZeroGrad() defers zeroing the weight gradients to the next backward.
  bool defers_zero_grad() const { return !deferred_zero_.empty(); }
  // True, and the deferred weight gradients then count as written, when a ZeroGrad() is
  // pending (no backward since); false otherwise.
  bool TakePendingZeroGrad();
  // Enqueues zeroing the weight gradients a pending ZeroGrad() deferred (one launch), if one
  // is pending.
  void FlushPendingZeroGrad();
  // Enqueues writing lr and t (1-based) where the next EnqueueOptimizerStep()'s AdamW reads
  // them when it runs. Not to be recorded. RESOURCE_EXHAUSTED: its buffer's first allocation.
  // FP8: that AdamW also skips itself when the gradient norm is not finite (the eager loop
  // never runs it then; a replayed step relies on it).
  absl::Status SetOptimizerStep(float lr, int t);
  // Enqueues the gradient norm and one AdamW step (as OptimizerStep(), lr and t from the last
  // SetOptimizerStep() as of when it runs). REQUIRES: SetOptimizerStep() was called once.
  void EnqueueOptimizerStep();
  // FP8 only, after EnqueueOptimizerStep(): enqueues the delayed-scaling update, done on the
  // device only when that step's gradient norm is finite (else the step's amaxes stay, for
  // Fp8EndStep(/*apply=*/false, ...) to discard, and the scales stay as they were).
  void EnqueueFp8ScaleUpdate();
  // Synchronises; the mean loss of the last training forward.
  absl::StatusOr<double> ReadLoss();
  // Synchronises; the gradient norm (before clipping) of the last optimizer step.
  absl::StatusOr<float> ReadGradNorm();

  // Greedy continuation: appends `n` tokens, each the argmax of the last position of a
  // B=1 forward over the last min(len, context) tokens. INVALID_ARGUMENT: empty prompt, a
  // token outside [0, V) or n < 0.
  absl::StatusOr<std::vector<int32_t>> Generate(absl::Span<const int32_t> prompt, int n);

  // FP8 only (options.fp8.enabled), once per optimizer step after the backward(s):
  // apply = true after OptimizerStep (runs the delayed-scaling update); apply = false for a
  // skipped step (its amaxes are discarded). With `stats` non-null, reads every FP8 tensor's
  // statistics (synchronises). Then starts the next step's counters.
  absl::Status Fp8EndStep(bool apply, std::vector<Fp8TensorStat>* stats);
  // Fp8EndStep(/*apply=*/true, stats) for a step replayed from a graph that ran
  // EnqueueFp8ScaleUpdate() with a finite gradient norm (the update is not enqueued again).
  // A replayed step that was skipped ends with Fp8EndStep(/*apply=*/false, stats).
  absl::Status Fp8EndReplayedStep(std::vector<Fp8TensorStat>* stats);
  // Marks the FP8 weight copies stale, so the next training forward casts them: after a
  // recording that will not run (a failed capture recorded the casts without doing them).
  void InvalidateFp8Weights() { ++fp8_weight_version_; }
  // Null unless options.fp8.enabled.
  Fp8State* fp8_state() const { return fp8_.get(); }

  const ModelOptions& options() const { return options_; }
  const ParamLayout& layout() const { return layout_; }
  size_t num_params() const { return layout_.num_params(); }
  // Parameters that train (num_params() less the frozen ones): the length of grads() and of
  // the optimizer state.
  size_t num_trainable_params() const { return num_trainable_; }
  // The offset in grads() (and the optimizer state) of the parameter at `param_offset` of
  // params(); nullopt when that parameter is frozen.
  std::optional<size_t> GradOffset(size_t param_offset) const;

  // All parameters as FP32 in layout order (the FP32 master copy where one exists).
  absl::StatusOr<std::vector<float>> GetParameters();
  // Replaces every parameter (and its master copy). INVALID_ARGUMENT: wrong length.
  absl::Status SetParameters(const std::vector<float>& values);
  size_t activation_bytes() const { return arena_bytes_; }
  // The FP8 buffers (options.fp8.enabled; else 0): the scaling state, the shared FP8 weight
  // transpose and the per-Linear FP8 copies (model_fp8.cc). The FP8 cast scratch lives in the
  // activation arena (activation_bytes()), in backward buffers the forward leaves free.
  size_t fp8_bytes() const { return fp8_bytes_; }
  // Every byte this model allocated (parameters, gradients, optimizer state, activations, FP8).
  size_t total_bytes() const;

  // Device buffers of compute-dtype elements: params() holds num_params() laid out by
  // layout(); grads() holds num_trainable_params(): the trainable tensors in layout order with
  // the frozen ones left out (the same layout when nothing is frozen). logits() is [rows, Vp]
  // compute-dtype: the logits after ForwardLogits(), their gradient after a training Forward().
  void* params() const { return params_; }
  // The master weights (num_trainable_params() elements of master_bytes() / that many bytes,
  // as Backend::master_layout() says; with kBf16LowHalves, params() holds their high halves),
  // or null when the parameters are kept in the state dtype already.
  void* master_params() const { return master_; }
  size_t master_bytes() const { return num_trainable_ * master_elem_; }
  // The master weights as FP32 values, num_trainable_params() in gradient order (empty where
  // there are none), and writing them (with split masters, the trainable working weights too:
  // their rounded high halves). Both synchronise. For checkpoints and GetParameters().
  absl::StatusOr<std::vector<float>> ReadMasterF32() const;
  absl::Status WriteMasterF32(absl::Span<const float> values);
  // Flushes a pending ZeroGrad() first (FlushPendingZeroGrad), so what it points at is the
  // gradients once the work enqueued so far has run.
  void* grads() {
    FlushPendingZeroGrad();
    grad_norm_ready_ = false;  // the caller may write them
    return grads_;
  }
  // Optimizer state, num_trainable_params() state-dtype elements each (the trainable tensors,
  // as grads()), for checkpoints: the AdamW moments, and the FP32 master weights (null when
  // the compute dtype is the state dtype).
  void* adam_m() const { return m_; }
  void* adam_v() const { return v_; }
  void* master() const { return master_; }
  // Whether master() holds low halves (Backend::MasterLayout::kBf16LowHalves).
  bool split_master() const;
  const void* logits() const { return act_.logits; }

 private:
  // Per-layer activations saved by the forward for the backward.
  struct LayerActs {
    void* ln1;
    float* ln1_mean;
    float* ln1_rstd;
    void* qkv;
    void* atty;
    float* att_stats;
    void* residual2;  // x after the attention block
    void* ln2;
    float* ln2_mean;
    float* ln2_rstd;
    void* fc_pre;     // fc1 output before GELU
    void* fc_gelu;    // GELU(fc1 output): per layer in kNone, else one shared buffer
    void* residual3;  // x after the MLP block = the next layer's input
  };
  struct Activations {
    int32_t* tokens;
    int32_t* targets;
    void* encoded;
    std::vector<LayerActs> layers;
    void* lnf;
    float* lnf_mean;
    float* lnf_rstd;
    void* logits;
    float* losses;
    void* scratch;  // [rows, C]: projection outputs before the residual add
    // Backward scratch.
    void* dresidual;  // [rows, C]: the residual stream's gradient
    void* dln;        // [rows, C]
    void* datty;      // [rows, C]
    void* dqkv;       // [rows, 3C]
    void* dfc;        // [rows, F]
    float* norm_sq;   // scalar
    void* frozen_ln_grad;  // [2C]: a frozen LayerNorm's discarded weight and bias gradients
  };
  // A maximal range of trainable tensors, contiguous in the layout.
  struct TrainableRun {
    size_t param_offset;
    size_t grad_offset;  // into grads(), m, v, master
    size_t numel;
  };

  Model(kernels::Backend* backend, const ModelOptions& options);
  absl::Status Allocate();
  // Fills deferred_zero_ and eager_zero_ (REQUIRES: runs_ and grads_ set).
  void SplitZeroGrad();
  absl::Status CheckTokens(absl::Span<const int32_t> ids, const char* what) const;
  // Forward through the final LN and the head for the first B*T rows.
  void ForwardImpl(int B, int T);
  // Param (p) and gradient (g) pointers of one tensor.
  void* P(TensorKind kind, int layer = -1) const;
  void* G(TensorKind kind, int layer = -1) const;
  void* HeadWeight(void* base) const;
  void* HeadGrad() const;
  // The backward's recomputation of layer l's activations (activation checkpointing).
  void RecomputeLayer(int l);
  // A Linear's forward and backward (the contracts of Backend::MatmulForward/Backward): in
  // FP8 during training when options.fp8.enabled, else in the compute dtype (model_fp8.cc).
  // In FP8 training fc1 (epilogue kGelu) writes only pre_gelu (its GELU output is not needed:
  // see gelu_pre), and fc2 passes gelu_pre = fc1's pre-activation: its FP8 input is then
  // Backend::GeluCastFp8(gelu_pre), with inp's buffer as that op's scratch (inp need not hold
  // the GELU output). Without FP8, inp is fc2's input and gelu_pre is ignored.
  void Linear(int layer, Fp8Linear t, void* out, void* pre_gelu, const void* inp,
              const void* weight, const void* bias, int N, int C, int OC,
              kernels::Epilogue epilogue, const void* gelu_pre = nullptr);
  // cast_dout false (FP8, fc1 after MlpBackwardFp8's fused cast): fp8_dout_ and fp8_dout_t_
  // already hold dout's FP8 cast (its statistics and dbias recorded); the rest as usual.
  void LinearBackward(int layer, Fp8Linear t, void* dinp, void* dweight, void* dbias, void* dout,
                      const void* pre_gelu, const void* inp, const void* weight, int N, int C,
                      int OC, bool cast_dout = true);
  // Layer l's MLP backward (fc2, then fc1) in FP8 training: where fc2's input transpose is
  // recomputed and there is room (MlpFp8FusedCasts), with the two casts that read fc1's
  // pre-activation in one Backend::GeluCastFp8AndGrad (fc2's weight gradient after it); else
  // the two LinearBackward calls.
  void MlpBackwardFp8(int l);
  // FP8 Linear t's data gradient dinp[N,C] from the FP8 output gradient in fp8_dout_ and the
  // weight's transpose (kept, or transposed now into fp8_weight_t_).
  void DataGradientFp8(int layer, Fp8Linear t, void* dinp, int N, int C, int OC);
  bool MlpFp8FusedCasts(int l) const;
  absl::Status AllocateFp8();
  // Casts every FP8 Linear's weight (and its transpose where kept) with the step's scales in
  // one Backend::CastFp8Batch, recording their statistics; marks them current.
  void CastFp8Weights();
  // The LayerNorm before Linear t of `layer` (residual null: LayerNorm(a); else residual =
  // a + b first), the contracts of Backend::LayerNormForward/ResidualLayerNormForward. In an
  // FP8 training forward without recompute (LayerNorm output read only by that Linear's cast)
  // it writes the Linear's FP8 input and saved transpose directly
  // (Backend::ResidualLayerNormFp8Forward, the cast's statistics recorded once) and the Linear
  // skips its input cast; out's contents are then unspecified. Else the plain LayerNorm.
  void LayerNormBeforeLinear(int layer, Fp8Linear t, void* residual, void* out, float* mean,
                             float* rstd, const void* a, const void* b, const void* weight,
                             const void* bias, int N, int C);
  // `layer`'s attention forward (Backend::AttentionForward into its atty and att_stats). In an
  // FP8 training forward where the projection's input transpose is not kept and
  // ModelOptions::fp8_fuse_attention_cast, it offers the backend the projection's input cast
  // with it (Backend::AttentionForwardFp8Cast into fp8_input_, the cast's statistics recorded
  // once); where the backend takes it, the projection's Linear skips its input cast.
  void AttentionBeforeLinear(int layer, int B, int T);

  kernels::Backend* backend_;
  ModelOptions options_;
  ParamLayout layout_;
  size_t elem_ = 0;        // bytes per compute-dtype element
  size_t state_elem_ = 0;  // bytes per state-dtype element
  int rows_ = 0;           // token rows the arena holds

  std::vector<void*> allocations_;
  void* params_ = nullptr;
  void* grads_ = nullptr;
  void* master_ = nullptr;  // null when state dtype == compute dtype
  size_t master_elem_ = 0;  // bytes per trainable parameter of master_
  void* m_ = nullptr;
  void* v_ = nullptr;
  uint8_t* decay_bits_ = nullptr;  // kernels::DecayBits of the trainable parameters
  size_t arena_bytes_ = 0;
  std::vector<TrainableRun> runs_;
  size_t num_trainable_ = 0;
  int lowest_backward_layer_ = 0;  // layers below it need no backward at all
  // Byte ranges of grads_: the weight gradients every backward writes whole (ZeroGrad defers
  // them; empty when options.overwrite_first_weight_gradients is off), and the rest.
  std::vector<kernels::Backend::ByteRange> deferred_zero_, eager_zero_;
  bool zero_grad_pending_ = false;     // a ZeroGrad() deferred deferred_zero_, no backward since
  bool overwrite_weight_grads_ = false;  // during a first_of_step backward
  Activations act_{};
  int last_B_ = 0;
  int last_T_ = 0;
  bool backward_ready_ = false;
  std::function<void(int)> on_bucket_ready_;
  // Per bucket (layout_.Buckets() order), its range of grads_ (empty where the bucket is
  // frozen).
  std::vector<Bucket> bucket_grads_;
  // Whether this backward computes the norm as it goes (options.grad_norm_in_backward and it
  // applies), and how many gradients it has covered so far.
  bool norm_in_this_backward_ = false;
  size_t norm_covered_ = 0;
  // act_.norm_sq holds the sum of squares of grads() as they are now (set by a backward that
  // covered every gradient and by GradNorm(); cleared by anything that may change them).
  bool grad_norm_ready_ = false;
  // In the backward, once bucket i's gradients are final: on_bucket_ready_(i), and its share
  // of the norm where norm_in_this_backward_.
  void BucketReady(int i);
  float* adamw_step_ = nullptr;  // [Backend::kAdamWStepFloats]: SetOptimizerStep's values

  // FP8 (model_fp8.cc). Per layer and Linear: the FP8 weight, cast once per optimizer step.
  // The input transposes (for the weight gradient) and the weight transposes are recomputed in
  // the backward (null here) unless options.fp8_keep_transposes.
  struct Fp8LinearBuffers {
    uint8_t* input_t = nullptr;   // [K, N]
    uint8_t* weight = nullptr;    // [OC, K]
    uint8_t* weight_t = nullptr;  // [K, OC]
    int64_t weight_version = -1;  // fp8_weight_version_ when last cast
  };
  std::unique_ptr<Fp8State> fp8_;
  std::vector<Fp8LinearBuffers> fp8_linears_;  // [layers * Fp8State::kLinears]
  // In the arena's act_.dqkv (free in the forward, and in a layer's backward except between
  // attention's backward writing it and qkv's gradient cast reading it): the forward's FP8
  // input [N, max(C, F)], and in the backward the recomputed input transposes.
  uint8_t* fp8_input_ = nullptr;
  size_t fp8_input_bytes_ = 0;
  // In the arena's GELU buffer (free in the backward once fc2's input is recomputed from it):
  // the backward's FP8 output gradient [N, max(3C, F)] and its transpose.
  uint8_t* fp8_dout_ = nullptr;
  uint8_t* fp8_dout_t_ = nullptr;
  uint8_t* fp8_weight_t_ = nullptr;  // the backward's weight transpose [K·OC of the largest]
  int64_t fp8_weight_version_ = 0;   // bumped by every OptimizerStep
  size_t fp8_bytes_ = 0;
  bool fp8_training_forward_ = false;
  bool fp8_recompute_ = false;  // inside RecomputeLayer: FP8 casts record no statistics
  // The Linear (layer * kLinears + t; -1: none) whose FP8 input the op before it has cast and
  // recorded already, and where: fp8_input_ (its LayerNorm, or for the projection the attention
  // forward) or, for fc2, the GELU output's buffer (fc1's GEMM, MatmulFp8GeluCast).
  struct Fp8Precast {
    int linear = -1;
    const uint8_t* data = nullptr;
  };
  Fp8Precast fp8_precast_;
  // Where a recomputed cast's amax and counters go (nobody reads them): float, then
  // kFp8CountersPerTensor uint64 at byte 8.
  uint8_t* fp8_discard_ = nullptr;
};

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_MODEL_H_
