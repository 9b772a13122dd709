// dp_step_bench: what the data-parallel code path itself costs on one GPU, and how much of it
// recording the step in a CUDA graph gives back. One workload trained by RunTrainer three ways
// in one process:
//   plain     no communicator (the step replayed from a CUDA graph: training.cuda_graph auto);
//   dp eager  a 1-rank NCCL communicator, op by op (auto keeps data-parallel steps eager): the
//             bucket all-reduces on the communicator's stream, the blocking loss average (and
//             in FP8 the skip agreement and the amax reduction) and their host waits;
//   dp graph  the same communicator with the step recorded (training.cuda_graph: on).
// Over one rank NCCL moves no data between GPUs, so this measures the path's host-side and
// launch costs, not the interconnect; bench/multi_gpu.py measures several GPUs.
// Prints, per way, the median step time over the steps after --warmup, and their mean and
// maximum: the steps that also compare the replicas' checksums
// (resources.checksum_every_steps, default 10) show there.
//
//   dp_step_bench --workload gpt2 --precision fp8 --steps 30
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "worker/comm/comm_test_util.h"
#include "worker/engine/trainer.h"

namespace {

using boulder::engine::RunTrainer;
using boulder::engine::TrainerOptions;

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Way {
  const char* name;
  bool communicator;
  const char* cuda_graph;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The data-parallel path's own cost on one GPU (1-rank NCCL), eager and recorded"};
  std::string workload = "gpt2", precision = "bf16";
  int steps = 30, warmup = 5;
  app.add_option("--workload", workload, "seed | gpt2 | h2048");
  app.add_option("--precision", precision, "bf16 | fp8");
  app.add_option("--steps", steps, "optimizer steps per run");
  app.add_option("--warmup", warmup, "leading steps left out of the median");
  CLI11_PARSE(app, argc, argv);
  if (warmup >= steps) {
    std::fprintf(stderr, "dp_step_bench: --warmup %d must be below --steps %d\n", warmup, steps);
    return 2;
  }
  std::vector<std::string> sets;
  if (workload == "seed") {
    sets = {"model.preset=minigpt", "training.batch_size=32", "training.seq_len=256"};
  } else if (workload == "gpt2") {
    sets = {"model.preset=gpt2", "model.tie_embeddings=false", "training.batch_size=16",
            "training.seq_len=1024"};
  } else if (workload == "h2048") {
    sets = {"model.hidden=2048",  "model.heads=16",        "model.layers=8",       "model.ffn=8192",
            "model.context=1024", "training.batch_size=8", "training.seq_len=1024"};
  } else {
    std::fprintf(stderr, "dp_step_bench: unknown --workload %s (seed, gpt2, h2048)\n",
                 workload.c_str());
    return 2;
  }
  if (precision != "bf16" && precision != "fp8") {
    std::fprintf(stderr, "dp_step_bench: unknown --precision %s (bf16, fp8)\n", precision.c_str());
    return 2;
  }
  for (const std::string& s :
       {absl::StrCat("training.steps=", steps), std::string("training.log_every_steps=1"),
        std::string("generation.tokens=0"), std::string("checkpoint.every_steps=0"),
        std::string("resources.backend=cuda"), absl::StrCat("precision=", precision)}) {
    sets.push_back(s);
  }
  // NVLink multicast stays off (KINDS.md), as the trainer itself sets it.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  std::printf(
      "| workload | precision | way | ms/step (median) | mean | max | replayed steps |\n"
      "|---|---|---|---:|---:|---:|---:|\n");
  for (const Way& way :
       {Way{"plain", false, "auto"}, Way{"dp eager", true, "auto"}, Way{"dp graph", true, "on"}}) {
    std::vector<std::string> with = sets;
    with.push_back(absl::StrCat("training.cuda_graph=", way.cuda_graph));
    absl::StatusOr<boulder::v1::JobSpec> spec = boulder::common::LoadJobSpec("{}", with);
    if (!spec.ok()) {
      std::fprintf(stderr, "dp_step_bench: %s\n", std::string(spec.status().message()).c_str());
      return 1;
    }
    boulder::comm::TestRendezvousServer server;
    std::vector<double> seconds;
    int replayed = 0;
    TrainerOptions o;
    o.spec = *spec;
    o.job_id = 1;
    o.on_step = [&](const boulder::v1::StepReport& r) {
      if (r.step() > warmup) seconds.push_back(r.step_time_seconds());
      replayed += r.cuda_graph() ? 1 : 0;
    };
    if (way.communicator) {
      o.force_communicator = true;
      o.coordinator = server.address();
      o.security.insecure = true;
    }
    absl::Status s = RunTrainer(o);
    if (!s.ok()) {
      std::fprintf(stderr, "dp_step_bench: %s: %s\n", way.name, std::string(s.message()).c_str());
      return 1;
    }
    double sum = 0.0, max = 0.0;
    for (double x : seconds) {
      sum += x;
      max = std::max(max, x);
    }
    std::printf("| %s | %s | %s | %.3f | %.3f | %.3f | %d |\n", workload.c_str(),
                precision.c_str(), way.name, Median(seconds) * 1e3,
                seconds.empty() ? 0.0 : sum / seconds.size() * 1e3, max * 1e3, replayed);
    std::fflush(stdout);
  }
  return 0;
}
