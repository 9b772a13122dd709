#include "client/event_stream.h"

#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/views.h"

namespace boulder::client {
namespace {

// Codes a coordinator going away produces (connection loss, server shutdown cancelling its
// calls, a reset stream); anything else is the coordinator's considered answer.
bool Retryable(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::OK:  // ended before the terminal state: a shutting-down server
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::INTERNAL:
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::StatusOr<v1::JobState> StreamJobEvents(Connection& conn, int64_t job_id,
                                             absl::Duration reconnect_timeout,
                                             JobEventHandler& handler) {
  constexpr absl::Duration kFirstBackoff = absl::Milliseconds(250);
  constexpr absl::Duration kMaxBackoff = absl::Seconds(2);
  int64_t last_seq = 0;
  absl::Time give_up = absl::InfiniteFuture();  // set while an outage lasts
  absl::Duration backoff = kFirstBackoff;
  for (;;) {
    grpc::ClientContext context;
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_after_seq(last_seq);
    std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader =
        conn.jobs().WatchJob(&context, request);
    v1::JobEvent event;
    bool progressed = false;
    v1::JobState terminal = v1::JOB_STATE_UNSPECIFIED;
    while (reader->Read(&event)) {
      if (event.seq() <= last_seq) continue;
      last_seq = event.seq();
      progressed = true;
      handler.OnEvent(event);
      if (event.has_state_change() && IsTerminal(event.state_change().state())) {
        terminal = event.state_change().state();
        break;
      }
    }
    if (terminal != v1::JOB_STATE_UNSPECIFIED) {
      // Nothing follows the terminal state; stop waiting for the server to close the stream.
      context.TryCancel();
      reader->Finish();
      return terminal;
    }
    grpc::Status status = reader->Finish();
    if (!Retryable(status)) return conn.RpcError(status, "WatchJob");

    if (progressed) {
      give_up = absl::InfiniteFuture();
      backoff = kFirstBackoff;
    }
    const std::string reason =
        status.ok() ? "the coordinator ended the event stream early" : ConnectFailureReason(status);
    absl::Time now = absl::Now();
    if (give_up == absl::InfiniteFuture()) {
      give_up = now + reconnect_timeout;
      handler.OnReconnecting(reason, reconnect_timeout);
    }
    if (now >= give_up) {
      return absl::UnavailableError(absl::StrFormat(
          "lost the event stream of job %d from the coordinator at %s (%s) and could not "
          "reconnect within %g s",
          job_id, conn.address(), reason, absl::ToDoubleSeconds(reconnect_timeout)));
    }
    // A retry delay so that a coordinator that keeps failing the call is not hammered.
    absl::SleepFor(std::min(backoff, give_up - now));
    backoff = std::min(backoff * 2, kMaxBackoff);
    conn.WaitForConnected(give_up);
  }
}

}  // namespace boulder::client
