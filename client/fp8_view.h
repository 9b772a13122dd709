// `boulder get JOB --fp8`: the FP8 scaling statistics of a job's latest step report as a
// table, one row per FP8 tensor (layer, Linear, role), like the view Transformer Engine's
// fp8_meta gives: format, scale (for the next step), the step's amax and the history's max,
// and the fractions of the step's cast elements that saturated or underflowed to zero.
#ifndef BOULDER_CLIENT_FP8_VIEW_H_
#define BOULDER_CLIENT_FP8_VIEW_H_

#include <string>

#include "boulder/v1/job.pb.h"

namespace boulder::client {

// The table, or one line saying why there is none (not an fp8 job, no report yet).
std::string Fp8Table(const v1::Job& job);

}  // namespace boulder::client

#endif  // BOULDER_CLIENT_FP8_VIEW_H_
