#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/env.h"
#include "common/env_choice.h"
#include "kernels/cuda/check.h"

namespace boulder::kernels::cuda {
namespace {

uint16_t F32ToBF16Bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  x += 0x7fffu + ((x >> 16) & 1u);                     // round to nearest even
  return static_cast<uint16_t>(x >> 16);
}

float BF16BitsToF32(uint16_t b) {
  uint32_t x = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device: ", err == cudaSuccess ? "none found" : cudaGetErrorString(err)));
  }
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " does not exist (", count, " present)"));
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  if (prop.major < 8) {
    return absl::FailedPreconditionError(
        absl::StrCat(prop.name, " has compute capability ", prop.major, ".", prop.minor,
                     "; the CUDA backend needs 8.0 or higher (BF16 tensor cores)"));
  }
  std::unique_ptr<CudaBackend> b(new CudaBackend());
  using common::ReadEnvChoice;
  using common::ReadEnvSwitch;
  for (absl::Status s : {
           ReadEnvChoice<Fp8Gemm>(common::kEnvFp8Gemm,
                                  {{"auto", Fp8Gemm::kAuto},
                                   {"cublaslt", Fp8Gemm::kCublasLt},
                                   {"own", Fp8Gemm::kSm90}},
                                  &b->fp8_gemm_),
           ReadEnvChoice<Bf16Gemm>(common::kEnvBf16Gemm,
                                   {{"auto", Bf16Gemm::kAuto},
                                    {"cublaslt", Bf16Gemm::kCublasLt},
                                    {"own", Bf16Gemm::kSm90},
                                    {"own-gelu", Bf16Gemm::kSm90Gelu}},
                                   &b->bf16_gemm_),
           ReadEnvChoice<Bf16GemmTile>(common::kEnvBf16GemmTile,
                                       {{"auto", Bf16GemmTile::kAuto},
                                        {"256", Bf16GemmTile::kN256},
                                        {"128", Bf16GemmTile::kN128},
                                        {"pingpong", Bf16GemmTile::kPingPong}},
                                       &b->bf16_gemm_tile_),
           ReadEnvSwitch(common::kEnvFp8GemmGelu, "on", "off", &b->fp8_gemm_gelu_),
           ReadEnvSwitch(common::kEnvFp8AttentionCast, "on", "off", &b->fp8_attention_cast_),
           ReadEnvChoice<cuda::AttentionDq>(common::kEnvAttentionDq,
                                            {{"auto", cuda::AttentionDq::kAuto},
                                             {"recompute", cuda::AttentionDq::kRecompute},
                                             {"stored", cuda::AttentionDq::kStoredDs}},
                                            &b->attention_dq_),
           ReadEnvChoice<cuda::AttentionFwdVariant>(
               common::kEnvAttentionFwd,
               {{"plain", cuda::AttentionFwdVariant::kPlain},
                {"pipelined", cuda::AttentionFwdVariant::kPipelined},
                {"pipelined1", cuda::AttentionFwdVariant::kPipelinedOneBlock}},
               &b->attention_fwd_),
           ReadEnvSwitch(common::kEnvMasterWeights, "split", "fp32", &b->split_master_)}) {
    if (!s.ok()) return s;
  }
  b->device_ = device;
  b->device_name_ = prop.name;
  b->cc_major_ = prop.major;
  b->cc_minor_ = prop.minor;
  b->device_total_ = static_cast<int64_t>(prop.totalGlobalMem);
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&b->side_stream_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&b->fork_, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&b->join_, cudaEventDisableTiming));
  CUDA_CHECK(cudaStreamCreateWithFlags(&b->norm_stream_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&b->norm_fork_, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&b->norm_join_, cudaEventDisableTiming));
  // Sized now: a first NormSquaredBeside inside a graph capture must not allocate.
  if (b->norm_scratch_.Get(cuda::NormSquaredScratchBytes()) == nullptr) {
    CUDA_CHECK(b->norm_scratch_.last_error());
  }
  absl::StatusOr<std::unique_ptr<LtMatmul>> mm = LtMatmul::Create();
  if (!mm.ok()) return mm.status();
  b->matmul_ = std::move(*mm);
  return b;
}

