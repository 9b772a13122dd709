// Job specs: YAML <-> boulder.v1.JobSpec, defaults and validation. The one owner of job-spec
// validation: the coordinator, the trainer and the CLI all call these.
//
// YAML keys are the JobSpec field names (snake_case); mapping is by protobuf reflection, so a
// new field in spec.proto is accepted without code here (but needs a default and a check).
//
// Errors are INVALID_ARGUMENT with the field's path first, e.g.
//   "model.heads: 7 does not divide hidden 768"
//   "training.stepz: unknown field (did you mean 'steps'?)"
//   "training.steps: expected an integer, got 'ten'"
// Thread-safe: plain functions over values.
#ifndef BOULDER_COMMON_SPEC_H_
#define BOULDER_COMMON_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "boulder/v1/spec.pb.h"

namespace boulder::common {

// Largest spec document accepted (bytes).
inline constexpr size_t kMaxSpecBytes = 1 << 20;

// Parses a YAML (or JSON) document into an unresolved JobSpec: only the fields written are set.
// Rejects unknown fields, wrong types, duplicate keys and non-mapping documents.
// Keys are the proto field names; the lowerCamelCase JSON names (as protobuf's JSON printer
// writes them) are accepted too. Numbers may be quoted, as in protobuf JSON ("seed": "7").
// A section written with no fields (`model:`) is present and empty. Integers are decimal;
// doubles accept integers and floats (3e-4) but not NaN or infinities; bools are true/false.
// Errors (all INVALID_ARGUMENT): YAML syntax errors (with line and column), an empty document,
// more than one document, a document over kMaxSpecBytes, and the field-level errors above.
absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml);

// Applies one "path=value" override, e.g. "training.steps=50". The path names a field through
// its sections; the value is parsed as YAML with the same type checks as a document (so
// "model={preset: gpt2, layers: 2}" merges into a section). INVALID_ARGUMENT, naming the path,
// for a missing '=', an unknown or malformed path, or a bad value; `spec` is then unchanged.
absl::Status ApplyOverride(v1::JobSpec* spec, absl::string_view path_equals_value);

// Expands the model preset, fills every unset field with its default and validates the
// result. The returned spec has every field set. Does not modify `spec`.
// Defaults: model.preset "minigpt"; training.seq_len = model.context; name = the preset's name;
// precision "auto" and resources.backend "auto" stay "auto" (see EffectivePrecision and
// RequiredBackend). INVALID_ARGUMENT, starting with the field's path, for any impossible value.
absl::StatusOr<v1::JobSpec> ResolveJobSpec(const v1::JobSpec& spec);

// The backend a resolved spec needs: "cpu" or "cuda", or "" when either will do. bf16 and
// fp8 need cuda even where resources.backend is "auto"; fp8 with fp8.emulate needs cpu.
// (A cuda worker whose GPU has no FP8, compute capability below 8.9, refuses an fp8 job when
// its trainer starts, saying so.)
std::string RequiredBackend(const v1::JobSpec& resolved);

// The precision a trainer runs `resolved` at on a worker whose backend is `worker_backend`
// ("cpu" or "cuda"): "auto" is bf16 on cuda and fp32 on cpu. INVALID_ARGUMENT if the spec
// cannot run on that backend (RequiredBackend disagrees) or `worker_backend` is neither.
absl::StatusOr<std::string> EffectivePrecision(const v1::JobSpec& resolved,
                                               absl::string_view worker_backend);

// Parse + overrides + resolve.
absl::StatusOr<v1::JobSpec> LoadJobSpec(absl::string_view yaml,
                                        const std::vector<std::string>& overrides);

// A spec as YAML (for `boulder get` and for the trainer's spec file): the fields that are set
// (all of them, for a resolved spec) in declaration order, sections as nested mappings, "{}"
// for an empty spec. ParseJobSpecYaml reads it back to an equal message, doubles exactly.
std::string JobSpecToYaml(const v1::JobSpec& spec);

}  // namespace boulder::common

#endif  // BOULDER_COMMON_SPEC_H_
