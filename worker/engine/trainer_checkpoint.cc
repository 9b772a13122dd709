#include "worker/engine/trainer_checkpoint.h"

#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/engine/checkpoint.h"
#include "worker/engine/data.h"

namespace boulder::engine {
namespace {

constexpr char kFormat[] = "boulder-trainer-state-1";

// The keys a resumed run must agree on: what shapes the state and the data stream.
std::vector<std::pair<std::string, std::string>> IdentityKeys(const kernels::Backend& backend,
                                                              const Model& model,
                                                              const v1::JobSpec& spec) {
  const v1::ModelSpec& m = spec.model();
  const v1::TrainingSpec& t = spec.training();
  return {
      {"format", kFormat},
      {"num_params", absl::StrCat(model.num_params())},
      {"trainable_params", absl::StrCat(model.num_trainable_params())},
      {"compute_dtype", kernels::DTypeName(backend.compute_dtype())},
      {"state_dtype", kernels::DTypeName(backend.state_dtype())},
      {"model", absl::StrCat("vocab ", m.vocab_size(), " hidden ", m.hidden(), " heads ", m.heads(),
                             " layers ", m.layers(), " ffn ", m.ffn(), " context ", m.context(),
                             " tied ", m.tie_embeddings() ? 1 : 0)},
      {"batch", absl::StrCat(t.batch_size(), " x ", t.seq_len(), " x ", t.grad_accum_steps())},
      {"data", absl::StrCat(spec.data().source(), " max_stride ", spec.data().max_stride(),
                            " token_files ", spec.data().token_files())},
      {"seed", absl::StrCat(t.seed())},
  };
}

std::string ToText(const std::vector<std::pair<std::string, std::string>>& kv) {
  std::string out;
  for (const auto& [k, v] : kv) absl::StrAppend(&out, k, "=", v, "\n");
  return out;
}

std::map<std::string, std::string> FromText(const std::string& text) {
  std::map<std::string, std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) continue;
    out[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
  return out;
}

std::vector<char> ToHost(kernels::Backend& backend, const void* device, size_t bytes) {
  std::vector<char> host(bytes);
  backend.CopyToHost(host.data(), device, bytes);
  return host;
}

}  // namespace

absl::Status SaveTrainerCheckpoint(kernels::Backend& backend, const Model& model,
                                   const v1::JobSpec& spec, const std::string& dir,
                                   const TrainerProgress& progress, int keep_last) {
  const int64_t step = progress.step;
  const size_t pbytes = model.num_params() * kernels::DTypeSize(backend.compute_dtype());
  const size_t sbytes = model.num_trainable_params() * kernels::DTypeSize(backend.state_dtype());
  auto meta_kv = IdentityKeys(backend, model, spec);
  meta_kv.emplace_back("step", absl::StrCat(step));
  meta_kv.emplace_back("tokens_processed", absl::StrCat(progress.tokens_processed));
  meta_kv.emplace_back("optimizer_steps", absl::StrCat(progress.optimizer_steps));
  std::string fp8_scaling;
  if (Fp8State* fp8 = model.fp8_state(); fp8 != nullptr) {
    meta_kv.emplace_back("fp8_skipped_steps", absl::StrCat(progress.fp8_skipped_steps));
    meta_kv.emplace_back("fp8_consecutive_skips", absl::StrCat(progress.fp8_consecutive_skips));
    meta_kv.emplace_back("fp8_first_overflow", progress.fp8_first_overflow);
    absl::StatusOr<std::string> saved = fp8->SaveScaling();
    if (!saved.ok()) return saved.status();
    fp8_scaling = *std::move(saved);
  }
  const std::string meta = ToText(meta_kv);
  const std::string data =
      ToText({{"source", spec.data().source()}, {"next_step", absl::StrCat(step + 1)}});
  const std::string rng =
      ToText({{"kind", "counter-based (SplitMix64/xoshiro256** keyed by seed, rank, step)"},
              {"init_seed", absl::StrCat(spec.training().seed())},
              {"data_seed", absl::StrCat(spec.training().seed())},
              {"prompt_stream", absl::StrCat(ArithmeticData::kPromptStream)}});
  // The device is synchronised by the copies (CopyToHost is blocking).
  const std::vector<char> params = ToHost(backend, model.params(), pbytes);
  const std::vector<char> m = ToHost(backend, model.adam_m(), sbytes);
  const std::vector<char> v = ToHost(backend, model.adam_v(), sbytes);
  // The master weights as FP32 values whatever the backend's layout (split ones joined), so a
  // checkpoint reads the same on any build.
  std::vector<float> master;
  if (model.master() != nullptr) {
    absl::StatusOr<std::vector<float>> read = model.ReadMasterF32();
    if (!read.ok()) return read.status();
    master = *std::move(read);
    if (master.size() * sizeof(float) != sbytes) {
      return absl::InternalError(absl::StrCat("master weights: ", master.size() * sizeof(float),
                                              " bytes, expected ", sbytes));
    }
  }

  std::vector<CheckpointSectionRef> sections = {
      {"meta", meta.data(), meta.size()},
      {"params", params.data(), params.size()},
  };
  if (model.master() != nullptr) {
    sections.push_back(
        {"master", reinterpret_cast<const char*>(master.data()), master.size() * sizeof(float)});
  }
  sections.push_back({"adam_m", m.data(), m.size()});
  sections.push_back({"adam_v", v.data(), v.size()});
  sections.push_back({"data", data.data(), data.size()});
  sections.push_back({"rng", rng.data(), rng.size()});
  if (!fp8_scaling.empty()) {
    sections.push_back({"fp8_scaling", fp8_scaling.data(), fp8_scaling.size()});
  }
  return SaveCheckpoint(dir, step, sections, keep_last);
}

absl::StatusOr<std::optional<ResumePoint>> RestoreTrainerCheckpoint(
    kernels::Backend& backend, Model& model, const v1::JobSpec& spec, const std::string& dir,
    const std::function<void(absl::string_view)>& on_warning) {
  std::string path;
  auto loaded = LoadLatestCheckpoint(
      dir,
      [&](const std::string& file, const absl::Status& why) {
        if (on_warning) {
          on_warning(absl::StrCat("checkpoint ", file, " is corrupt (", why.message(),
                                  "); skipped, trying an older one"));
        }
      },
      &path);
  if (!loaded.ok()) return loaded.status();
  if (!loaded->has_value()) return std::optional<ResumePoint>();
  const CheckpointData& ckpt = **loaded;
  auto fail = [&](absl::string_view what) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", path, ": ", what));
  };
  const std::string* meta_text = ckpt.Find("meta");
  if (meta_text == nullptr) return fail("no meta section");
  const std::map<std::string, std::string> meta = FromText(*meta_text);
  for (const auto& [key, want] : IdentityKeys(backend, model, spec)) {
    auto it = meta.find(key);
    const std::string have = it == meta.end() ? "(missing)" : it->second;
    if (have != want) {
      return fail(absl::StrCat("written for ", key, " ", have, ", this job has ", want,
                               " (another job's directory? set checkpoint.dir)"));
    }
  }
  ResumePoint point;
  point.path = path;
  auto number = [&](const char* key, int64_t* out) {
    auto it = meta.find(key);
    return it != meta.end() && absl::SimpleAtoi(it->second, out);
  };
  if (!number("step", &point.step) || point.step != ckpt.step) {
    return fail("meta step disagrees with the header");
  }
  if (!number("tokens_processed", &point.tokens_processed)) {
    return fail("meta has no tokens_processed");
  }
  point.optimizer_steps = point.step;
  if (meta.count("optimizer_steps") > 0 && !number("optimizer_steps", &point.optimizer_steps)) {
    return fail("meta optimizer_steps is not a number");
  }
  if (point.step > spec.training().steps()) {
    return fail(
        absl::StrCat("step ", point.step, " is past training.steps ", spec.training().steps()));
  }
  const size_t pbytes = model.num_params() * kernels::DTypeSize(backend.compute_dtype());
  const size_t sbytes = model.num_trainable_params() * kernels::DTypeSize(backend.state_dtype());
  struct Target {
    const char* name;
    void* device;
    size_t bytes;
  };
  std::vector<Target> targets = {{"params", model.params(), pbytes},
                                 {"adam_m", model.adam_m(), sbytes},
                                 {"adam_v", model.adam_v(), sbytes}};
  // The master weights are FP32 values in the file, written through the model (which splits
  // them where the backend keeps them split); not a raw copy.
  if (model.master() != nullptr) targets.push_back({"master", nullptr, sbytes});
  for (const Target& t : targets) {
    const std::string* bytes = ckpt.Find(t.name);
    if (bytes == nullptr) return fail(absl::StrCat("no ", t.name, " section"));
    if (bytes->size() != t.bytes) {
      return fail(
          absl::StrCat("section ", t.name, " has ", bytes->size(), " bytes, expected ", t.bytes));
    }
  }
  Fp8State* fp8 = model.fp8_state();
  const std::string* fp8_scaling = ckpt.Find("fp8_scaling");
  if (fp8 != nullptr && fp8_scaling != nullptr) {
    // Validated (shape, history length, format) before anything is copied into the model.
    if (absl::Status s = fp8->RestoreScaling(*fp8_scaling); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("checkpoint ", path, ": ", s.message()));
    }
    if (meta.count("fp8_skipped_steps") > 0 &&
        (!number("fp8_skipped_steps", &point.fp8_skipped_steps) ||
         !number("fp8_consecutive_skips", &point.fp8_consecutive_skips))) {
      return fail("meta fp8_skipped_steps or fp8_consecutive_skips is not a number");
    }
    if (auto it = meta.find("fp8_first_overflow"); it != meta.end()) {
      point.fp8_first_overflow = it->second;
    }
  } else if (fp8 != nullptr && on_warning) {
    on_warning(absl::StrCat("checkpoint ", path,
                            " has no FP8 scaling state (written by an older build or by a run in "
                            "another precision): the FP8 scales start afresh (1, empty amax "
                            "histories), so this run will not reproduce an uninterrupted one"));
  } else if (fp8_scaling != nullptr && on_warning) {
    on_warning(absl::StrCat("checkpoint ", path,
                            " holds an FP8 scaling state; ignored, precision is ",
                            spec.precision()));
  }
  for (const Target& t : targets) {
    if (t.device != nullptr) backend.CopyFromHost(t.device, ckpt.Find(t.name)->data(), t.bytes);
  }
  if (absl::Status s = backend.Synchronize(); !s.ok()) return s;
  if (model.master() != nullptr) {
    // After the params: with split masters this also rewrites the trainable working weights.
    const std::string& bytes = *ckpt.Find("master");
    std::vector<float> master(bytes.size() / sizeof(float));
    std::memcpy(master.data(), bytes.data(), master.size() * sizeof(float));
    if (absl::Status s = model.WriteMasterF32(master); !s.ok()) return s;
  }
  return std::optional<ResumePoint>(std::move(point));
}

}  // namespace boulder::engine