CudaBackend::~CudaBackend() {
  if (capturing_) {  // an abandoned capture: end it so the stream can be synchronised
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
  }
  if (stream_) cudaStreamSynchronize(stream_);
  if (side_stream_) cudaStreamSynchronize(side_stream_);
  if (norm_stream_) cudaStreamSynchronize(norm_stream_);
  for (const Timed& t : timed_) {
    cudaEventDestroy(t.start);
    cudaEventDestroy(t.end);
  }
  for (cudaEvent_t e : event_pool_) cudaEventDestroy(e);
  for (auto& [ptr, bytes] : allocations_) cudaFree(ptr);
  matmul_.reset();
  if (fork_) cudaEventDestroy(fork_);
  if (join_) cudaEventDestroy(join_);
  if (side_stream_) cudaStreamDestroy(side_stream_);
  if (norm_fork_) cudaEventDestroy(norm_fork_);
  if (norm_join_) cudaEventDestroy(norm_join_);
  if (norm_stream_) cudaStreamDestroy(norm_stream_);
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaBackend::Fail(absl::Status s) {
  if (sticky_.ok() && !s.ok()) sticky_ = std::move(s);
}
void CudaBackend::Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) Fail(CudaStatus(err, what, __FILE__, __LINE__));
}
void CudaBackend::Check(const absl::Status& s) { Fail(s); }

absl::StatusOr<void*> CudaBackend::Alloc(size_t bytes) {
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the (non-sticky) allocation error
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaMalloc of ", bytes, " bytes failed on ", device_name_, ": ",
                     cudaGetErrorString(err), " (", free_b, " of ", total_b, " bytes free, ",
                     memory_.live, " allocated by this trainer)"));
  }
  allocations_[p] = bytes;
  memory_.Add(static_cast<int64_t>(bytes));
  return p;
}

void CudaBackend::Free(void* ptr) {
  auto it = allocations_.find(ptr);
  if (it == allocations_.end()) return;
  memory_.Sub(static_cast<int64_t>(it->second));
  allocations_.erase(it);
  Check(cudaFree(ptr), "cudaFree");
}

void CudaBackend::Memset0(void* ptr, size_t bytes) {
  if (Ok()) Check(cudaMemsetAsync(ptr, 0, bytes, stream_), "cudaMemsetAsync");
}

void CudaBackend::Memset0Ranges(void* base, const std::vector<ByteRange>& ranges) {
  if (ranges.size() == 1) {  // one cudaMemsetAsync, as Memset0
    return Memset0(static_cast<char*>(base) + ranges[0].offset, ranges[0].bytes);
  }
  cuda::ZeroRangeList list;
  for (size_t i = 0; i < ranges.size() && Ok(); ++i) {
    if (ranges[i].bytes == 0) continue;
    list.ranges[list.count++] = {ranges[i].offset, ranges[i].bytes};
    if (list.count == cuda::ZeroRangeList::kMax) {
      Check(cuda::ZeroRanges(base, list, stream_), "ZeroRanges");
      list.count = 0;
    }
  }
  if (list.count > 0 && Ok()) Check(cuda::ZeroRanges(base, list, stream_), "ZeroRanges");
}

