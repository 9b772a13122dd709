// Job-spec defaults and validation: ResolveJobSpec and what depends on a resolved spec.
// Every default lives in FillDefaults and every check in Validate*, so the documented
// defaults (spec.h, examples/) have one place to change.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "common/spec.h"
#include "common/spec_checkpoint.h"
#include "common/spec_cuda_graph.h"
#include "common/spec_path.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace boulder::common {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

struct ModelPreset {
  const char* name;
  int32_t vocab_size, hidden, heads, layers, ffn, context;
  bool tie_embeddings;
};

// The seed model of DESIGN.md, and GPT-2 small (124M).
constexpr ModelPreset kPresets[] = {
    {"minigpt", 96, 768, 12, 4, 3072, 256, false},
    {"gpt2", 50257, 768, 12, 12, 3072, 1024, true},
};

constexpr char kDefaultPreset[] = "minigpt";
constexpr char kArithmetic[] = "arithmetic";
constexpr char kTokenFiles[] = "token_files";
constexpr int32_t kMaxSteps = 1000000000;
constexpr size_t kMaxNameBytes = 128;
// Parameters, gradients and two AdamW moments, 4 bytes each.
constexpr double kStateBytesPerParameter = 16;
constexpr double kMaxStateBytes = 1099511627776.0;  // 1 TiB

constexpr absl::string_view kPrecisions[] = {"auto", "fp32", "bf16", "fp8"};
constexpr absl::string_view kBackends[] = {"auto", "cpu", "cuda"};
constexpr absl::string_view kSchedules[] = {"constant", "cosine", "linear"};
constexpr absl::string_view kSources[] = {"arithmetic", "token_files"};
constexpr absl::string_view kCheckpointing[] = {"none", "gelu", "mlp", "full"};
constexpr absl::string_view kFp8Formats[] = {"hybrid", "e4m3"};
constexpr absl::string_view kAmaxAlgos[] = {"max", "most_recent"};
// cuBLASLt's FP8 GEMMs need every dimension to be a multiple of 16.
constexpr int kFp8GemmMultiple = 16;

absl::Status Invalid(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

absl::Status CheckRange(absl::string_view path, int64_t value, int64_t min, int64_t max) {
  if (value < min) return Invalid(path, absl::StrCat("must be at least ", min, ", got ", value));
  if (value > max) return Invalid(path, absl::StrCat("must be at most ", max, ", got ", value));
  return absl::OkStatus();
}

absl::Status CheckOneOf(absl::string_view path, const std::string& value, absl::string_view what,
                        absl::Span<const absl::string_view> allowed) {
  if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return absl::OkStatus();
  return Invalid(path, absl::StrCat("unknown ", what, " '", value, "' (one of ",
                                    absl::StrJoin(allowed, ", "), ")"));
}

// Doubles arriving over gRPC skip the parser's finiteness check.
absl::Status CheckFinite(const Message& message, const std::string& path) {
  const Descriptor* descriptor = message.GetDescriptor();
  const Reflection* reflection = message.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    if (field->is_repeated() || !reflection->HasField(message, field)) continue;
    const std::string field_path = path.empty() ? field->name() : path + "." + field->name();
    double value = 0;
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE: {
        absl::Status status = CheckFinite(reflection->GetMessage(message, field), field_path);
        if (!status.ok()) return status;
        continue;
      }
      case FieldDescriptor::CPPTYPE_DOUBLE:
        value = reflection->GetDouble(message, field);
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        value = reflection->GetFloat(message, field);
        break;
      default:
        continue;
    }
    if (!std::isfinite(value)) {
      return Invalid(field_path, absl::StrCat("must be a finite number, got ", value));
    }
  }
  return absl::OkStatus();
}

// "3.2e12": the one significant decimal a size estimate deserves.
std::string Scientific(double value) {
  int exponent = static_cast<int>(std::floor(std::log10(value)));
  double mantissa = value / std::pow(10.0, exponent);
  if (std::round(mantissa * 10) >= 100) {
    mantissa /= 10;
    ++exponent;
  }
  return absl::StrFormat("%.1fe%d", mantissa, exponent);
}

// Parameters of the pre-LN GPT the engine builds (before any vocabulary padding).
double ParameterCount(const v1::ModelSpec& m) {
  const double v = m.vocab_size(), h = m.hidden(), f = m.ffn(), c = m.context();
  const double per_layer = 2 * h                     // ln1
                           + 3 * h * h + 3 * h       // qkv
                           + h * h + h               // attention projection
                           + 2 * h                   // ln2
                           + h * f + f + f * h + h;  // MLP
  return v * h + c * h + m.layers() * per_layer + 2 * h + (m.tie_embeddings() ? 0 : v * h);
}

