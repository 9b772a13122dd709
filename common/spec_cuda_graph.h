// Default and validation of training.cuda_graph (worker/engine/step_graph.h): "auto" (the
// default: replay the step from CUDA graphs where the job allows it), "on" (require it) or
// "off". Called by ResolveJobSpec (spec_resolve.cc).
// Thread-safe: plain functions over values.
#ifndef BOULDER_COMMON_SPEC_CUDA_GRAPH_H_
#define BOULDER_COMMON_SPEC_CUDA_GRAPH_H_

#include "absl/status/status.h"
#include "boulder/v1/spec.pb.h"

namespace boulder::common {

// Sets training.cuda_graph to "auto" when unset.
void FillCudaGraphDefault(v1::JobSpec* spec);

// INVALID_ARGUMENT naming training.cuda_graph: a value other than auto, on or off; "on" for a
// job that cannot run as a graph whatever the worker: resources.backend cpu, precision fp32
// (cpu) or fp8, resources.workers > 1. REQUIRES: the rest of the spec has defaults filled.
absl::Status ValidateCudaGraph(const v1::JobSpec& spec);

}  // namespace boulder::common

#endif  // BOULDER_COMMON_SPEC_CUDA_GRAPH_H_
