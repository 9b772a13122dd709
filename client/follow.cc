#include "client/follow.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/chart.h"
#include "client/event_stream.h"
#include "client/generation.h"
#include "client/progress.h"
#include "client/views.h"

namespace boulder::client {
namespace {

// Carriage return, then erase the line: how a one-line display starts.
constexpr char kClearLine[] = "\r\033[K";

// From the last line of a display of `lines` lines, back to the start of its first line and
// erase down to the end of the screen: how the display (bar, chart, step times) is redrawn
// in place.
std::string EraseDisplay(int lines) {
  std::string out = "\r";
  if (lines > 1) absl::StrAppend(&out, "\033[", lines - 1, "A");
  absl::StrAppend(&out, "\033[J");
  return out;
}

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

  // Ends an in-place display with a newline so that what follows starts on its own line.
  void EndBar() {
    if (drawn_lines_ > 0) *io_.out << "\n" << std::flush;
    drawn_lines_ = 0;
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
      // The final display stays on screen above the outcome.
      if (drawn_lines_ > 0) *io_.out << "\n";
      drawn_lines_ = 0;
      *io_.out << line << "\n" << std::flush;
      return;
    }
    ClearBar();
    *io_.out << line << "\n";
    RedrawBar();
    io_.out->flush();
  }

  void OnStep(const v1::StepReport& report) {
    if (io_.out_is_terminal && report.step_time_seconds() > 0) {
      // A restart renumbers ranks onto other workers: the times of the old attempt go.
      if (report.attempt() != times_attempt_) step_times_.clear();
      times_attempt_ = report.attempt();
      step_times_[report.rank()] = report.step_time_seconds();
    }
    if (report.rank() != 0) {
      if (io_.out_is_terminal && have_report_) Draw();
      return;
    }
    eta_.Add(report);
    // Keep showing the last validation loss between evaluations.
    const bool had_val = have_report_ && last_report_.has_val_loss();
    const double last_val = last_report_.val_loss();
    last_report_ = report;
    if (!report.has_val_loss() && had_val) last_report_.set_val_loss(last_val);
    have_report_ = true;
    last_report_printed_ = false;
    if (io_.out_is_terminal) {
      losses_.Add(report.loss());
      Draw();
      last_report_printed_ = true;
    } else if (throttle_.ShouldPrint(report.step(), report.total_steps(), io_.clock())) {
      PrintPlainStep();
    }
  }

  void PrintPlainStep() {
    *io_.out << RenderProgressLine(last_report_, eta_.Eta()) << "\n" << std::flush;
    last_report_printed_ = true;
  }

  // The progress bar, the loss chart and the per-rank step times, replacing what was drawn.
  void Draw() {
    std::vector<std::string> lines = {
        RenderProgressBar(last_report_, eta_.Eta(), io_.terminal_width)};
    for (std::string& line :
         RenderLineChart(losses_.Points(), io_.terminal_width, ChartRowsFor(io_.terminal_height))) {
      lines.push_back(std::move(line));
    }
    if (!step_times_.empty()) {
      lines.push_back(RankStepTimesLine(step_times_, io_.terminal_width));
    }
    display_ = absl::StrJoin(lines, "\n");
    *io_.out << (drawn_lines_ > 0 ? EraseDisplay(drawn_lines_) : kClearLine) << display_
             << std::flush;
    drawn_lines_ = static_cast<int>(lines.size());
  }

  // Takes the display off the screen so that a line can be printed in its place; RedrawBar
  // puts it back under that line.
  void ClearBar() {
    if (drawn_lines_ == 0) return;
    *io_.out << EraseDisplay(drawn_lines_);
    hidden_lines_ = drawn_lines_;
    drawn_lines_ = 0;
  }
  void RedrawBar() {
    if (hidden_lines_ == 0) return;
    *io_.out << kClearLine << display_ << std::flush;
    drawn_lines_ = hidden_lines_;
    hidden_lines_ = 0;
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
  DownsampledSeries losses_;              // rank 0's, for the chart
  std::map<int32_t, double> step_times_;  // latest step time by rank
  int32_t times_attempt_ = 0;
  std::string display_;   // what Draw() wrote last, lines joined by '\n'
  int drawn_lines_ = 0;   // lines of display_ on screen now; 0: none
  int hidden_lines_ = 0;  // lines of display_ taken off by ClearBar()
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

std::unique_ptr<Connection> OpenOrReport(const ConnectOptions& connect, const Io& io,
                                         int* exit_code) {
  absl::StatusOr<std::unique_ptr<Connection>> conn = Connection::Open(connect);
  if (conn.ok()) return *std::move(conn);
  ReportError(io, conn.status());
  *exit_code = absl::IsInvalidArgument(conn.status()) ? kExitUsage : kExitError;
  return nullptr;
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
