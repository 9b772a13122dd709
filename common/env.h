// Every environment variable Boulder reads, in one place.
#ifndef BOULDER_COMMON_ENV_H_
#define BOULDER_COMMON_ENV_H_

namespace boulder::common {

// The coordinator address the CLI uses when --coordinator is not given ("HOST:PORT").
inline constexpr char kEnvCoordinator[] = "BOULDER_COORDINATOR";

}  // namespace boulder::common

#endif  // BOULDER_COMMON_ENV_H_
