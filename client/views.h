// Human views of API messages: the `boulder jobs` and `boulder workers` tables and the
// `boulder get` description. Pure functions of the message and the current time; thread-safe.
#ifndef BOULDER_CLIENT_VIEWS_H_
#define BOULDER_CLIENT_VIEWS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "boulder/v1/job.pb.h"
#include "boulder/v1/worker.pb.h"

namespace boulder::client {

// "RUNNING", "SUCCEEDED", ...; "UNSPECIFIED" for JOB_STATE_UNSPECIFIED.
std::string JobStateName(v1::JobState state);
// "IDLE", "BUSY", "LOST"; "UNSPECIFIED" for WORKER_STATE_UNSPECIFIED.
std::string WorkerStateName(v1::WorkerState state);

// Parses a state name as users type it: "running", "RUNNING", "Running".
// INVALID_ARGUMENT naming the accepted states otherwise.
absl::StatusOr<v1::JobState> ParseJobState(absl::string_view name);

// Whether no further events follow this state (SUCCEEDED, FAILED, CANCELLED).
bool IsTerminal(v1::JobState state);

// The table of `boulder jobs`: ID NAME STATE STEP LOSS WORKERS AGE.
std::string JobsTable(const v1::ListJobsResponse& jobs, absl::Time now);

// A worker's GPU as shown in tables: "NVIDIA H200 (sm_90)", the name alone without a compute
// capability, "-" without a GPU.
std::string GpuText(const v1::WorkerCapabilities& caps);

// The table of `boulder workers`: ID BACKEND CORES GPU MEMORY STATE JOB LAST-HEARTBEAT.
std::string WorkersTable(const v1::ListWorkersResponse& workers, absl::Time now);

// The description of `boulder get`: identity, state and message, times, attempt, workers,
// the latest step report, the resolved spec as YAML and the generated tokens. Times are shown
// in `zone`.
std::string JobDetails(const v1::Job& job, absl::Time now, absl::TimeZone zone);

}  // namespace boulder::client

#endif  // BOULDER_CLIENT_VIEWS_H_
