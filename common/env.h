// Every environment variable Boulder reads, in one place.
#ifndef BOULDER_COMMON_ENV_H_
#define BOULDER_COMMON_ENV_H_

namespace boulder::common {

// The coordinator address the CLI uses when --coordinator is not given ("HOST:PORT").
inline constexpr char kEnvCoordinator[] = "BOULDER_COORDINATOR";

// When set (to anything but "0") in a trainer's environment, the backend times every op on the
// device and the trainer prints the per-op table to stderr at the end (cuda backend only).
inline constexpr char kEnvProfileKernels[] = "BOULDER_PROFILE_KERNELS";

// NCCL's switch for NVLink SHARP multicast. The NCCL communicator (worker/comm) sets it to "0"
// when unset, so multicast stays off unless an operator turns it on explicitly.
inline constexpr char kEnvNcclNvlsEnable[] = "NCCL_NVLS_ENABLE";

}  // namespace boulder::common

#endif  // BOULDER_COMMON_ENV_H_
