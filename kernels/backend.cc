#include "kernels/backend.h"

#include <algorithm>

#include "kernels/fp8_recipe.h"

namespace boulder::kernels {

uint64_t ChecksumHost(const void* data, size_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t sum = 0;
  const size_t words = (bytes + 3) / 4;
  for (size_t i = 0; i < words; ++i) {
    uint32_t w = 0;
    const size_t n = std::min<size_t>(4, bytes - 4 * i);
    for (size_t k = 0; k < n; ++k) w |= static_cast<uint32_t>(p[4 * i + k]) << (8 * k);
    sum += ChecksumTerm(w, i);
  }
  return sum;
}

absl::StatusOr<uint64_t> Backend::Checksum(const void* data, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  CopyToHost(host.data(), data, bytes);
  if (absl::Status s = Synchronize(); !s.ok()) return s;
  return ChecksumHost(host.data(), bytes);
}

void Backend::CastFp8Batch(const std::vector<Fp8CastJob>& jobs, Fp8Format format) {
  for (const Fp8CastJob& j : jobs) {
    CastFp8(j.out, j.out_t, j.inp, j.rows, j.cols, format, j.scale, j.amax, j.counts);
  }
}

void Backend::CastFp8Grad(uint8_t* out, uint8_t* out_t, void* dout, const void* pre, void* dbias,
                          int rows, int cols, Fp8Format format, const float* scale, float* amax,
                          uint64_t* counts) {
  const size_t n = static_cast<size_t>(rows) * cols;
  if (pre != nullptr) GeluBackward(dout, pre, n);
  if (dbias != nullptr) BiasBackward(dbias, dout, rows, cols);
  CastFp8(out, out_t, dout, rows, cols, format, scale, amax, counts);
}

void Backend::GeluCastFp8(uint8_t* out, uint8_t* out_t, void* scratch, const void* pre, int rows,
                          int cols, Fp8Format format, const float* scale, float* amax,
                          uint64_t* counts) {
  GeluForward(scratch, pre, static_cast<size_t>(rows) * cols);
  CastFp8(out, out_t, scratch, rows, cols, format, scale, amax, counts);
}

void Backend::ResidualLayerNormFp8Forward(void* residual, void* out, float* mean, float* rstd,
                                          const void* a, const void* b, const void* weight,
                                          const void* bias, int N, int C, uint8_t* fp8_out,
                                          uint8_t* fp8_out_t, Fp8Format format, const float* scale,
                                          float* amax, uint64_t* counts) {
  if (residual != nullptr) {
    ResidualLayerNormForward(residual, out, mean, rstd, a, b, weight, bias, N, C);
  } else {
    LayerNormForward(out, mean, rstd, a, weight, bias, N, C);
  }
  CastFp8(fp8_out, fp8_out_t, out, N, C, format, scale, amax, counts);
}

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kBF16:
      return 2;
  }
  return 0;
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "fp32";
    case DType::kF64:
      return "fp64";
    case DType::kBF16:
      return "bf16";
  }
  return "unknown";
}

void Backend::ResidualLayerNormForward(void* residual, void* out, float* mean, float* rstd,
                                       const void* a, const void* b, const void* weight,
                                       const void* bias, int N, int C) {
  ResidualForward(residual, a, b, static_cast<size_t>(N) * C);
  LayerNormForward(out, mean, rstd, residual, weight, bias, N, C);
}

void Backend::Memset0Ranges(void* base, const std::vector<ByteRange>& ranges) {
  for (const ByteRange& r : ranges) Memset0(static_cast<char*>(base) + r.offset, r.bytes);
}

void Backend::MatmulBackwardGelu(void* dpre, void* dpre_bias, const void* pre, void* dweight,
                                 void* dbias, void* dout, const void* inp, const void* weight,
                                 int N, int C, int OC) {
  MatmulBackward(dpre, dweight, dbias, dout, nullptr, inp, weight, N, C, OC);
  GeluBackward(dpre, pre, static_cast<size_t>(N) * C);
  if (dpre_bias != nullptr) BiasBackward(dpre_bias, dpre, N, C);
}

void Backend::GeluCastFp8AndGrad(uint8_t* in_t, Fp8Format in_format, const float* in_scale,
                                 float* in_amax, uint64_t* in_counts, uint8_t* g_out,
                                 uint8_t* g_out_t, void* dout, const void* pre, void* dbias,
                                 int rows, int cols, Fp8Format g_format, const float* g_scale,
                                 float* g_amax, uint64_t* g_counts, void* scratch) {
  GeluCastFp8(nullptr, in_t, scratch, pre, rows, cols, in_format, in_scale, in_amax, in_counts);
  CastFp8Grad(g_out, g_out_t, dout, pre, dbias, rows, cols, g_format, g_scale, g_amax, g_counts);
}

const char* Fp8FormatName(Fp8Format f) { return f == Fp8Format::kE4M3 ? "e4m3" : "e5m2"; }

float Fp8Max(Fp8Format f) { return f == Fp8Format::kE4M3 ? kFp8E4M3Max : kFp8E5M2Max; }

std::vector<uint8_t> PackDecayBits(const std::vector<uint8_t>& mask) {
  std::vector<uint8_t> bits((mask.size() + 7) / 8, 0);
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i] != 0) bits[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
  }
  return bits;
}

}  // namespace boulder::kernels