void CudaBackend::CopyFromHostF32(void* dst, DType dtype, const float* src, size_t n) {
  if (!Ok()) return;
  if (dtype == DType::kF32) {
    Check(cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
  } else if (dtype == DType::kBF16) {
    std::vector<uint16_t> tmp(n);
    for (size_t i = 0; i < n; ++i) tmp[i] = F32ToBF16Bits(src[i]);
    Check(cudaMemcpyAsync(dst, tmp.data(), n * 2, cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync");
    Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  } else {
    Fail(absl::InvalidArgumentError(absl::StrCat("cuda backend: no ", DTypeName(dtype), " buffers")));
  }
  if (dtype == DType::kF32) Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void CudaBackend::CopyToHostF32(float* dst, const void* src, DType dtype, size_t n) {
  if (!Ok()) return;
  JoinNormSquared();  // what it copies may be a NormSquaredBeside result
  if (dtype == DType::kF32) {
    Check(cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  } else if (dtype == DType::kBF16) {
    std::vector<uint16_t> tmp(n);
    Check(cudaMemcpyAsync(tmp.data(), src, n * 2, cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync");
    Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    for (size_t i = 0; i < n; ++i) dst[i] = BF16BitsToF32(tmp[i]);
  } else {
    Fail(absl::InvalidArgumentError(absl::StrCat("cuda backend: no ", DTypeName(dtype), " buffers")));
  }
}

void CudaBackend::CopyFromHost(void* dst, const void* src, size_t bytes) {
  if (!Ok()) return;
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
  Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void CudaBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (!Ok()) return;
  JoinNormSquared();  // what it copies may be a NormSquaredBeside result
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
  Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

absl::Status CudaBackend::Synchronize() {
  JoinNormSquared();
  if (sticky_.ok()) Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  return sticky_;
}

absl::StatusOr<uint64_t> CudaBackend::Checksum(const void* data, size_t bytes) {
  if (!Ok()) return sticky_;
  // The device reduction reads whole 32-bit words.
  if (reinterpret_cast<uintptr_t>(data) % 4 != 0) return Backend::Checksum(data, bytes);
  auto* sum = static_cast<unsigned long long*>(scratch_.Get(sizeof(unsigned long long)));
  if (sum == nullptr) {
    Check(scratch_.last_error(), "Checksum scratch");
    return sticky_;
  }
  Check(cuda::Checksum(data, bytes, sum, stream_), "Checksum");
  unsigned long long host = 0;
  CopyToHost(&host, sum, sizeof(host));
  if (absl::Status s = Synchronize(); !s.ok()) return s;
  return static_cast<uint64_t>(host);
}

MemoryStats CudaBackend::GetMemoryStats() const {
  MemoryStats m;
  // Everything this backend holds on the device counts as allocated, as PyTorch's caching
  // allocator counts its temporaries and cuBLAS workspaces: Alloc's buffers, the kernels'
  // scratch (memory_ counts both) and cuBLASLt's two workspaces, held for the backend's life.
  // Nothing is pooled, so reserved equals allocated.
  const int64_t workspaces =
      LtMatmul::kWorkspaces * static_cast<int64_t>(LtMatmul::kWorkspaceBytes);
  m.allocated_bytes = memory_.live + workspaces;
  m.peak_bytes = memory_.peak + workspaces;
  m.reserved_bytes = m.allocated_bytes;
  m.device_total_bytes = device_total_;
  return m;
}

#define BOULDER_REQUIRE(cond, msg)                                                   \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      Fail(absl::InvalidArgumentError(absl::StrCat("cuda backend: ", msg)));         \
      return;                                                                        \
    }                                                                                \
  } while (0)

void CudaBackend::EncoderForward(void* out, const int32_t* tokens, const void* wte,
                                 const void* wpe, int B, int T, int C) {
  if (!Ok()) return;
  ProfileScope profile(this, "EncoderForward");
  BOULDER_REQUIRE(C % 8 == 0, absl::StrCat("hidden ", C, " is not a multiple of 8"));
  Check(cuda::EncoderForward(static_cast<bf16*>(out), tokens, static_cast<const bf16*>(wte),
                             static_cast<const bf16*>(wpe), B, T, C, stream_),
        "EncoderForward");
}

void CudaBackend::EncoderBackward(void* dwte, void* dwpe, const void* dout,
                                  const int32_t* tokens, int B, int T, int C) {
  if (!Ok()) return;
  ProfileScope profile(this, "EncoderBackward");
  Check(cuda::EncoderBackward(static_cast<bf16*>(dwte), static_cast<bf16*>(dwpe),
                              static_cast<const bf16*>(dout), tokens, B, T, C, scratch_, stream_),
        "EncoderBackward");
}

void CudaBackend::LayerNormForward(void* out, float* mean, float* rstd, const void* inp,
                                   const void* weight, const void* bias, int N, int C) {
  if (!Ok()) return;
  ProfileScope profile(this, "LayerNormForward");
  BOULDER_REQUIRE(C % 8 == 0, absl::StrCat("hidden ", C, " is not a multiple of 8"));
  Check(cuda::LayerNormForward(static_cast<bf16*>(out), mean, rstd,
                               static_cast<const bf16*>(inp), static_cast<const bf16*>(weight),
                               static_cast<const bf16*>(bias), N, C, stream_),
        "LayerNormForward");
}

void CudaBackend::ResidualLayerNormForward(void* residual, void* out, float* mean, float* rstd,
                                           const void* a, const void* b, const void* weight,
                                           const void* bias, int N, int C) {
  if (!Ok()) return;
  ProfileScope profile(this, "ResidualLayerNormForward");
  BOULDER_REQUIRE(C % 8 == 0, absl::StrCat("hidden ", C, " is not a multiple of 8"));
  Check(cuda::ResidualLayerNormForward(static_cast<bf16*>(residual), static_cast<bf16*>(out), mean,
                                       rstd, static_cast<const bf16*>(a),
                                       static_cast<const bf16*>(b),
                                       static_cast<const bf16*>(weight),
                                       static_cast<const bf16*>(bias), N, C, stream_),
        "ResidualLayerNormForward");
}

void CudaBackend::LayerNormBackward(void* dinp, void* dweight, void* dbias, const void* dout,
                                    const void* inp, const void* weight, const float* mean,
                                    const float* rstd, int N, int C) {
  if (!Ok()) return;
  ProfileScope profile(this, "LayerNormBackward");
  Check(cuda::LayerNormBackward(static_cast<bf16*>(dinp), static_cast<bf16*>(dweight),
                                static_cast<bf16*>(dbias), static_cast<const bf16*>(dout),
                                static_cast<const bf16*>(inp), static_cast<const bf16*>(weight),
                                mean, rstd, N, C, scratch_, stream_),
        "LayerNormBackward");
}

void CudaBackend::MatmulForward(void* out, void* pre_gelu, const void* inp, const void* weight,
                                const void* bias, int N, int C, int OC, Epilogue epilogue) {
  if (!Ok()) return;
  // GEMMs are timed per shape (N x C -> OC): which Linear costs what.
  ProfileScope profile(this, profiling_ ? absl::StrCat("MatmulForward ", N, "x", C, "->", OC)
                                        : std::string());
  BOULDER_REQUIRE(C % 8 == 0 && OC % 8 == 0,
                  absl::StrCat("GEMM dims ", C, "x", OC, " must be multiples of 8"));
  GemmShape s;
  s.trans_a = true;
  s.m = OC;
  s.n = N;
  s.k = C;
  s.lda = C;
  s.ldb = C;
  s.ldd = OC;
  const bool gelu = epilogue == Epilogue::kGelu;
  if (gelu) BOULDER_REQUIRE(pre_gelu != nullptr, "GELU epilogue without a pre-activation buffer");
  if (RoutesToOwnBf16Gemm(N, C, OC, gelu, out, pre_gelu, inp, weight, bias)) {
    // Ours writes the pre-activation to its first output and GELU of it to the second.
    Check(Bf16GemmSm90(static_cast<bf16*>(gelu ? pre_gelu : out),
                       gelu ? static_cast<bf16*>(out) : nullptr, static_cast<const bf16*>(inp),
                       static_cast<const bf16*>(weight), static_cast<const bf16*>(bias), N, OC,
                       C, stream_, bf16_gemm_tile_),
          "Bf16GemmSm90");
    return;
  }
  void* aux = nullptr;
  if (gelu) {
    s.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    aux = pre_gelu;
  } else {
    s.epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  }
  Check(matmul_->Run(s, weight, inp, out, bias, aux, stream_));
}

bool CudaBackend::RoutesToOwnBf16Gemm(int N, int C, int OC, bool gelu, const void* out,
                                      const void* pre_gelu, const void* inp, const void* weight,
                                      const void* bias) const {
  if (bf16_gemm_ == Bf16Gemm::kCublasLt || cc_major_ != 9 || !Bf16GemmSm90Available()) {
    return false;
  }
  if (!Bf16GemmSm90Supports(N, OC, C, inp, weight, gelu ? pre_gelu : out, bias,
                            gelu ? out : nullptr)) {
    return false;
  }
  switch (bf16_gemm_) {
    case Bf16Gemm::kSm90:
      return true;
    case Bf16Gemm::kSm90Gelu:
      return gelu;
    default:
      return Bf16GemmSm90Preferred(N, OC, C, gelu);
  }
}

namespace {

// dW[OC,C] += dout[N,OC]ᵀ · inp[N,C] (no epilogue); '=' without accumulate (beta 0: the GEMM
// does not read dW).
GemmShape WeightGradientShape(int N, int C, int OC, bool accumulate) {
  GemmShape s;
  s.trans_b = true;
  s.m = C;
  s.n = OC;
  s.k = N;
  s.lda = C;
  s.ldb = OC;
  s.ldd = C;
  s.accumulate = accumulate;
  return s;
}

}  // namespace

void CudaBackend::MatmulBackward(void* dinp, void* dweight, void* dbias, void* dout,
                                 const void* pre_gelu, const void* inp, const void* weight,
                                 int N, int C, int OC) {
  if (!Ok()) return;
  ProfileScope profile(this, profiling_ ? absl::StrCat("MatmulBackward ", N, "x", C, "->", OC)
                                        : std::string());
  bf16* dy = static_cast<bf16*>(dout);
  if (pre_gelu) {
    Check(GeluBackwardInPlace(dy, static_cast<const bf16*>(pre_gelu), size_t(N) * OC, stream_),
          "GeluBackwardInPlace");
  }
  // With a data gradient to run beside it, the weight gradient's GEMM may take the side stream.
  const bool fork = dinp != nullptr && ForkWeightGradient(dweight, N, C, OC, /*gelu=*/false);
  if (fork) WeightGradientGemm(dweight, dy, inp, N, C, OC, side_stream_, LtMatmul::kSideWorkspace);
  if (dinp) {
    GemmShape s;  // dinp[N,C] = dout[N,OC] · W[OC,C]
    s.m = C;
    s.n = N;
    s.k = OC;
    s.lda = C;
    s.ldb = OC;
    s.ldd = C;
    Check(matmul_->Run(s, weight, dy, dinp, nullptr, nullptr, stream_));
  }
  FinishWeightGradient(fork, dweight, dbias, dy, inp, N, C, OC);
}

bool CudaBackend::ForkWeightGradient(const void* dweight, int N, int C, int OC, bool gelu) {
  if (!concurrent_wgrad_ || dweight == nullptr || fused_epilogues_ || !Ok()) return false;
  // The first call of a shape runs both GEMMs on stream_: it autotunes them, and their trial
  // timings must not share the GPU with each other.
  if (wgrad_seen_.insert({N, C, OC, gelu, weight_gradient_overwrite_}).second) return false;
  Check(cudaEventRecord(fork_, stream_), "cudaEventRecord");
  Check(cudaStreamWaitEvent(side_stream_, fork_, 0), "cudaStreamWaitEvent");
  return Ok();
}

void CudaBackend::FinishWeightGradient(bool forked, void* dweight, void* dbias, const bf16* dy,
                                       const void* inp, int N, int C, int OC) {
  if (!forked) return WeightGradient(dweight, dbias, dy, inp, N, C, OC);
  BiasGradient(dbias, dy, N, OC);  // on stream_: it uses scratch_
  Check(cudaEventRecord(join_, side_stream_), "cudaEventRecord");
  Check(cudaStreamWaitEvent(stream_, join_, 0), "cudaStreamWaitEvent");
}

void CudaBackend::BiasGradient(void* dbias, const bf16* dy, int N, int OC) {
  if (dbias) {
    Check(ColumnSumAccumulate(static_cast<bf16*>(dbias), dy, N, OC, scratch_, stream_),
          "ColumnSumAccumulate");
  }
}

void CudaBackend::MatmulBackwardGelu(void* dpre, void* dpre_bias, const void* pre, void* dweight,
                                     void* dbias, void* dout, const void* inp, const void* weight,
                                     int N, int C, int OC) {
  if (!Ok()) return;
  ProfileScope profile(this, profiling_
                                 ? absl::StrCat("MatmulBackwardGelu ", N, "x", C, "->", OC)
                                 : std::string());
  BOULDER_REQUIRE(C % 8 == 0, absl::StrCat("GELU width ", C, " is not a multiple of 8"));
  const bf16* dy = static_cast<const bf16*>(dout);
  // The weight gradient reads dout and inp only: it may run beside everything below.
  const bool fork = ForkWeightGradient(dweight, N, C, OC, /*gelu=*/true);
  if (fork) WeightGradientGemm(dweight, dy, inp, N, C, OC, side_stream_, LtMatmul::kSideWorkspace);
  GemmShape s;  // dpre[N,C] = (dout[N,OC] · W[OC,C]) ⊙ gelu'(pre)
  s.m = C;
  s.n = N;
  s.k = OC;
  s.lda = C;
  s.ldb = OC;
  s.ldd = C;
  bool fused = false;
  if (fused_epilogues_) {
    // aux = pre, [N,C] row-major = C×N column-major with ld C (= m, a multiple of 8); the bias
    // gradient (length m = C) sums the dGELU output over the n = N rows.
    s.epilogue = dpre_bias ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    bf16* g = dpre_bias ? BiasGradScratch(C) : nullptr;
    if (dpre_bias && g == nullptr) return;
    absl::StatusOr<bool> ran =
        matmul_->TryRun(s, weight, dy, dpre, g, const_cast<void*>(pre), stream_);
    if (!ran.ok()) return Fail(ran.status());
    fused = *ran;
    if (fused && g) {
      Check(Accumulate(static_cast<bf16*>(dpre_bias), g, C, stream_), "Accumulate");
    }
  }
  if (!fused && dgelu_epilogue_) {
    // dGELU in the GEMM's epilogue (from the FP32 accumulator), fc1's bias gradient a column
    // sum of its output.
    s.epilogue = CUBLASLT_EPILOGUE_DGELU;
    absl::StatusOr<bool> ran =
        matmul_->TryRun(s, weight, dy, dpre, nullptr, const_cast<void*>(pre), stream_);
    if (!ran.ok()) return Fail(ran.status());
    fused = *ran;
    if (fused && dpre_bias) {
      Check(ColumnSumAccumulate(static_cast<bf16*>(dpre_bias), static_cast<const bf16*>(dpre), N,
                                C, scratch_, stream_),
            "ColumnSumAccumulate");
    }
  }
  if (!fused) {
    s.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    Check(matmul_->Run(s, weight, dy, dpre, nullptr, nullptr, stream_));
    bf16* dp = static_cast<bf16*>(dpre);
    if (dpre_bias) {
      Check(GeluBackwardColumnSum(dp, static_cast<const bf16*>(pre), static_cast<bf16*>(dpre_bias),
                                  N, C, scratch_, stream_),
            "GeluBackwardColumnSum");
    } else {
      Check(GeluBackwardInPlace(dp, static_cast<const bf16*>(pre), size_t(N) * C, stream_),
            "GeluBackwardInPlace");
    }
  }
  FinishWeightGradient(fork, dweight, dbias, dy, inp, N, C, OC);
}

bf16* CudaBackend::BiasGradScratch(size_t n) {
  void* p = bgrad_.Get(n * sizeof(bf16));
  if (p == nullptr) Check(bgrad_.last_error(), "allocating the bias-gradient scratch");
  return static_cast<bf16*>(p);
}

void CudaBackend::WeightGradient(void* dweight, void* dbias, const bf16* dy, const void* inp,
                                 int N, int C, int OC) {
  if (!Ok()) return;
  if (dweight == nullptr) return BiasGradient(dbias, dy, N, OC);  // a frozen weight
  GemmShape s = WeightGradientShape(N, C, OC, !weight_gradient_overwrite_);
  if (dbias && fused_epilogues_) {
    // BGRADB: Σ over k (= N rows) of op(B) = doutᵀ's columns, one value per n = OC.
    s.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    bf16* g = BiasGradScratch(OC);
    if (g == nullptr) return;
    absl::StatusOr<bool> ran = matmul_->TryRun(s, inp, dy, dweight, g, nullptr, stream_);
    if (!ran.ok()) return Fail(ran.status());
    if (*ran) {
      Check(Accumulate(static_cast<bf16*>(dbias), g, OC, stream_), "Accumulate");
      return;
    }
    s.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  }
  BiasGradient(dbias, dy, N, OC);
  WeightGradientGemm(dweight, dy, inp, N, C, OC, stream_, LtMatmul::kMainWorkspace);
}

void CudaBackend::WeightGradientGemm(void* dweight, const bf16* dy, const void* inp, int N, int C,
                                     int OC, cudaStream_t stream, int workspace) {
  Check(matmul_->Run(WeightGradientShape(N, C, OC, !weight_gradient_overwrite_), inp, dy, dweight,
                     nullptr, nullptr, stream, nullptr, nullptr, workspace));
}

namespace {

// The attention kernels take head size 64 or 128, 1 <= T <= kMaxAttentionT, and 16-byte
// aligned tensors.
absl::Status CheckAttentionShape(const void* const* tensors, int n, int B, int T, int C, int NH) {
  if (B < 1 || T < 1 || NH < 1 || T > kMaxAttentionT || int64_t(B) * NH > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: attention shape B=", B, " T=", T, " NH=", NH,
                     " (need B, T, NH >= 1, T <= ", kMaxAttentionT, ")"));
  }
  if (C % NH != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: attention hidden ", C, " is not divisible by ", NH, " heads"));
  }
  if (C / NH != 64 && C / NH != 128) {
    return absl::InvalidArgumentError(absl::StrCat("cuda backend: attention head size ", C / NH,
                                                   " (hidden ", C, " / ", NH,
                                                   " heads; supports 64 and 128)"));
  }
  for (int i = 0; i < n; ++i) {
    if (reinterpret_cast<uintptr_t>(tensors[i]) % 16 != 0) {
      return absl::InvalidArgumentError("cuda backend: attention tensors must be 16-byte aligned");
    }
  }
  return absl::OkStatus();
}

}  // namespace

void CudaBackend::AttentionForward(void* out, float* stats, const void* qkv, int B, int T, int C,
                                   int NH) {
  if (!Ok()) return;
  ProfileScope profile(this, "AttentionForward");
  const void* tensors[] = {out, qkv};
  absl::Status shape = CheckAttentionShape(tensors, 2, B, T, C, NH);
  if (!shape.ok()) return Fail(shape);
  Check(cuda::AttentionForward(static_cast<bf16*>(out), stats, static_cast<const bf16*>(qkv), B, T,
                               C, NH, stream_, cuda::AttentionKernel::kAuto, attention_fwd_),
        "AttentionForward");
}

bool CudaBackend::AttentionForwardFp8Cast(void* out, float* stats, const void* qkv, int B, int T,
                                          int C, int NH, uint8_t* fp8_out, Fp8Format format,
                                          const float* scale, float* amax, uint64_t* counts) {
  if (!Ok()) return true;  // the backend has failed: nothing runs (as every op)
  if (!fp8_attention_cast_ || format != Fp8Format::kE4M3 || !cuda::AttentionWgmmaAvailable() ||
      reinterpret_cast<uintptr_t>(fp8_out) % 8 != 0) {
    return false;
  }
  ProfileScope profile(this, "AttentionForwardFp8Cast");
  const void* tensors[] = {out, qkv};
  absl::Status shape = CheckAttentionShape(tensors, 2, B, T, C, NH);
  if (!shape.ok()) {
    Fail(shape);
    return true;
  }
  const cuda::AttentionFp8Cast fp8{fp8_out, scale, amax,
                                   reinterpret_cast<unsigned long long*>(counts)};
  Check(cuda::AttentionForwardSm90(static_cast<bf16*>(out), stats, static_cast<const bf16*>(qkv), B,
                                   T, C, NH, stream_, &fp8, attention_fwd_),
        "AttentionForwardFp8Cast");
  return true;
}

void CudaBackend::AttentionBackward(void* dqkv, const void* dout, const void* qkv, const void* out,
                                    const float* stats, int B, int T, int C, int NH) {
  if (!Ok()) return;
  ProfileScope profile(this, "AttentionBackward");
  const void* tensors[] = {dqkv, dout, qkv};
  absl::Status shape = CheckAttentionShape(tensors, 3, B, T, C, NH);
  if (!shape.ok()) return Fail(shape);
  Check(cuda::AttentionBackward(static_cast<bf16*>(dqkv), static_cast<const bf16*>(dout),
                                static_cast<const bf16*>(qkv), static_cast<const bf16*>(out), stats,
                                B, T, C, NH, deterministic_, scratch_, stream_,
                                cuda::AttentionKernel::kAuto, attention_dq_),
        "AttentionBackward");
}

void CudaBackend::ResidualForward(void* out, const void* a, const void* b, size_t n) {
  if (!Ok()) return;
  ProfileScope profile(this, "ResidualForward");
  Check(cuda::ResidualForward(static_cast<bf16*>(out), static_cast<const bf16*>(a),
                              static_cast<const bf16*>(b), n, stream_),
        "ResidualForward");
}

void CudaBackend::SoftmaxCrossEntropy(float* losses, void* logits, const int32_t* targets, int N,
                                      int V, int Vp, float dloss) {
  if (!Ok()) return;
  ProfileScope profile(this, "SoftmaxCrossEntropy");
  BOULDER_REQUIRE(Vp % 8 == 0, absl::StrCat("padded vocab ", Vp, " is not a multiple of 8"));
  Check(cuda::SoftmaxCrossEntropy(losses, static_cast<bf16*>(logits), targets, N, V, Vp, dloss,
                                  stream_),
        "SoftmaxCrossEntropy");
}

void CudaBackend::NormSquared(float* out, const void* x, size_t n) {
  if (!Ok()) return;
  ProfileScope profile(this, "NormSquared");
  Check(cuda::NormSquared(out, static_cast<const bf16*>(x), n, scratch_, stream_), "NormSquared");
}

void CudaBackend::NormSquaredBeside(float* out, const void* x, size_t n, bool accumulate) {
  if (!Ok()) return;
  if (profiling_) {
    ProfileScope profile(this, "NormSquared");
    Check(cuda::NormSquared(out, static_cast<const bf16*>(x), n, accumulate, scratch_, stream_),
          "NormSquared");
    return;
  }
  // norm_stream_ waits for stream_'s work so far (each call: x is final only now).
  Check(cudaEventRecord(norm_fork_, stream_), "cudaEventRecord");
  Check(cudaStreamWaitEvent(norm_stream_, norm_fork_, 0), "cudaStreamWaitEvent");
  if (!Ok()) return;
  norm_forked_ = true;
  Check(cuda::NormSquared(out, static_cast<const bf16*>(x), n, accumulate, norm_scratch_,
                          norm_stream_),
        "NormSquared");
}

void CudaBackend::JoinNormSquared() {
  if (!norm_forked_) return;
  norm_forked_ = false;
  Check(cudaEventRecord(norm_join_, norm_stream_), "cudaEventRecord");
  Check(cudaStreamWaitEvent(stream_, norm_join_, 0), "cudaStreamWaitEvent");
}

void CudaBackend::AdamW(void* params, void* master, const void* grads, void* m, void* v,
                        DecayBits decay, size_t n, float lr, float beta1, float beta2, float eps,
                        float weight_decay, int t, float grad_scale, const float* norm_sq,
                        float max_norm) {
  if (!Ok()) return;
  ProfileScope profile(this, "AdamW");
  Check(cuda::AdamW(static_cast<bf16*>(params), MasterOf(master),
                    static_cast<const bf16*>(grads), static_cast<float*>(m), static_cast<float*>(v),
                    decay.bits, decay.offset, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale,
                    norm_sq, max_norm, /*step=*/nullptr, stream_),
        "AdamW");
}

void CudaBackend::SetAdamWStep(float* step, float lr, int t, float beta1, float beta2,
                               bool skip_non_finite) {
  if (!Ok()) return;
  Check(cuda::AdamWStepValues(step, lr, t, beta1, beta2, skip_non_finite, stream_),
        "AdamWStepValues");
}

void CudaBackend::AdamWDeviceStep(void* params, void* master, const void* grads, void* m, void* v,
                                  DecayBits decay, size_t n, const float* step, float beta1,
                                  float beta2, float eps, float weight_decay, float grad_scale,
                                  const float* norm_sq, float max_norm) {
  if (!Ok()) return;
  ProfileScope profile(this, "AdamW");
  Check(cuda::AdamW(static_cast<bf16*>(params), MasterOf(master),
                    static_cast<const bf16*>(grads), static_cast<float*>(m), static_cast<float*>(v),
                    decay.bits, decay.offset, n, /*lr=*/0.f, beta1, beta2, eps, weight_decay,
                    /*t=*/0, grad_scale, norm_sq, max_norm, step, stream_),
        "AdamW");
}

void CudaBackend::Argmax(int32_t* out, const void* logits, int N, int V, int Vp) {
  if (!Ok()) return;
  ProfileScope profile(this, "Argmax");
  Check(cuda::Argmax(out, static_cast<const bf16*>(logits), N, V, Vp, stream_), "Argmax");
}

cudaEvent_t CudaBackend::NewEvent() {
  if (!event_pool_.empty()) {
    cudaEvent_t e = event_pool_.back();
    event_pool_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  Check(cudaEventCreate(&e), "cudaEventCreate");
  return e;
}

CudaBackend::ProfileScope::ProfileScope(CudaBackend* b, std::string name)
    : b_(b), name_(std::move(name)) {
  if (!b_->profiling_) return;
  start_ = b_->NewEvent();
  if (start_) b_->Check(cudaEventRecord(start_, b_->stream_), "cudaEventRecord");
}

CudaBackend::ProfileScope::~ProfileScope() {
  if (!start_) return;
  cudaEvent_t end = b_->NewEvent();
  if (!end) return;
  b_->Check(cudaEventRecord(end, b_->stream_), "cudaEventRecord");
  b_->timed_.push_back({name_, start_, end});
}

std::string CudaBackend::Fp8Settings() const {
  const char* gemm = fp8_gemm_ == Fp8Gemm::kCublasLt ? "cublaslt"
                     : fp8_gemm_ == Fp8Gemm::kSm90   ? "own"
                                                     : "auto";
  return absl::StrCat("FP8 GEMMs ", gemm, " (", common::kEnvFp8Gemm,
                      "), fc2's input cast in fc1's GEMM ", fp8_gemm_gelu_ ? "on" : "off", " (",
                      common::kEnvFp8GemmGelu, "), the projection's in the attention forward ",
                      fp8_attention_cast_ ? "on" : "off", " (", common::kEnvFp8AttentionCast,
                      "); a fused cast runs where its kernel does (Hopper)");
}

std::string CudaBackend::ProfileReport() {
  if (timed_.empty() || !Synchronize().ok()) return "";
  std::vector<std::pair<std::string, std::pair<double, int>>> rows;
  double total = 0;
  for (const Timed& t : timed_) {
    float ms = 0;
    cudaEventElapsedTime(&ms, t.start, t.end);
    total += ms;
    auto it = std::find_if(rows.begin(), rows.end(), [&](const auto& r) { return r.first == t.name; });
    if (it == rows.end()) {
      rows.push_back({t.name, {ms, 1}});
    } else {
      it->second.first += ms;
      it->second.second += 1;
    }
    event_pool_.push_back(t.start);
    event_pool_.push_back(t.end);
  }
  timed_.clear();
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::string out = absl::StrFormat("%-34s %10s %7s %8s\n", "op", "total ms", "share", "calls");
  for (const auto& [name, v] : rows) {
    out += absl::StrFormat("%-34s %10.2f %6.1f%% %8d\n", name, v.first, 100.0 * v.first / total,
                           v.second);
  }
  out += absl::StrFormat("%-34s %10.2f\n", "all ops", total);
  out += absl::StrFormat("GEMM shapes: %d, %d of them autotuned away from the heuristic's pick\n",
                         static_cast<int>(matmul_->cached_plans()), matmul_->retuned_plans());
  out += matmul_->TuningReport();
  if (matmul_->unsupported() > 0) {
    out += absl::StrFormat("fused-epilogue GEMMs run unfused (no cuBLASLt algorithm): %d\n",
                           matmul_->unsupported());
  }
  return out;
}

Scratch::~Scratch() {
  if (ptr_) cudaFree(ptr_);
  for (void* p : retired_) cudaFree(p);
  Count(-static_cast<int64_t>(bytes_ + retired_bytes_));
}

void* Scratch::Get(size_t bytes) {
  if (bytes <= bytes_) return ptr_;
  if (ptr_ && keep_retired_) {
    retired_.push_back(ptr_);
    retired_bytes_ += bytes_;
  } else if (ptr_) {
    cudaFree(ptr_);
    Count(-static_cast<int64_t>(bytes_));
  }
  ptr_ = nullptr;
  bytes_ = 0;
  err_ = cudaMalloc(&ptr_, bytes);
  if (err_ != cudaSuccess) {
    cudaGetLastError();
    ptr_ = nullptr;
    return nullptr;
  }
  bytes_ = bytes;
  Count(static_cast<int64_t>(bytes));
  return ptr_;
}

}  // namespace boulder::kernels::cuda
