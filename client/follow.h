// Following a job until it ends: the progress display of `watch` / `submit --follow` and the
// log tail of `logs -f`. Internal to client_lib; the commands in commands.h call these.
//
// Thread-compatible: one follower per thread.
#ifndef BOULDER_CLIENT_FOLLOW_H_
#define BOULDER_CLIENT_FOLLOW_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "boulder/v1/job.pb.h"
#include "client/commands.h"
#include "client/connection.h"

namespace boulder::client {

// Prints "boulder: <message>" on io.err and returns kExitError.
int ReportError(const Io& io, const absl::Status& status);

// GetJob, with the error translated by Connection::RpcError.
absl::StatusOr<v1::Job> FetchJob(Connection& conn, int64_t job_id);

// Streams `job`'s events and shows them: state changes as lines ("job 7 RUNNING on worker
// w-1"), rank 0's step reports as a progress bar redrawn in place (terminal) or as throttled
// plain lines (otherwise), and at the end the generated tokens with the stride verdict.
// Returns kExitOk for SUCCEEDED, kExitError for FAILED, kExitCancelled for CANCELLED, and
// kExitError after printing the error when the stream cannot be followed.
int FollowJob(Connection& conn, const v1::Job& job, const WatchOptions& options, const Io& io);

// Prints `job`'s log lines as they come, from the first, until the job ends. Returns kExitOk
// then, or kExitError after printing the error.
int FollowLogs(Connection& conn, const v1::Job& job, absl::Duration reconnect_timeout,
               const Io& io);

// One log line as printed: the text, prefixed by "[rank N] " when `with_rank`.
std::string LogLineText(const v1::LogLine& line, bool with_rank);

}  // namespace boulder::client

#endif  // BOULDER_CLIENT_FOLLOW_H_