absl::Status ExpandPreset(v1::ModelSpec* model) {
  if (!model->has_preset()) model->set_preset(kDefaultPreset);
  const ModelPreset* preset = nullptr;
  std::vector<absl::string_view> names;
  for (const ModelPreset& p : kPresets) {
    names.push_back(p.name);
    if (model->preset() == p.name) preset = &p;
  }
  if (preset == nullptr) return CheckOneOf("model.preset", model->preset(), "preset", names);
  if (!model->has_vocab_size()) model->set_vocab_size(preset->vocab_size);
  if (!model->has_hidden()) model->set_hidden(preset->hidden);
  if (!model->has_heads()) model->set_heads(preset->heads);
  if (!model->has_layers()) model->set_layers(preset->layers);
  if (!model->has_ffn()) model->set_ffn(preset->ffn);
  if (!model->has_context()) model->set_context(preset->context);
  if (!model->has_tie_embeddings()) model->set_tie_embeddings(preset->tie_embeddings);
  return absl::OkStatus();
}

// Everything but the model, whose preset ExpandPreset has applied already.
void FillDefaults(v1::JobSpec* spec) {
  if (spec->name().empty()) spec->set_name(spec->model().preset());

  v1::DataSpec* data = spec->mutable_data();
  if (!data->has_source()) data->set_source(kArithmetic);
  if (!data->has_max_stride()) data->set_max_stride(6);
  if (!data->has_token_files()) data->set_token_files("");
  if (!spec->model().has_init_from()) spec->mutable_model()->set_init_from("");

  v1::TrainingSpec* t = spec->mutable_training();
  if (!t->has_steps()) t->set_steps(200);
  if (!t->has_batch_size()) t->set_batch_size(32);
  if (!t->has_seq_len()) t->set_seq_len(spec->model().context());
  if (!t->has_lr()) t->set_lr(3e-4);
  if (!t->has_beta1()) t->set_beta1(0.9);
  if (!t->has_beta2()) t->set_beta2(0.95);
  if (!t->has_eps()) t->set_eps(1e-8);
  if (!t->has_weight_decay()) t->set_weight_decay(0.0);
  if (!t->has_warmup_steps()) t->set_warmup_steps(0);
  if (!t->has_schedule()) t->set_schedule("constant");
  if (!t->has_min_lr_ratio()) t->set_min_lr_ratio(0.0);
  if (!t->has_grad_accum_steps()) t->set_grad_accum_steps(1);
  if (!t->has_grad_clip()) t->set_grad_clip(1.0);
  if (!t->has_seed()) t->set_seed(1337);
  if (!t->has_deterministic()) t->set_deterministic(false);
  if (!t->has_log_every_steps()) t->set_log_every_steps(1);
  if (!t->has_freeze_embeddings()) t->set_freeze_embeddings(false);
  if (!t->has_activation_checkpointing()) t->set_activation_checkpointing("none");

  v1::EvalSpec* eval = spec->mutable_eval();
  if (!eval->has_token_files()) eval->set_token_files("");
  if (!eval->has_every_steps()) eval->set_every_steps(50);
  if (!eval->has_batches()) eval->set_batches(8);

  if (!spec->has_precision()) spec->set_precision("auto");

  v1::ResourcesSpec* resources = spec->mutable_resources();
  if (!resources->has_workers()) resources->set_workers(1);
  if (!resources->has_backend()) resources->set_backend("auto");
  if (!resources->has_collective_timeout_seconds()) resources->set_collective_timeout_seconds(60);
  if (!resources->has_checksum_every_steps()) resources->set_checksum_every_steps(10);

  v1::GenerationSpec* generation = spec->mutable_generation();
  if (!generation->has_prompt_len()) generation->set_prompt_len(8);
  if (!generation->has_tokens()) generation->set_tokens(16);

  v1::Fp8Spec* fp8 = spec->mutable_fp8();
  if (!fp8->has_format()) fp8->set_format("hybrid");
  if (!fp8->has_amax_history_len()) fp8->set_amax_history_len(16);
  if (!fp8->has_amax_compute_algo()) fp8->set_amax_compute_algo("max");
  if (!fp8->has_margin()) fp8->set_margin(0);
  if (!fp8->has_emulate()) fp8->set_emulate(false);
  if (!fp8->has_max_consecutive_skips()) fp8->set_max_consecutive_skips(10);
}

