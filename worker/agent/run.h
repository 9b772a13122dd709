// The boulder-worker program once its flags are parsed: fill the defaults that depend on the
// environment, run the agent until SIGTERM or SIGINT, shut it down.
#ifndef BOULDER_WORKER_AGENT_RUN_H_
#define BOULDER_WORKER_AGENT_RUN_H_

#include "absl/status/status.h"
#include "worker/agent/agent.h"

namespace boulder::agent {

// An empty trainer_path becomes boulder-trainer in this executable's directory; an empty
// work_dir becomes a fresh directory under the system temp dir (TMPDIR, else /tmp).
// Errors: the executable's path or the temp directory cannot be found or created.
absl::Status ResolveDefaults(AgentOptions* options);

// Runs the agent until SIGTERM or SIGINT, then stops the trainers, reports their exits and
// returns OK. Errors are Agent::Create's (bad options), ready to print.
// REQUIRES: called from the main thread before any other thread exists, since it blocks
// SIGTERM and SIGINT for the whole process to receive them with sigwait.
absl::Status Run(AgentOptions options);

}  // namespace boulder::agent

#endif  // BOULDER_WORKER_AGENT_RUN_H_
