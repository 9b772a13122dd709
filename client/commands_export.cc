// boulder export: downloads a finished job's trained weights (JobService.ExportWeights, in
// chunks) into a file, written as FILE.part and renamed once complete.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/follow.h"
#include "client/format.h"

namespace boulder::client {

int RunExport(const ConnectOptions& connect, const ExportOptions& options, const Io& io) {
  if (options.format != "safetensors") {
    return ReportError(io, absl::InvalidArgumentError(absl::StrCat(
                               "--format ", options.format, ": only safetensors is supported")));
  }
  if (options.output.empty()) {
    return ReportError(io, absl::InvalidArgumentError("-o FILE: required"));
  }
  int exit_code = kExitOk;
  std::unique_ptr<Connection> conn = OpenOrReport(connect, io, &exit_code);
  if (conn == nullptr) return exit_code;
  const std::string part = options.output + ".part";
  std::ofstream out(part, std::ios::binary | std::ios::trunc);
  if (!out) {
    return ReportError(io, absl::FailedPreconditionError(
                               absl::StrCat(part, ": cannot create: ", std::strerror(errno))));
  }
  int64_t offset = 0, total = -1;
  while (total < 0 || offset < total) {
    grpc::ClientContext context;
    conn->SetUnaryDeadline(&context);
    v1::ExportWeightsRequest request;
    request.set_job_id(options.job_id);
    request.set_format(options.format);
    request.set_offset(offset);
    v1::ExportWeightsResponse response;
    const grpc::Status status = conn->jobs().ExportWeights(&context, request, &response);
    if (!status.ok()) {
      out.close();
      std::remove(part.c_str());
      return ReportError(io, conn->RpcError(status, "ExportWeights"));
    }
    if (total >= 0 && response.total_bytes() != total) {
      out.close();
      std::remove(part.c_str());
      return ReportError(io, absl::AbortedError("the weights changed during the download"));
    }
    total = response.total_bytes();
    if (response.data().empty() && offset < total) {
      out.close();
      std::remove(part.c_str());
      return ReportError(io, absl::InternalError("the coordinator sent an empty chunk"));
    }
    out.write(response.data().data(), static_cast<std::streamsize>(response.data().size()));
    offset += static_cast<int64_t>(response.data().size());
  }
  out.close();
  if (!out || std::rename(part.c_str(), options.output.c_str()) != 0) {
    std::remove(part.c_str());
    return ReportError(io, absl::InternalError(absl::StrCat(
                               options.output, ": cannot write: ", std::strerror(errno))));
  }
  *io.out << "wrote " << options.output << " (" << HumanBytes(total) << ", job " << options.job_id
          << ", safetensors)\n";
  io.out->flush();
  return kExitOk;
}

}  // namespace boulder::client