absl::Status ValidateName(const std::string& name) {
  if (name.size() > kMaxNameBytes) {
    return Invalid("name", absl::StrCat(name.size(), " bytes is longer than ", kMaxNameBytes));
  }
  for (unsigned char c : name) {
    if (c < 0x20 || c == 0x7f) return Invalid("name", "must not contain control characters");
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const v1::ModelSpec& m) {
  absl::Status status = CheckRange("model.vocab_size", m.vocab_size(), 2, 1 << 20);
  if (status.ok()) status = CheckRange("model.hidden", m.hidden(), 1, 65536);
  if (status.ok()) status = CheckRange("model.heads", m.heads(), 1, m.hidden());
  if (status.ok() && m.hidden() % m.heads() != 0) {
    status =
        Invalid("model.heads", absl::StrCat(m.heads(), " does not divide hidden ", m.hidden()));
  }
  if (status.ok()) status = CheckRange("model.layers", m.layers(), 1, 1024);
  if (status.ok()) status = CheckRange("model.ffn", m.ffn(), 1, 1 << 18);
  if (status.ok()) status = CheckRange("model.context", m.context(), 1, 1 << 17);
  if (!status.ok()) return status;
  const double parameters = ParameterCount(m);
  const double bytes = parameters * kStateBytesPerParameter;
  if (bytes > kMaxStateBytes) {
    const double terabytes = bytes / 1e12;
    return Invalid("model", absl::StrCat(Scientific(parameters), " parameters need ",
                                         terabytes >= 10 ? absl::StrFormat("%.0f", terabytes)
                                                         : absl::StrFormat("%.1f", terabytes),
                                         " TB of parameter and optimizer state (at most 1 TiB)"));
  }
  return absl::OkStatus();
}

// A file path of the spec (data and eval shards, initial weights): unset ("") or a path that
// passes common/spec_path.h (no "..", "~", control characters or backslashes; absolute paths
// allowed: shared mounts are named that way).
absl::Status CheckPath(absl::string_view path, const std::string& value) {
  if (value.empty()) return absl::OkStatus();
  common::SpecPathPolicy policy;
  policy.allow_absolute = true;
  policy.root_name = "the worker's directory";
  return common::ValidateSpecPath(path, value, policy);
}

absl::Status ValidateData(const v1::DataSpec& data, const v1::ModelSpec& model) {
  absl::Status status = CheckOneOf("data.source", data.source(), "source", kSources);
  if (status.ok()) status = CheckPath("data.token_files", data.token_files());
  if (status.ok()) status = CheckPath("model.init_from", model.init_from());
  if (!status.ok()) return status;
  if (data.source() == kTokenFiles) {
    if (data.token_files().empty()) {
      return Invalid("data.token_files",
                     "must name .bin shards (a glob) when data.source is token_files");
    }
    return absl::OkStatus();
  }
  if (!data.token_files().empty()) {
    return Invalid("data.token_files", absl::StrCat("is set but data.source is '", data.source(),
                                                    "' (set data.source: token_files)"));
  }
  return CheckRange("data.max_stride", data.max_stride(), 1, model.vocab_size() - 1);
}

absl::Status ValidateEval(const v1::EvalSpec& eval) {
  absl::Status status = CheckPath("eval.token_files", eval.token_files());
  if (status.ok()) status = CheckRange("eval.every_steps", eval.every_steps(), 1, kMaxSteps);
  if (status.ok()) status = CheckRange("eval.batches", eval.batches(), 1, 100000);
  return status;
}

absl::Status ValidateFreezing(const v1::TrainingSpec& t, const v1::ModelSpec& model) {
  std::vector<bool> seen(model.layers(), false);
  for (int i = 0; i < t.freeze_layers_size(); ++i) {
    const int32_t layer = t.freeze_layers(i);
    const std::string path = absl::StrCat("training.freeze_layers[", i, "]");
    if (layer < 0 || layer >= model.layers()) {
      return Invalid(
          path, absl::StrCat("layer ", layer, " is not in [0, model.layers ", model.layers(), ")"));
    }
    if (seen[layer]) return Invalid(path, absl::StrCat("layer ", layer, " is listed twice"));
    seen[layer] = true;
  }
  return CheckOneOf("training.activation_checkpointing", t.activation_checkpointing(),
                    "activation_checkpointing mode", kCheckpointing);
}

absl::Status CheckDouble(absl::string_view path, double value, double min, bool min_inclusive,
                         double max, bool max_inclusive) {
  const bool above_min = min_inclusive ? value >= min : value > min;
  const bool below_max = max_inclusive ? value <= max : value < max;
  if (above_min && below_max) return absl::OkStatus();
  std::string range;
  if (std::isinf(max)) {
    range = absl::StrCat(min_inclusive ? "at least " : "greater than ", min);
  } else {
    range =
        absl::StrCat("in ", min_inclusive ? "[" : "(", min, ", ", max, max_inclusive ? "]" : ")");
  }
  return Invalid(path, absl::StrCat("must be ", range, ", got ", value));
}

absl::Status ValidateTraining(const v1::TrainingSpec& t, const v1::ModelSpec& model) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  absl::Status status = CheckRange("training.steps", t.steps(), 1, kMaxSteps);
  if (status.ok()) status = CheckRange("training.batch_size", t.batch_size(), 1, 1 << 16);
  if (status.ok() && t.seq_len() < 1) {
    status = Invalid("training.seq_len", absl::StrCat("must be at least 1, got ", t.seq_len()));
  }
  if (status.ok() && t.seq_len() > model.context()) {
    status = Invalid("training.seq_len",
                     absl::StrCat(t.seq_len(), " is longer than model.context ", model.context()));
  }
  if (status.ok()) status = CheckDouble("training.lr", t.lr(), 0, false, kInf, false);
  if (status.ok()) status = CheckDouble("training.beta1", t.beta1(), 0, true, 1, false);
  if (status.ok()) status = CheckDouble("training.beta2", t.beta2(), 0, true, 1, false);
  if (status.ok()) status = CheckDouble("training.eps", t.eps(), 0, false, kInf, false);
  if (status.ok()) {
    status = CheckDouble("training.weight_decay", t.weight_decay(), 0, true, kInf, false);
  }
  if (status.ok()) status = CheckRange("training.warmup_steps", t.warmup_steps(), 0, kMaxSteps);
  if (status.ok() && t.warmup_steps() > t.steps()) {
    status = Invalid("training.warmup_steps",
                     absl::StrCat(t.warmup_steps(), " is more than training.steps ", t.steps()));
  }
  if (status.ok()) status = CheckOneOf("training.schedule", t.schedule(), "schedule", kSchedules);
  if (status.ok()) {
    status = CheckDouble("training.min_lr_ratio", t.min_lr_ratio(), 0, true, 1, true);
  }
  if (status.ok()) {
    status = CheckRange("training.grad_accum_steps", t.grad_accum_steps(), 1, 4096);
  }
  if (status.ok()) status = CheckDouble("training.grad_clip", t.grad_clip(), 0, true, kInf, false);
  if (status.ok()) {
    status = CheckRange("training.log_every_steps", t.log_every_steps(), 1, kMaxSteps);
  }
  return status;
}

