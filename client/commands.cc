#include "client/commands.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/follow.h"
#include "client/format.h"
#include "client/fp8_view.h"
#include "client/proto_output.h"
#include "client/views.h"
#include "common/spec.h"

namespace boulder::client {
namespace {

absl::StatusOr<std::string> ReadSpecFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", path, ": is a directory"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  // Read one byte more than allowed to tell "exactly the limit" from "over it".
  std::string data(common::kMaxSpecBytes + 1, '\0');
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  data.resize(static_cast<size_t>(in.gcount()));
  if (data.size() > common::kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is larger than ",
                                                   HumanBytes(common::kMaxSpecBytes),
                                                   ", the most a job spec may be"));
  }
  return data;
}

int PrintMessage(const Io& io, const google::protobuf::Message& message, OutputFormat format) {
  absl::StatusOr<std::string> text =
      format == OutputFormat::kYaml ? ToYaml(message) : ToJson(message);
  if (!text.ok()) return ReportError(io, text.status());
  *io.out << *text << std::flush;
  return kExitOk;
}

}  // namespace

int RunSubmit(const ConnectOptions& connect, const SubmitOptions& options, const Io& io) {
  for (const std::string& override_text : options.overrides) {
    size_t eq = override_text.find('=');
    if (eq == std::string::npos || eq == 0) {
      ReportError(io, absl::InvalidArgumentError(
                          absl::StrCat("--set: expected PATH=VALUE, got '", override_text, "'")));
      return kExitUsage;
    }
  }
  absl::StatusOr<std::string> yaml = ReadSpecFile(options.file);
  if (!yaml.ok()) return ReportError(io, yaml.status());

  int exit_code = kExitOk;
  std::unique_ptr<Connection> conn = OpenOrReport(connect, io, &exit_code);
  if (conn == nullptr) return exit_code;

  v1::SubmitJobRequest request;
  request.set_spec_yaml(*yaml);
  for (const std::string& o : options.overrides) request.add_overrides(o);
  grpc::ClientContext context;
  conn->SetUnaryDeadline(&context);
  v1::SubmitJobResponse response;
  grpc::Status status = conn->jobs().SubmitJob(&context, request, &response);
  if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT &&
      !absl::StartsWith(status.error_message(), "invalid spec")) {
    return ReportError(
        io, absl::InvalidArgumentError(absl::StrCat("invalid spec: ", status.error_message())));
  }
  if (!status.ok()) return ReportError(io, conn->RpcError(status, "SubmitJob"));

  const v1::Job& job = response.job();
  if (options.quiet) {
    *io.out << job.id() << "\n";
  } else {
    const std::string& name = job.name().empty() ? job.spec().name() : job.name();
    *io.out << "job " << job.id() << " submitted (" << (name.empty() ? "unnamed" : name) << ", "
            << JobStateName(job.state()) << ")\n";
  }
  io.out->flush();
  if (!options.follow) return kExitOk;
  return FollowJob(*conn, job, options.watch, io);
}

int RunJobs(const ConnectOptions& connect, const JobsOptions& options, const Io& io) {
  v1::ListJobsRequest request;
  for (const std::string& name : options.states) {
    absl::StatusOr<v1::JobState> state = ParseJobState(name);
    if (!state.ok()) {
      ReportError(io,
                  absl::InvalidArgumentError(absl::StrCat("--state: ", state.status().message())));
      return kExitUsage;
    }
    request.add_states(*state);
  }
  int exit_code = kExitOk;
  std::unique_ptr<Connection> conn = OpenOrReport(connect, io, &exit_code);
  if (conn == nullptr) return exit_code;

  grpc::ClientContext context;
  conn->SetUnaryDeadline(&context);
  v1::ListJobsResponse response;
  grpc::Status status = conn->jobs().ListJobs(&context, request, &response);
  if (!status.ok()) return ReportError(io, conn->RpcError(status, "ListJobs"));
  if (options.format != OutputFormat::kHuman) return PrintMessage(io, response, options.format);
  if (response.jobs().empty()) {
    *io.out << "no jobs\n" << std::flush;
    return kExitOk;
  }
  *io.out << JobsTable(response, io.clock()) << std::flush;
  return kExitOk;
}

