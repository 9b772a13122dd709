#include "worker/engine/fp8_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/fp8_recipe.h"

namespace boulder::engine {
namespace {

size_t AlignUp(size_t n) { return (n + 255) / 256 * 256; }  // cudaMalloc alignment

}  // namespace

const char* Fp8LinearName(Fp8Linear t) {
  switch (t) {
    case Fp8Linear::kQkv:
      return "qkv";
    case Fp8Linear::kAttnProj:
      return "attn_proj";
    case Fp8Linear::kFc1:
      return "fc1";
    case Fp8Linear::kFc2:
      return "fc2";
  }
  return "?";
}

const char* Fp8RoleName(Fp8Role r) {
  switch (r) {
    case Fp8Role::kInput:
      return "input";
    case Fp8Role::kWeight:
      return "weight";
    case Fp8Role::kGradOutput:
      return "grad_output";
  }
  return "?";
}

Fp8State::Fp8State(kernels::Backend* backend, const Fp8Options& options, int layers)
    : backend_(backend),
      options_(options),
      layers_(layers),
      n_(layers * kLinears * kRoles),
      elements_(n_, 0) {}

Fp8State::~Fp8State() {
  if (block_ != nullptr) backend_->Free(block_);
}

absl::StatusOr<std::unique_ptr<Fp8State>> Fp8State::Create(kernels::Backend* backend,
                                                           const Fp8Options& options, int layers) {
  if (layers < 1) return absl::InvalidArgumentError(absl::StrCat("fp8: layers ", layers, " < 1"));
  if (options.amax_history_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp8.amax_history_len: must be at least 1, got ", options.amax_history_len));
  }
  if (options.margin < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp8.margin: must be at least 0, got ", options.margin));
  }
  std::unique_ptr<Fp8State> s(new Fp8State(backend, options, layers));
  const size_t n = s->n_, H = options.amax_history_len;
  const size_t vec = AlignUp(n * sizeof(float));
  const size_t inv = AlignUp(n * kScaleInvStride * sizeof(float));
  const size_t hist = AlignUp(n * H * sizeof(float));
  const size_t counts = AlignUp(n * kernels::kFp8CountersPerTensor * sizeof(uint64_t));
  const size_t total = 3 * vec + inv + hist + counts;
  absl::StatusOr<void*> block = backend->Alloc(total);
  if (!block.ok()) return block.status();
  s->block_ = *block;
  s->bytes_ = total;
  char* p = static_cast<char*>(*block);
  s->scale_ = reinterpret_cast<float*>(p);
  s->amax_ = reinterpret_cast<float*>(p + vec);
  s->fp8_max_ = reinterpret_cast<float*>(p + 2 * vec);
  s->scale_inv_ = reinterpret_cast<float*>(p + 3 * vec);
  s->history_ = reinterpret_cast<float*>(p + 3 * vec + inv);
  s->counts_ = reinterpret_cast<uint64_t*>(p + 3 * vec + inv + hist);
  backend->Memset0(*block, total);
  std::vector<float> ones(n, 1.0f), max(n);
  for (int i = 0; i < s->n_; ++i) {
    max[i] = kernels::Fp8Max(s->Format(static_cast<Fp8Role>(i % kRoles)));
  }
  backend->CopyFromHost(s->scale_, ones.data(), n * sizeof(float));
  std::vector<float> inv_ones(n * kScaleInvStride, 0.0f);
  for (size_t i = 0; i < n; ++i) inv_ones[i * kScaleInvStride] = 1.0f;
  backend->CopyFromHost(s->scale_inv_, inv_ones.data(), inv_ones.size() * sizeof(float));
  backend->CopyFromHost(s->fp8_max_, max.data(), n * sizeof(float));
  if (absl::Status st = backend->Synchronize(); !st.ok()) return st;
  return s;
}

void Fp8State::UpdateScales(const float* skip_if_non_finite) {
  backend_->Fp8ScaleUpdate(scale_, scale_inv_, kScaleInvStride, history_, amax_, fp8_max_, n_,
                           options_.amax_history_len, options_.use_history_max, options_.margin,
                           skip_if_non_finite);
}

absl::StatusOr<std::vector<Fp8TensorStat>> Fp8State::ReadStats() {
  const size_t n = n_, H = options_.amax_history_len;
  std::vector<float> scale(n), amax(n), history(n * H);
  std::vector<uint64_t> counts(n * kernels::kFp8CountersPerTensor);
  backend_->CopyToHost(scale.data(), scale_, n * sizeof(float));
  backend_->CopyToHost(amax.data(), amax_, n * sizeof(float));
  backend_->CopyToHost(history.data(), history_, n * H * sizeof(float));
  backend_->CopyToHost(counts.data(), counts_, counts.size() * sizeof(uint64_t));
  if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
  std::vector<Fp8TensorStat> out(n);
  for (int i = 0; i < n_; ++i) {
    Fp8TensorStat& t = out[i];
    t.layer = i / (kLinears * kRoles);
    t.linear = static_cast<Fp8Linear>((i / kRoles) % kLinears);
    t.role = static_cast<Fp8Role>(i % kRoles);
    t.format = Format(t.role);
    t.scale = scale[i];
    const float* h = history.data() + static_cast<size_t>(i) * H;
    // Before UpdateScales the step's amax is still in amax[i] (h[0] is the previous step's).
    t.amax = amax[i] != 0.0f ? amax[i] : h[0];
    t.amax_history_max = kernels::Fp8HistoryMax(h, static_cast<int>(H));
    if (std::isnan(amax[i]) || amax[i] > t.amax_history_max) t.amax_history_max = amax[i];
    const uint64_t* c = counts.data() + static_cast<size_t>(i) * kernels::kFp8CountersPerTensor;
    t.elements = elements_[i];
    t.non_finite = c[kernels::kFp8NonFinite];
    if (t.elements > 0) {
      t.saturated_ratio = static_cast<double>(c[kernels::kFp8Saturated]) / t.elements;
      t.underflow_ratio = static_cast<double>(c[kernels::kFp8Underflow]) / t.elements;
    }
  }
  return out;
}

void Fp8State::ResetStep(bool discard_amax) {
  backend_->Memset0(counts_,
                    static_cast<size_t>(n_) * kernels::kFp8CountersPerTensor * sizeof(uint64_t));
  if (discard_amax) backend_->Memset0(amax_, static_cast<size_t>(n_) * sizeof(float));
  std::fill(elements_.begin(), elements_.end(), 0);
}

namespace {

// "fp8_scaling" section layout (little-endian): magic, u32 version, u32 tensors, u32 history
// length, u32 format (1 hybrid, 0 e4m3), then f32 scale[n], scale_inv[n], history[n * H].
constexpr char kScalingMagic[8] = {'B', 'F', 'P', '8', 'S', 'C', 'A', 'L'};
constexpr uint32_t kScalingVersion = 1;
constexpr size_t kScalingHeader = sizeof(kScalingMagic) + 4 * sizeof(uint32_t);

const char* FormatName(bool hybrid) { return hybrid ? "hybrid" : "e4m3"; }

}  // namespace

absl::StatusOr<std::string> Fp8State::SaveScaling() {
  const size_t n = n_, H = options_.amax_history_len;
  std::string out(kScalingHeader + (2 * n + n * H) * sizeof(float), '\0');
  char* p = out.data();
  std::memcpy(p, kScalingMagic, sizeof(kScalingMagic));
  const uint32_t header[4] = {kScalingVersion, static_cast<uint32_t>(n), static_cast<uint32_t>(H),
                              options_.hybrid ? 1u : 0u};
  std::memcpy(p + sizeof(kScalingMagic), header, sizeof(header));
  p += kScalingHeader;
  backend_->CopyToHost(p, scale_, n * sizeof(float));
  // One copy per scale_inv: their slots need not be contiguous (see scale_inv()).
  for (int i = 0; i < n_; ++i) {
    backend_->CopyToHost(p + (n + i) * sizeof(float), scale_inv(i), sizeof(float));
  }
  backend_->CopyToHost(p + 2 * n * sizeof(float), history_, n * H * sizeof(float));
  if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
  return out;
}

absl::Status Fp8State::RestoreScaling(absl::string_view bytes) {
  if (bytes.size() < kScalingHeader ||
      std::memcmp(bytes.data(), kScalingMagic, sizeof(kScalingMagic)) != 0) {
    return absl::DataLossError(
        absl::StrCat("fp8_scaling: not an FP8 scaling state (", bytes.size(), " bytes)"));
  }
  uint32_t header[4];
  std::memcpy(header, bytes.data() + sizeof(kScalingMagic), sizeof(header));
  if (header[0] != kScalingVersion) {
    return absl::DataLossError(
        absl::StrCat("fp8_scaling: version ", header[0], ", this build reads ", kScalingVersion));
  }
  const size_t n = n_, H = options_.amax_history_len;
  if (header[1] != n) {
    return absl::FailedPreconditionError(
        absl::StrCat("fp8_scaling: written for ", header[1], " FP8 tensors, this model has ", n));
  }
  if (header[2] != H) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fp8_scaling: written with fp8.amax_history_len ", header[2], ", this job has ", H));
  }
  if ((header[3] != 0) != options_.hybrid) {
    return absl::FailedPreconditionError(absl::StrCat("fp8_scaling: written with fp8.format ",
                                                      FormatName(header[3] != 0), ", this job has ",
                                                      FormatName(options_.hybrid)));
  }
  const size_t want = kScalingHeader + (2 * n + n * H) * sizeof(float);
  if (bytes.size() != want) {
    return absl::DataLossError(
        absl::StrCat("fp8_scaling: ", bytes.size(), " bytes, expected ", want));
  }
  const char* p = bytes.data() + kScalingHeader;
  backend_->CopyFromHost(scale_, p, n * sizeof(float));
  for (int i = 0; i < n_; ++i) {
    backend_->CopyFromHost(scale_inv(i), p + (n + i) * sizeof(float), sizeof(float));
  }
  backend_->CopyFromHost(history_, p + 2 * n * sizeof(float), n * H * sizeof(float));
  backend_->Memset0(amax_, n * sizeof(float));
  ResetStep(/*discard_amax=*/true);
  return backend_->Synchronize();
}

std::string Fp8State::FirstNonFinite(const std::vector<Fp8TensorStat>& stats) {
  auto bad = [](const Fp8TensorStat& t) { return t.non_finite > 0 || !std::isfinite(t.amax); };
  auto name = [](const Fp8TensorStat& t) {
    return absl::StrCat("layer ", t.layer, " ", Fp8LinearName(t.linear), " ", Fp8RoleName(t.role));
  };
  // The forward casts inputs and weights layer by layer; the backward casts gradients from
  // the last layer's fc2 back to the first layer's qkv.
  for (const Fp8TensorStat& t : stats) {
    if (t.role != Fp8Role::kGradOutput && bad(t)) return name(t);
  }
  for (auto it = stats.rbegin(); it != stats.rend(); ++it) {
    if (it->role == Fp8Role::kGradOutput && bad(*it)) return name(*it);
  }
  return "";
}

}  // namespace boulder::engine