absl::Status ValidateResources(const v1::ResourcesSpec& resources) {
  if (resources.workers() < 1) {
    return Invalid("resources.workers",
                   absl::StrCat("must be at least 1, got ", resources.workers()));
  }
  absl::Status status = CheckRange("resources.workers", resources.workers(), 1, 1024);
  if (status.ok()) {
    status = CheckDouble("resources.collective_timeout_seconds",
                         resources.collective_timeout_seconds(), 0, false, 3600, true);
  }
  if (status.ok()) {
    status = CheckRange("resources.checksum_every_steps", resources.checksum_every_steps(), 0,
                        kMaxSteps);
  }
  if (!status.ok()) return status;
  return CheckOneOf("resources.backend", resources.backend(), "backend", kBackends);
}

absl::Status ValidateFp8(const v1::JobSpec& spec) {
  const v1::Fp8Spec& f = spec.fp8();
  absl::Status status = CheckOneOf("fp8.format", f.format(), "fp8 format", kFp8Formats);
  if (status.ok()) status = CheckRange("fp8.amax_history_len", f.amax_history_len(), 1, 1024);
  if (status.ok()) {
    status =
        CheckOneOf("fp8.amax_compute_algo", f.amax_compute_algo(), "amax algorithm", kAmaxAlgos);
  }
  if (status.ok()) status = CheckRange("fp8.margin", f.margin(), 0, 32);
  if (status.ok()) {
    status = CheckRange("fp8.max_consecutive_skips", f.max_consecutive_skips(), 1, 1000000);
  }
  if (!status.ok() || spec.precision() != "fp8") return status;
  const std::string& backend = spec.resources().backend();
  if (f.emulate()) {
    if (backend == "cuda") {
      return Invalid("fp8.emulate",
                     "true trains on the cpu backend (FP8 rounding emulated), but "
                     "resources.backend is cuda (set fp8.emulate: false for FP8 on the GPU)");
    }
    return absl::OkStatus();
  }
  if (backend == "cpu") {
    return Invalid("precision",
                   "fp8 on resources.backend cpu needs fp8.emulate: true (real FP8 needs a GPU "
                   "of compute capability 8.9 or higher)");
  }
  // The FP8 GEMMs' M, N and K: hidden, 3*hidden, ffn and the batch's token rows.
  const v1::ModelSpec& m = spec.model();
  if (m.hidden() % kFp8GemmMultiple != 0) {
    return Invalid("model.hidden", absl::StrCat(m.hidden(), " is not a multiple of ",
                                                kFp8GemmMultiple, " (needed by FP8 GEMMs)"));
  }
  if (m.ffn() % kFp8GemmMultiple != 0) {
    return Invalid("model.ffn", absl::StrCat(m.ffn(), " is not a multiple of ", kFp8GemmMultiple,
                                             " (needed by FP8 GEMMs)"));
  }
  const int64_t rows =
      static_cast<int64_t>(spec.training().batch_size()) * spec.training().seq_len();
  if (rows % kFp8GemmMultiple != 0) {
    return Invalid("training.batch_size",
                   absl::StrCat("batch_size x seq_len = ", rows, " is not a multiple of ",
                                kFp8GemmMultiple, " (needed by FP8 GEMMs)"));
  }
  return absl::OkStatus();
}