int RunGet(const ConnectOptions& connect, const GetOptions& options, const Io& io) {
  int exit_code = kExitOk;
  std::unique_ptr<Connection> conn = OpenOrReport(connect, io, &exit_code);
  if (conn == nullptr) return exit_code;
  absl::StatusOr<v1::Job> job = FetchJob(*conn, options.job_id);
  if (!job.ok()) return ReportError(io, job.status());
  if (options.fp8) {
    *io.out << Fp8Table(*job) << std::flush;
    return kExitOk;
  }
  if (options.format != OutputFormat::kHuman) return PrintMessage(io, *job, options.format);
  *io.out << JobDetails(*job, io.clock(), io.zone) << std::flush;
  return kExitOk;
}

int RunWatch(const ConnectOptions& connect, const WatchOptions& options, const Io& io) {
  int exit_code = kExitOk;
  std::unique_ptr<Connection> conn = OpenOrReport(connect, io, &exit_code);
  if (conn == nullptr) return exit_code;
  absl::StatusOr<v1::Job> job = FetchJob(*conn, options.job_id);
  if (!job.ok()) return ReportError(io, job.status());
  return FollowJob(*conn, *job, options, io);
}

int RunLogs(const ConnectOptions& connect, const LogsOptions& options, const Io& io) {
  int exit_code = kExitOk;
  std::unique_ptr<Connection> conn = OpenOrReport(connect, io, &exit_code);
  if (conn == nullptr) return exit_code;
  absl::StatusOr<v1::Job> job = FetchJob(*conn, options.job_id);
  if (!job.ok()) return ReportError(io, job.status());
  if (options.follow) return FollowLogs(*conn, *job, options.reconnect_timeout, io);

  grpc::ClientContext context;
  conn->SetUnaryDeadline(&context);
  v1::GetJobLogsRequest request;
  request.set_job_id(options.job_id);
  v1::GetJobLogsResponse response;
  grpc::Status status = conn->jobs().GetJobLogs(&context, request, &response);
  if (!status.ok()) return ReportError(io, conn->RpcError(status, "GetJobLogs"));
  const bool with_rank = job->spec().resources().workers() > 1;
  for (const v1::LogLine& line : response.lines()) {
    *io.out << LogLineText(line, with_rank) << "\n";
  }
  io.out->flush();
  return kExitOk;
}

int RunCancel(const ConnectOptions& connect, const CancelOptions& options, const Io& io) {
  int exit_code = kExitOk;
  std::unique_ptr<Connection> conn = OpenOrReport(connect, io, &exit_code);
  if (conn == nullptr) return exit_code;
  grpc::ClientContext context;
  conn->SetUnaryDeadline(&context);
  v1::CancelJobRequest request;
  request.set_job_id(options.job_id);
  v1::Job job;
  grpc::Status status = conn->jobs().CancelJob(&context, request, &job);
  if (!status.ok()) return ReportError(io, conn->RpcError(status, "CancelJob"));
  *io.out << "job " << options.job_id << " " << JobStateName(job.state()) << "\n" << std::flush;
  return kExitOk;
}

int RunWorkers(const ConnectOptions& connect, const WorkersOptions& options, const Io& io) {
  int exit_code = kExitOk;
  std::unique_ptr<Connection> conn = OpenOrReport(connect, io, &exit_code);
  if (conn == nullptr) return exit_code;
  grpc::ClientContext context;
  conn->SetUnaryDeadline(&context);
  v1::ListWorkersResponse response;
  grpc::Status status = conn->workers().ListWorkers(&context, v1::ListWorkersRequest(), &response);
  if (!status.ok()) return ReportError(io, conn->RpcError(status, "ListWorkers"));
  if (options.format != OutputFormat::kHuman) return PrintMessage(io, response, options.format);
  if (response.workers().empty()) {
    *io.out << "no workers registered\n" << std::flush;
    return kExitOk;
  }
  *io.out << WorkersTable(response, io.clock()) << std::flush;
  return kExitOk;
}

}  // namespace boulder::client
