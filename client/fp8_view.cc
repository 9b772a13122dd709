#include "client/fp8_view.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/table.h"

namespace boulder::client {
namespace {

std::string Percent(double ratio) {
  if (ratio == 0) return "0";
  if (ratio < 1e-4) return absl::StrFormat("%.2g%%", ratio * 100);
  return absl::StrFormat("%.3f%%", ratio * 100);
}

}  // namespace

std::string Fp8Table(const v1::Job& job) {
  const v1::StepReport& r = job.latest_report();
  if (r.fp8().empty()) {
    if (job.spec().precision() != "fp8") {
      return absl::StrCat("job ", job.id(), " does not train in fp8 (precision ",
                          job.spec().precision(), ")\n");
    }
    return absl::StrCat("job ", job.id(), " has no FP8 statistics yet (no step reported)\n");
  }
  Table table({"LAYER", "TENSOR", "ROLE", "FORMAT", "SCALE", "AMAX", "AMAX_HISTORY_MAX",
               "SATURATED", "UNDERFLOW"});
  for (const v1::Fp8TensorStats& t : r.fp8()) {
    table.AddRow({absl::StrCat(t.layer()), t.tensor(), t.role(), t.format(),
                  absl::StrFormat("%.6g", t.scale()), absl::StrFormat("%.4g", t.amax()),
                  absl::StrFormat("%.4g", t.amax_history_max()), Percent(t.saturated_ratio()),
                  Percent(t.underflow_ratio())});
  }
  return absl::StrCat("step ", r.step(), " of ", r.total_steps(), ", ", r.skipped_steps(),
                      " skipped (non-finite loss or gradients)\n", table.Render());
}

}  // namespace boulder::client
