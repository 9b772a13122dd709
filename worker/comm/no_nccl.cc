// NCCL in a build without CUDA.
#include "worker/comm/communicator.h"

namespace boulder::comm {

absl::StatusOr<std::unique_ptr<Communicator>> NewNcclCommunicator(const CommOptions& options,
                                                                  kernels::Backend* backend) {
  return absl::UnimplementedError("nccl: this build has no CUDA (rebuild with a CUDA toolkit)");
}

}  // namespace boulder::comm
