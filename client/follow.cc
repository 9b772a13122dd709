#include "client/follow.h"

#include <algorithm>
#include <ostream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/event_stream.h"
#include "client/generation.h"
#include "client/progress.h"
#include "client/views.h"

namespace boulder::client {
namespace {

// Carriage return, then erase the line: how the bar is redrawn in place.
constexpr char kClearLine[] = "\r\033[K";

class WatchPrinter : public JobEventHandler {
 public:
  WatchPrinter(Connection& conn, const v1::Job& job, const WatchOptions& options, const Io& io)
      : conn_(conn), job_(job), options_(options), io_(io) {}

  void OnEvent(const v1::JobEvent& event) override {
    switch (event.kind_case()) {
      case v1::JobEvent::kStateChange:
        OnStateChange(event.state_change());
        break;
      case v1::JobEvent::kStep:
        OnStep(event.step());
        break;
      case v1::JobEvent::kGeneration:
        job_.mutable_generation()->CopyFrom(event.generation());
        break;
      default:
        break;
    }
  }

  void OnReconnecting(absl::string_view reason, absl::Duration timeout) override {
    ClearBar();
    *io_.err << absl::StrFormat(
                    "boulder: lost the coordinator at %s (%s); reconnecting for up to %g s\n",
                    conn_.address(), reason, absl::ToDoubleSeconds(timeout))
             << std::flush;
    RedrawBar();
  }

  // Ends an in-place bar with a newline so that what follows starts on its own line.
  void EndBar() {
    if (bar_drawn_) *io_.out << "\n" << std::flush;
    bar_drawn_ = false;
  }

  // Prints what follows the terminal state and returns the exit code for it.
  int Finish(v1::JobState state) {
    if (!io_.out_is_terminal && have_report_ && !last_report_printed_) PrintPlainStep();
    EndBar();
    if (job_.generation().tokens().empty() && state == v1::SUCCEEDED) {
      // Older events may not carry the generation; the job record does.
      absl::StatusOr<v1::Job> latest = FetchJob(conn_, job_.id());
      if (latest.ok()) job_.mutable_generation()->CopyFrom(latest->generation());
    }
    if (!job_.generation().tokens().empty()) {
      *io_.out << GenerationLine(job_.generation(), job_.spec().model().vocab_size(),
                                 options_.max_tokens_shown)
               << "\n";
    }
    io_.out->flush();
    switch (state) {
      case v1::SUCCEEDED:
        return kExitOk;
      case v1::CANCELLED:
        return kExitCancelled;
      default:
        return kExitError;
    }
  }

 private:
  void OnStateChange(const v1::JobStateChange& change) {
    std::string line = absl::StrCat("job ", job_.id(), " ", JobStateName(change.state()));
    bool show_message = !change.message().empty();
    if (change.state() == v1::SCHEDULED || change.state() == v1::RUNNING ||
        change.state() == v1::RESTARTING) {
      // State events do not name the workers; the job record does.
      absl::StatusOr<v1::Job> latest = FetchJob(conn_, job_.id());
      if (latest.ok() && !latest->workers().empty()) {
        absl::StrAppend(&line, latest->workers_size() == 1 ? " on worker " : " on workers ",
                        absl::StrJoin(latest->workers(), ", "));
        // A message that names the workers ("running on w-1") says nothing more, except
        // why a job restarts.
        const bool names_workers = std::all_of(
            latest->workers().begin(), latest->workers().end(),
            [&](const std::string& id) { return absl::StrContains(change.message(), id); });
        if (names_workers && change.state() != v1::RESTARTING) show_message = false;
      }
    }
    if (show_message) absl::StrAppend(&line, ": ", change.message());
    if (IsTerminal(change.state())) {
      if (!io_.out_is_terminal && have_report_ && !last_report_printed_) PrintPlainStep();
      // The final bar stays on screen above the outcome.
      if (bar_drawn_) *io_.out << "\n";
      bar_drawn_ = false;
      *io_.out << line << "\n" << std::flush;
      return;
    }
    ClearBar();
    *io_.out << line << "\n";
    RedrawBar();
    io_.out->flush();
  }

