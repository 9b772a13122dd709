#include "common/spec_cuda_graph.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace boulder::common {
namespace {

constexpr char kPath[] = "training.cuda_graph";

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(kPath, ": ", what));
}

}  // namespace

void FillCudaGraphDefault(v1::JobSpec* spec) {
  if (!spec->training().has_cuda_graph()) spec->mutable_training()->set_cuda_graph("auto");
}

absl::Status ValidateCudaGraph(const v1::JobSpec& spec) {
  const std::string& mode = spec.training().cuda_graph();
  if (mode != "auto" && mode != "on" && mode != "off") {
    return Invalid(absl::StrCat("unknown mode '", mode, "' (one of auto, on, off)"));
  }
  if (mode != "on") return absl::OkStatus();
  constexpr char kHint[] = " (use auto or off)";
  if (spec.resources().backend() == "cpu") {
    return Invalid(absl::StrCat("on needs the cuda backend, but resources.backend is cpu", kHint));
  }
  if (spec.precision() == "fp32") {
    return Invalid(
        absl::StrCat("on needs the cuda backend, but precision fp32 trains on the cpu "
                     "backend",
                     kHint));
  }
  if (spec.precision() == "fp8" && spec.fp8().emulate()) {
    return Invalid(absl::StrCat(
        "on needs the cuda backend, but fp8.emulate trains on the cpu backend's emulation", kHint));
  }
  return absl::OkStatus();
}

}  // namespace boulder::common
