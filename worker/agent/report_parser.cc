#include "worker/agent/report_parser.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"

namespace boulder::agent {

absl::StatusOr<v1::TrainerMessage> ParseTrainerMessage(absl::string_view line) {
  line = absl::StripAsciiWhitespace(line);
  if (line.empty()) return absl::InvalidArgumentError("report line: empty");
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  v1::TrainerMessage message;
  const auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(line.data(), line.size()), &message, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("report line: not a TrainerMessage: ", std::string(status.message())));
  }
  if (message.kind_case() == v1::TrainerMessage::KIND_NOT_SET) {
    return absl::InvalidArgumentError("report line: sets none of 'step', 'generation' or 'error'");
  }
  return message;
}

}  // namespace boulder::agent