  void OnStep(const v1::StepReport& report) {
    if (report.rank() != 0) return;
    eta_.Add(report);
    last_report_ = report;
    have_report_ = true;
    last_report_printed_ = false;
    if (io_.out_is_terminal) {
      bar_ = RenderProgressBar(report, eta_.Eta(), io_.terminal_width);
      *io_.out << kClearLine << bar_ << std::flush;
      bar_drawn_ = true;
      last_report_printed_ = true;
    } else if (throttle_.ShouldPrint(report.step(), report.total_steps(), io_.clock())) {
      PrintPlainStep();
    }
  }

  void PrintPlainStep() {
    *io_.out << RenderProgressLine(last_report_, eta_.Eta()) << "\n" << std::flush;
    last_report_printed_ = true;
  }

  void ClearBar() {
    if (bar_drawn_) *io_.out << kClearLine;
  }
  void RedrawBar() {
    if (bar_drawn_) *io_.out << bar_ << std::flush;
  }

  Connection& conn_;
  v1::Job job_;
  const WatchOptions& options_;
  const Io& io_;
  EtaEstimator eta_;
  StepLineThrottle throttle_;
  v1::StepReport last_report_;
  bool have_report_ = false;
  bool last_report_printed_ = false;
  std::string bar_;
  bool bar_drawn_ = false;
};

class LogPrinter : public JobEventHandler {
 public:
  LogPrinter(Connection& conn, bool with_rank, const Io& io)
      : conn_(conn), with_rank_(with_rank), io_(io) {}

  void OnEvent(const v1::JobEvent& event) override {
    if (event.has_log()) *io_.out << LogLineText(event.log(), with_rank_) << "\n" << std::flush;
  }

  void OnReconnecting(absl::string_view reason, absl::Duration timeout) override {
    *io_.err << absl::StrFormat(
                    "boulder: lost the coordinator at %s (%s); reconnecting for up to %g s\n",
                    conn_.address(), reason, absl::ToDoubleSeconds(timeout))
             << std::flush;
  }

 private:
  Connection& conn_;
  bool with_rank_;
  const Io& io_;
};

}  // namespace

int ReportError(const Io& io, const absl::Status& status) {
  *io.err << "boulder: " << status.message() << "\n" << std::flush;
  return kExitError;
}

absl::StatusOr<v1::Job> FetchJob(Connection& conn, int64_t job_id) {
  grpc::ClientContext context;
  conn.SetUnaryDeadline(&context);
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::Job job;
  grpc::Status status = conn.jobs().GetJob(&context, request, &job);
  if (!status.ok()) return conn.RpcError(status, "GetJob");
  return job;
}

int FollowJob(Connection& conn, const v1::Job& job, const WatchOptions& options, const Io& io) {
  WatchPrinter printer(conn, job, options, io);
  absl::StatusOr<v1::JobState> state =
      StreamJobEvents(conn, job.id(), options.reconnect_timeout, printer);
  if (!state.ok()) {
    printer.EndBar();
    return ReportError(io, state.status());
  }
  return printer.Finish(*state);
}

int FollowLogs(Connection& conn, const v1::Job& job, absl::Duration reconnect_timeout,
               const Io& io) {
  LogPrinter printer(conn, job.spec().resources().workers() > 1, io);
  absl::StatusOr<v1::JobState> state = StreamJobEvents(conn, job.id(), reconnect_timeout, printer);
  if (!state.ok()) return ReportError(io, state.status());
  return kExitOk;
}

std::string LogLineText(const v1::LogLine& line, bool with_rank) {
  if (!with_rank) return line.text();
  return absl::StrCat("[rank ", line.rank(), "] ", line.text());
}

}  // namespace boulder::client
