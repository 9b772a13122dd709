#include "kernels/cpu/parallel.h"

#include <omp.h>

namespace boulder::kernels::cpu {

int ResolveThreads(int requested) {
  if (requested > 0) return requested;
  const int procs = omp_get_num_procs();
  return procs > 0 ? procs : 1;
}

}  // namespace boulder::kernels::cpu
