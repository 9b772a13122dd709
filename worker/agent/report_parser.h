// Parses the lines a trainer writes on its report fd: one boulder.v1.TrainerMessage per line,
// in protobuf JSON (either field-name style). Fields this build does not know are ignored, so
// a newer trainer can add fields without breaking an older agent.
//
// Thread-safe: a plain function.
#ifndef BOULDER_WORKER_AGENT_REPORT_PARSER_H_
#define BOULDER_WORKER_AGENT_REPORT_PARSER_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "boulder/v1/worker.pb.h"

namespace boulder::agent {

// OK: a message with exactly one of step, generation or error set.
// INVALID_ARGUMENT: the line is not a JSON object of TrainerMessage's shape, or sets none of
// its kinds; the message quotes the parser's complaint.
absl::StatusOr<v1::TrainerMessage> ParseTrainerMessage(absl::string_view line);

}  // namespace boulder::agent

#endif  // BOULDER_WORKER_AGENT_REPORT_PARSER_H_
