// `boulder top`: the workers and jobs, refreshed in place on a terminal.
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "client/commands.h"
#include "client/follow.h"
#include "client/top_view.h"

namespace boulder::client {
namespace {

// The alternate screen keeps the user's scrollback as it was once `top` quits; the cursor is
// hidden meanwhile so that it does not flicker over the table.
constexpr char kEnterScreen[] = "\033[?1049h\033[?25l";
constexpr char kLeaveScreen[] = "\033[?25h\033[?1049l";

absl::Status Fetch(Connection& conn, v1::ListWorkersResponse* workers, v1::ListJobsResponse* jobs) {
  grpc::ClientContext workers_context;
  conn.SetUnaryDeadline(&workers_context);
  grpc::Status status =
      conn.workers().ListWorkers(&workers_context, v1::ListWorkersRequest(), workers);
  if (!status.ok()) return conn.RpcError(status, "ListWorkers");
  grpc::ClientContext jobs_context;
  conn.SetUnaryDeadline(&jobs_context);
  status = conn.jobs().ListJobs(&jobs_context, v1::ListJobsRequest(), jobs);
  if (!status.ok()) return conn.RpcError(status, "ListJobs");
  return absl::OkStatus();
}

// The screen from the top left corner, each line erased to its end and whatever an earlier,
// longer screen left below erased too.
std::string InPlace(const std::string& screen) {
  std::string out = "\033[H";
  absl::string_view rest = screen;
  for (size_t end = rest.find('\n'); end != absl::string_view::npos; end = rest.find('\n')) {
    absl::StrAppend(&out, rest.substr(0, end), "\033[K\n");
    rest.remove_prefix(end + 1);
  }
  absl::StrAppend(&out, "\033[J");
  return out;
}

}  // namespace

int RunTop(const ConnectOptions& connect, const TopOptions& options, const Io& io) {
  int exit_code = kExitOk;
  std::unique_ptr<Connection> conn = OpenOrReport(connect, io, &exit_code);
  if (conn == nullptr) return exit_code;
  TopViewOptions view;
  view.coordinator = conn->address();
  view.zone = io.zone;
  v1::ListWorkersResponse workers;
  v1::ListJobsResponse jobs;

  if (!io.out_is_terminal) {
    if (absl::Status s = Fetch(*conn, &workers, &jobs); !s.ok()) return ReportError(io, s);
    view.now = io.clock();
    *io.out << RenderTop(workers, jobs, view) << std::flush;
    return kExitOk;
  }

  view.footer = "q or Ctrl-C to quit";
  *io.out << kEnterScreen;
  bool have_answer = false;
  for (;;) {
    v1::ListWorkersResponse fresh_workers;
    v1::ListJobsResponse fresh_jobs;
    if (absl::Status s = Fetch(*conn, &fresh_workers, &fresh_jobs); s.ok()) {
      workers = std::move(fresh_workers);
      jobs = std::move(fresh_jobs);
      have_answer = true;
      view.notice.clear();
    } else {
      // Keep refreshing: the coordinator may be restarting.
      view.notice =
          absl::StrCat("boulder: ", s.message(), have_answer ? " (showing the last answer)" : "");
    }
    view.width = io.terminal_width;
    view.height = io.terminal_height;
    if (options.terminal_size) options.terminal_size(&view.width, &view.height);
    view.now = io.clock();
    *io.out << InPlace(RenderTop(workers, jobs, view)) << std::flush;
    if (options.wait_for_quit) {
      if (options.wait_for_quit(options.interval)) break;
    } else {
      absl::SleepFor(options.interval);
    }
  }
  *io.out << kLeaveScreen << std::flush;
  return kExitOk;
}

}  // namespace boulder::client
