#include "worker/engine/report_format.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"
#include "worker/engine/data.h"

namespace boulder::engine {
namespace {

// 12345.6 -> "12,346".
std::string WithThousands(double value) {
  const std::string digits = absl::StrFormat("%.0f", value < 0 ? 0.0 : value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

}  // namespace

std::string FormatStepLine(const v1::StepReport& r) {
  const int width = std::max<int>(4, absl::StrCat(r.total_steps()).size());
  std::string line =
      absl::StrFormat("step %*d/%d  loss %.4f  lr %.2e  norm %.3f  %s tok/s  %.1f ms", width,
                      r.step(), r.total_steps(), r.loss(), r.lr(), r.grad_norm(),
                      WithThousands(r.tokens_per_second()), r.step_time_seconds() * 1e3);
  if (r.has_val_loss()) absl::StrAppend(&line, absl::StrFormat("  val_loss %.4f", r.val_loss()));
  if (r.cuda_graph()) absl::StrAppend(&line, "  (cuda graph)");
  return line;
}

std::string FormatGeneration(const v1::GenerationResult& g, int vocab_size) {
  std::vector<int32_t> all(g.prompt().begin(), g.prompt().end());
  all.insert(all.end(), g.tokens().begin(), g.tokens().end());
  int32_t stride = 0;
  const bool constant = HasConstantStride(all, vocab_size, &stride);
  std::string out = absl::StrCat("prompt:    ", absl::StrJoin(g.prompt(), " "), "\n",
                                 "generated: ", absl::StrJoin(g.tokens(), " "), "\n");
  if (constant) {
    absl::StrAppend(&out, "stride:    constant ", stride, " (mod ", vocab_size, ")\n");
  } else {
    absl::StrAppend(&out, "stride:    not constant\n");
  }
  return out;
}

absl::StatusOr<std::string> ToJsonLine(const v1::TrainerMessage& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.add_whitespace = false;
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("TrainerMessage to JSON: ", status.ToString()));
  }
  json.push_back('\n');
  return json;
}

}  // namespace boulder::engine
