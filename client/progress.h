// Progress rendering for `boulder watch` and `boulder submit --follow`: the in-place progress
// bar for terminals, the plain per-step line for pipes and logs, the ETA estimate and the
// throttle that keeps plain output to about one line per second.
//
// Thread-compatible: each object is used by one thread at a time.
#ifndef BOULDER_CLIENT_PROGRESS_H_
#define BOULDER_CLIENT_PROGRESS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/time/time.h"
#include "boulder/v1/job.pb.h"

namespace boulder::client {

// One line that fits in `width` terminal columns (strictly fewer, so that terminals that
// wrap at the last column do not scroll), e.g.
//   step 120/200 [█████████▌░░░░░░] loss 0.4321  lr 3.0e-04  12,345 tok/s  ETA 0:42
// The bar takes the room left (at most 40 cells, 1/8-cell resolution); when fewer than 10
// cells are left it drops, in turn, the lr, the tokens/s and finally the bar itself.
// `eta` is absl::InfiniteDuration() when unknown.
std::string RenderProgressBar(const v1::StepReport& report, absl::Duration eta, int width);

// The same figures on one plain line, for output that is not a terminal:
//   step 120/200 (60%)  loss 0.4321  lr 3.0e-04  12,345 tok/s  ETA 0:42
std::string RenderProgressLine(const v1::StepReport& report, absl::Duration eta);

// A step time as shown beside a rank: "41.2 ms" below a second, "1.52 s" from a second on.
std::string StepTimeText(double seconds);

// The latest step time of each rank on one line strictly narrower than `width`:
//   rank 0: 41.2 ms  rank 1: 43.0 ms
// When not all ranks fit, the first ones that do and "+N more".
std::string RankStepTimesLine(const std::map<int32_t, double>& seconds_by_rank, int width);

// Rows of the live loss chart under the progress bar on a terminal of `height` lines: a third
// of what the bar and the step-time line leave, at most 8; 0 (no chart) below 2.
int ChartRowsFor(int height);

// Estimates the time left from the step reports seen so far: remaining steps times a
// smoothed time per step (the reports' step_time_seconds, or the spacing of their
// timestamps when a trainer does not fill it).
class EtaEstimator {
 public:
  void Add(const v1::StepReport& report);
  // absl::InfiniteDuration() until a step time is known; zero once the last step is done.
  absl::Duration Eta() const;

 private:
  double seconds_per_step_ = 0;  // exponential moving average; 0 = unknown
  int64_t step_ = 0;
  int64_t total_ = 0;
  int64_t last_step_ = 0;
  absl::Time last_time_ = absl::InfinitePast();
};

// Decides which step reports get a plain line: the first, the last (step == total), and
// otherwise one when `min_interval` has passed or `min_fraction` of the run has been done
// since the last printed line.
class StepLineThrottle {
 public:
  explicit StepLineThrottle(absl::Duration min_interval = absl::Seconds(1),
                            double min_fraction = 0.1);
  // Returns whether to print the report of `step` (of `total`) arriving at `now`; records it
  // as printed if so.
  bool ShouldPrint(int64_t step, int64_t total, absl::Time now);

 private:
  absl::Duration min_interval_;
  double min_fraction_;
  bool printed_any_ = false;
  int64_t last_step_ = 0;
  absl::Time last_time_ = absl::InfinitePast();
};

}  // namespace boulder::client

#endif  // BOULDER_CLIENT_PROGRESS_H_
