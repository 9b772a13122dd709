// A job's event stream (JobService.WatchJob) that survives coordinator restarts: when the
// stream breaks it reconnects with after_seq = the last seq seen, so every event is delivered
// once, in seq order.
//
// Thread-compatible: StreamJobEvents calls the handler on the caller's thread.
#ifndef BOULDER_CLIENT_EVENT_STREAM_H_
#define BOULDER_CLIENT_EVENT_STREAM_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "boulder/v1/job.pb.h"
#include "client/connection.h"

namespace boulder::client {

class JobEventHandler {
 public:
  virtual ~JobEventHandler() = default;
  // Each event once, in seq order.
  virtual void OnEvent(const v1::JobEvent& event) = 0;
  // The stream broke (`reason`, e.g. "connection refused"); reconnection attempts go on for
  // `timeout`. Called once per outage.
  virtual void OnReconnecting(absl::string_view reason, absl::Duration timeout) = 0;
};

// Delivers the events of `job_id` from the first one until its terminal state (SUCCEEDED,
// FAILED or CANCELLED) and returns that state.
// Errors: the coordinator's answer to WatchJob when it is not worth retrying (NOT_FOUND for
// an unknown job, ...); UNAVAILABLE when the stream broke and no reconnection delivered an
// event within `reconnect_timeout`.
absl::StatusOr<v1::JobState> StreamJobEvents(Connection& conn, int64_t job_id,
                                             absl::Duration reconnect_timeout,
                                             JobEventHandler& handler);

}  // namespace boulder::client

#endif  // BOULDER_CLIENT_EVENT_STREAM_H_
