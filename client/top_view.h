// The screen of `boulder top`: a summary line, the workers (backend, GPU, memory, state, job,
// latest step time) and the jobs (active ones, then the most recently ended). Pure function of
// the coordinator's ListWorkers / ListJobs answers; thread-safe.
#ifndef BOULDER_CLIENT_TOP_VIEW_H_
#define BOULDER_CLIENT_TOP_VIEW_H_

#include <string>

#include "absl/time/time.h"
#include "boulder/v1/job.pb.h"
#include "boulder/v1/worker.pb.h"

namespace boulder::client {

struct TopViewOptions {
  std::string coordinator;  // the address shown in the summary line
  absl::Time now;           // shown in the summary line, in `zone`
  absl::TimeZone zone = absl::UTCTimeZone();
  // Terminal size: each line is cut to fewer than `width` columns and the screen to
  // `height` - 1 lines (the jobs table loses its last rows first). 0: no limit (not a
  // terminal).
  int width = 0;
  int height = 0;
  // Ended jobs shown after the active ones, newest first.
  int ended_jobs = 5;
  // A line under the summary, e.g. why the last refresh failed; empty: none.
  std::string notice;
  // The last line, e.g. "q or Ctrl-C to quit"; empty: none.
  std::string footer;
};

// The screen, one '\n'-terminated line each:
//   boulder top  127.0.0.1:7070  10:15:03  workers 2 (1 busy)  jobs 1 running, 2 queued
//
//   WORKERS
//   ID    BACKEND   GPU              MEMORY             STATE   JOB   STEP-TIME
//   w-1   cuda      H200 (sm_90)     9.50 GiB / 141 GiB BUSY    7     41.2 ms
//
//   JOBS
//   ID   NAME      STATE     STEP      LOSS
//   7    minigpt   RUNNING   120/200   0.4321
// MEMORY is the trainer's allocated bytes over the device's (a busy worker's latest report),
// else the GPU's total; STEP-TIME the busy worker's latest step time.
std::string RenderTop(const v1::ListWorkersResponse& workers, const v1::ListJobsResponse& jobs,
                      const TopViewOptions& options);

}  // namespace boulder::client

#endif  // BOULDER_CLIENT_TOP_VIEW_H_