absl::Status ValidatePrecision(const std::string& precision, const std::string& backend) {
  absl::Status status = CheckOneOf("precision", precision, "precision", kPrecisions);
  if (!status.ok()) return status;
  if (precision == "bf16" && backend == "cpu") {
    return Invalid("precision",
                   "bf16 needs resources.backend cuda (the cpu backend trains in fp32)");
  }
  return absl::OkStatus();
}

absl::Status ValidateGeneration(const v1::GenerationSpec& g, const v1::ModelSpec& model) {
  absl::Status status = CheckRange("generation.prompt_len", g.prompt_len(), 1, model.context());
  if (status.ok()) status = CheckRange("generation.tokens", g.tokens(), 0, model.context());
  if (status.ok() && g.prompt_len() + g.tokens() > model.context()) {
    status = Invalid("generation.tokens",
                     absl::StrCat("prompt_len ", g.prompt_len(), " + tokens ", g.tokens(),
                                  " is longer than model.context ", model.context()));
  }
  return status;
}

}  // namespace

absl::StatusOr<v1::JobSpec> ResolveJobSpec(const v1::JobSpec& spec) {
  v1::JobSpec out = spec;
  absl::Status status = CheckFinite(out, "");
  if (status.ok()) status = ExpandPreset(out.mutable_model());
  if (!status.ok()) return status;
  FillDefaults(&out);
  FillCheckpointDefaults(&out);
  FillCudaGraphDefault(&out);
  status = ValidateName(out.name());
  if (status.ok()) status = ValidateModel(out.model());
  if (status.ok()) status = ValidateData(out.data(), out.model());
  if (status.ok()) status = ValidateTraining(out.training(), out.model());
  if (status.ok()) status = ValidateResources(out.resources());
  if (status.ok()) status = ValidatePrecision(out.precision(), out.resources().backend());
  if (status.ok()) status = ValidateGeneration(out.generation(), out.model());
  if (status.ok()) status = ValidateCheckpoint(out);
  if (status.ok()) status = ValidateEval(out.eval());
  if (status.ok()) status = ValidateFreezing(out.training(), out.model());
  if (status.ok()) status = ValidateFp8(out);
  if (status.ok()) status = ValidateCudaGraph(out);
  if (!status.ok()) return status;
  return out;
}

std::string RequiredBackend(const v1::JobSpec& resolved) {
  const std::string& backend = resolved.resources().backend();
  if (backend == "cpu" || backend == "cuda") return backend;
  if (resolved.precision() == "fp8") return resolved.fp8().emulate() ? "cpu" : "cuda";
  if (resolved.precision() == "bf16") return "cuda";
  return "";
}

absl::StatusOr<std::string> EffectivePrecision(const v1::JobSpec& resolved,
                                               absl::string_view worker_backend) {
  if (worker_backend != "cpu" && worker_backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("worker backend '", worker_backend, "' is neither cpu nor cuda"));
  }
  const std::string required = RequiredBackend(resolved);
  if (!required.empty() && required != worker_backend) {
    return Invalid("resources.backend",
                   absl::StrCat("this job (precision ", resolved.precision(), ", backend ",
                                resolved.resources().backend(), ") needs a ", required,
                                " worker, not ", worker_backend));
  }
  if (resolved.precision() != "auto") return resolved.precision();
  return std::string(worker_backend == "cuda" ? "bf16" : "fp32");
}

}  // namespace boulder::common
