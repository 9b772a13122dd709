#include "server/scheduler.h"

#include <algorithm>
#include <set>

namespace boulder::server {

std::vector<std::string> EligibleBackends(const QueuedJob& job) {
  if (job.backend.empty()) return {"cuda", "cpu"};
  if (job.backend == "cpu" || job.backend == "cuda") return {job.backend};
  return {};
}

std::vector<Placement> Schedule(const std::vector<QueuedJob>& queue,
                                const std::vector<IdleWorker>& idle) {
  std::vector<bool> taken(idle.size(), false);
  std::set<std::string> blocked;  // worker kinds an earlier unplaced job is waiting for
  std::vector<Placement> placements;
  for (const QueuedJob& job : queue) {
    std::vector<std::string> kinds = EligibleBackends(job);
    bool held_back = std::any_of(kinds.begin(), kinds.end(),
                                 [&](const std::string& k) { return blocked.count(k) > 0; });
    if (held_back) continue;
    const size_t needed = static_cast<size_t>(std::max(job.workers, 1));
    bool placed = false;
    for (const std::string& kind : kinds) {
      std::vector<size_t> picks;
      for (size_t i = 0; i < idle.size() && picks.size() < needed; ++i) {
        const bool too_small = kind == "cuda" && job.gpu_bytes > 0 &&
                               idle[i].gpu_memory_bytes > 0 &&
                               idle[i].gpu_memory_bytes < job.gpu_bytes;
        if (!taken[i] && idle[i].backend == kind && !too_small) picks.push_back(i);
      }
      if (picks.size() < needed) continue;
      Placement& p = placements.emplace_back();
      p.job_id = job.id;
      for (size_t i : picks) {
        taken[i] = true;
        p.workers.push_back(idle[i].id);
      }
      placed = true;
      break;
    }
    if (!placed) blocked.insert(kinds.begin(), kinds.end());
  }
  return placements;
}

}  // namespace boulder::server
