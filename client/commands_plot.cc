// `boulder plot`: the job's step reports, read from its event stream, drawn as an SVG.
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/commands.h"
#include "client/follow.h"
#include "client/svg_plot.h"
#include "client/views.h"

namespace boulder::client {
namespace {

struct StepPoint {
  double loss = 0;
  double lr = 0;
};

// Rank 0's step reports by step, from the first event up to the job's latest report as of
// `job` (or its end). WatchJob replays the job's whole history, which GetJob and ListJobs do
// not carry; the stream is cut once the snapshot is complete rather than waiting for a
// running job to end. A step reported again by a later attempt (after a restart from a
// checkpoint) keeps the later value.
absl::StatusOr<std::map<int64_t, StepPoint>> ReadSteps(Connection& conn, const v1::Job& job,
                                                       absl::Duration timeout) {
  const bool ended = IsTerminal(job.state());
  const v1::StepReport& latest = job.latest_report();
  std::map<int64_t, StepPoint> steps;
  if (!ended && latest.step() <= 0) return steps;

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  v1::WatchJobRequest request;
  request.set_job_id(job.id());
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader =
      conn.jobs().WatchJob(&context, request);
  v1::JobEvent event;
  bool complete = false;
  while (!complete && reader->Read(&event)) {
    if (event.has_step() && event.step().rank() == 0) {
      const v1::StepReport& r = event.step();
      steps[r.step()] = StepPoint{r.loss(), r.lr()};
      complete = !ended && r.attempt() >= latest.attempt() && r.step() >= latest.step();
    }
    if (event.has_state_change() && IsTerminal(event.state_change().state())) complete = true;
  }
  if (complete) context.TryCancel();
  grpc::Status status = reader->Finish();
  // A stream that ends early (a coordinator shutting down) still gave a usable prefix.
  if (!complete && !status.ok() && steps.empty()) return conn.RpcError(status, "WatchJob");
  return steps;
}

absl::Status WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  out << data;
  out.close();
  if (!out) {
    return absl::DataLossError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

int RunPlot(const ConnectOptions& connect, const PlotOptions& options, const Io& io) {
  int exit_code = kExitOk;
  std::unique_ptr<Connection> conn = OpenOrReport(connect, io, &exit_code);
  if (conn == nullptr) return exit_code;
  absl::StatusOr<v1::Job> job = FetchJob(*conn, options.job_id);
  if (!job.ok()) return ReportError(io, job.status());
  absl::StatusOr<std::map<int64_t, StepPoint>> steps = ReadSteps(*conn, *job, options.timeout);
  if (!steps.ok()) return ReportError(io, steps.status());
  if (steps->empty()) {
    return ReportError(
        io, absl::FailedPreconditionError(absl::StrCat(
                "job ", job->id(), " has no step reports yet (", JobStateName(job->state()), ")")));
  }

  PlotData data;
  const std::string& name = job->name().empty() ? job->spec().name() : job->name();
  data.title = absl::StrCat("job ", job->id(), name.empty() ? "" : " · ", name, " (",
                            JobStateName(job->state()), ")");
  for (const auto& [step, point] : *steps) {
    data.loss.push_back({step, point.loss});
    data.lr.push_back({step, point.lr});
  }
  const std::string svg = RenderLossSvg(data);
  if (options.output == "-") {
    *io.out << svg << std::flush;
    return kExitOk;
  }
  if (absl::Status s = WriteFile(options.output, svg); !s.ok()) return ReportError(io, s);
  const auto& [last_step, last] = *steps->rbegin();
  *io.out << absl::StrFormat("wrote %s (%d step reports, loss %.4f at step %d)\n", options.output,
                             steps->size(), last.loss, last_step)
          << std::flush;
  return kExitOk;
}

}  // namespace boulder::client
