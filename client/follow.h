// Following a job until it ends: the progress display of `watch` / `submit --follow` and the
// log tail of `logs -f`. Internal to client_lib; the commands in commands.h call these.
//
// Thread-compatible: one follower per thread.
#ifndef BOULDER_CLIENT_FOLLOW_H_
#define BOULDER_CLIENT_FOLLOW_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "boulder/v1/job.pb.h"
#include "client/commands.h"
#include "client/connection.h"

namespace boulder::client {

// Prints "boulder: <message>" on io.err and returns kExitError.
int ReportError(const Io& io, const absl::Status& status);

// Opens the connection; on failure prints the error and sets *exit_code (kExitUsage for a
// malformed address, kExitError when the coordinator cannot be reached).
std::unique_ptr<Connection> OpenOrReport(const ConnectOptions& connect, const Io& io,
                                         int* exit_code);

// GetJob, with the error translated by Connection::RpcError.
absl::StatusOr<v1::Job> FetchJob(Connection& conn, int64_t job_id);

// Streams `job`'s events and shows them: state changes as lines ("job 7 RUNNING on worker
// w-1"), rank 0's step reports as throttled plain lines when io.out is not a terminal, and on
// a terminal as a display redrawn in place with ANSI cursor movement: the progress bar, under
// it a braille chart of rank 0's loss fitted to the terminal (chart.h, ChartRowsFor), and the
// latest step time of each rank. At the end, the generated tokens with the stride verdict.
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
