// Threading helpers shared by the CPU ops.
//
// Every op uses OpenMP with an explicit team size (the backend's thread count, never the
// process-wide default) and static schedules. The non-GEMM ops write each output element
// from exactly one iteration, and every reduction runs over fixed-size chunks whose partials
// are combined in chunk order, so their results are bit-identical for any thread count.
#ifndef BOULDER_KERNELS_CPU_PARALLEL_H_
#define BOULDER_KERNELS_CPU_PARALLEL_H_

#include <cstddef>

namespace boulder::kernels::cpu {

// The team size for `requested` threads: requested when > 0, else the cores this process may
// run on.
int ResolveThreads(int requested);

// Below this many scalar operations a loop runs on the calling thread: waking a team costs
// a few microseconds, more than small loops (generation at batch 1) take.
inline constexpr size_t kMinParallelWork = size_t{1} << 15;

// Whether a loop of `work` scalar operations is worth a team of `threads`.
inline bool WorthParallel(int threads, size_t work) {
  return threads > 1 && work >= kMinParallelWork;
}

}  // namespace boulder::kernels::cpu

#endif  // BOULDER_KERNELS_CPU_PARALLEL_H_
