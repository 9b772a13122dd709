#include "worker/comm/communicator.h"

#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace boulder::comm {

std::string DefaultCommHost(const std::string& coordinator) {
  std::string host = coordinator;
  if (absl::StartsWith(host, "[")) {
    host =
        host.substr(1, host.find(']') == std::string::npos ? host.size() - 1 : host.find(']') - 1);
  } else if (size_t colon = host.rfind(':'); colon != std::string::npos) {
    host = host.substr(0, colon);
  }
  if (host == "localhost" || host == "::1" || absl::StartsWith(host, "127.")) {
    return "127.0.0.1";
  }
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "127.0.0.1";
  return name;
}

absl::StatusOr<std::unique_ptr<Communicator>> NewCommunicator(const CommOptions& options,
                                                              kernels::Backend* backend) {
  if (backend->name() == "cuda") return NewNcclCommunicator(options, backend);
  if (backend->name() == "cpu") return NewGlooCommunicator(options);
  return absl::InvalidArgumentError(
      absl::StrCat("no communicator for backend '", backend->name(), "' (cpu: gloo, cuda: nccl)"));
}

}  // namespace boulder::comm
