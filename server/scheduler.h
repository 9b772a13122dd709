// The coordinator's scheduling policy, as pure logic over plain values: which queued jobs to
// place on which idle workers. No I/O, no clock, no locks; thread-safe.
//
// Policy:
//  - FIFO: jobs are considered in queue order (oldest first).
//  - Memory: a cuda worker whose GPU is smaller than the job's gpu_bytes is not eligible.
//  - Backend matching: a job runs on the worker kind it requires ("cpu" or "cuda"), or on
//    either when it requires none. What a spec requires is common::RequiredBackend's to say
//    (e.g. bf16 needs cuda even when resources.backend is "auto"); the caller passes that in.
//  - Gang placement: a job of N workers is placed only when N idle workers of ONE kind are
//    free at once (a job never mixes CPU and CUDA ranks); ranks 0..N-1 follow the order of
//    the idle list. A job is never half-placed. "auto" prefers CUDA when both kinds fit.
//  - Head-of-line blocking per worker kind: a job that cannot be placed holds back every later
//    job that could use any of the same worker kinds (so a large gang is not starved by a
//    stream of small jobs), and does not hold back jobs that need other kinds. A job no
//    worker kind can run holds back nothing.
#ifndef BOULDER_SERVER_SCHEDULER_H_
#define BOULDER_SERVER_SCHEDULER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace boulder::server {

// A job waiting in the queue, as the scheduler sees it (from its resolved spec).
struct QueuedJob {
  int64_t id = 0;
  std::string backend;  // the worker kind it requires: "cpu" | "cuda" | "" (either)
  int workers = 1;      // gang size
  int64_t gpu_bytes = 0;  // estimated memory per rank on a cuda worker; 0: not checked
};

// A registered worker with nothing to run.
struct IdleWorker {
  std::string id;
  std::string backend;  // capabilities.backend: "cpu" | "cuda"
  int64_t gpu_memory_bytes = 0;  // capabilities.gpu_memory_bytes; 0: unknown (not checked)
};

// Job `job_id` runs on `workers`, indexed by rank.
struct Placement {
  int64_t job_id = 0;
  std::vector<std::string> workers;
};

// Places jobs from `queue` (oldest first) on `idle` (in preference order) by the policy above.
// Each idle worker appears in at most one placement.
std::vector<Placement> Schedule(const std::vector<QueuedJob>& queue,
                                const std::vector<IdleWorker>& idle);

// The worker kinds `job` may run on, most preferred first; empty for an unknown kind.
std::vector<std::string> EligibleBackends(const QueuedJob& job);

}  // namespace boulder::server

#endif  // BOULDER_SERVER_SCHEDULER_H_
