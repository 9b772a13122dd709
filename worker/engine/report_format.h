// How the trainer's reports are written out: human-readable lines for a terminal, and the
// one-JSON-object-per-line TrainerMessage stream the worker agent reads from --report-fd.
//
// Thread-safety: plain functions over values.
#ifndef BOULDER_WORKER_ENGINE_REPORT_FORMAT_H_
#define BOULDER_WORKER_ENGINE_REPORT_FORMAT_H_

#include <string>

#include "absl/status/statusor.h"
#include "boulder/v1/job.pb.h"
#include "boulder/v1/worker.pb.h"

namespace boulder::engine {

// "step   10/200  loss 2.3456  lr 3.00e-04  norm 1.234  12,345 tok/s  41.2 ms" (no newline),
// then "  val_loss 2.5" on steps that evaluated and "  (cuda graph)" on steps replayed from a
// CUDA graph.
std::string FormatStepLine(const v1::StepReport& report);

// The prompt, the generated tokens and whether the whole sequence keeps a constant stride
// (mod vocab_size), as a few lines, each '\n'-terminated.
std::string FormatGeneration(const v1::GenerationResult& generation, int vocab_size);

// `message` as single-line protobuf JSON (proto field names), '\n'-terminated.
// INTERNAL if the message cannot be serialised.
absl::StatusOr<std::string> ToJsonLine(const v1::TrainerMessage& message);

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_REPORT_FORMAT_H_
