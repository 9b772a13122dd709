#include "server/metrics.h"

#include <string>
#include <vector>

namespace boulder::server {
namespace {

// The RPCs the coordinator serves: their duration children are built at start-up.
constexpr const char* kMethods[] = {
    "SubmitJob",      "GetJob",    "ListJobs",    "CancelJob",  "WatchJob",    "GetJobLogs",
    "RegisterWorker", "Heartbeat", "ReportSteps", "ReportExit", "ListWorkers",
    "UploadWeights",  "ExportWeights",
};

// Unary RPCs take well under a second; WatchJob streams last as long as a job, hence the tail.
const prometheus::Histogram::BucketBoundaries& RpcBuckets() {
  static const auto* const kBuckets = new prometheus::Histogram::BucketBoundaries{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 300, 3600};
  return *kBuckets;
}

const prometheus::Histogram::BucketBoundaries& QueueBuckets() {
  static const auto* const kBuckets = new prometheus::Histogram::BucketBoundaries{
      0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400};
  return *kBuckets;
}

std::string StateLabel(v1::JobState state) { return v1::JobState_Name(state); }

std::string StateLabel(v1::WorkerState state) { return v1::WorkerState_Name(state); }

}  // namespace

ServerMetrics::ServerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      jobs_(prometheus::BuildGauge()
                .Name("boulder_jobs")
                .Help("Jobs known to the coordinator, by state.")
                .Register(*registry_)),
      queue_length_(prometheus::BuildGauge()
                        .Name("boulder_queue_length")
                        .Help("Jobs waiting in the queue (state QUEUED).")
                        .Register(*registry_)
                        .Add({})),
      workers_(prometheus::BuildGauge()
                   .Name("boulder_workers")
                   .Help("Registered workers, by state.")
                   .Register(*registry_)),
      rpc_requests_(prometheus::BuildCounter()
                        .Name("boulder_rpc_requests_total")
                        .Help("RPCs served by the coordinator, by method and status code.")
                        .Register(*registry_)),
      rpc_duration_(prometheus::BuildHistogram()
                        .Name("boulder_rpc_duration_seconds")
                        .Help("Time to serve an RPC (a WatchJob stream: its whole life).")
                        .Register(*registry_)),
      submit_to_running_(prometheus::BuildHistogram()
                             .Name("boulder_job_submit_to_running_seconds")
                             .Help("Time from a job's submission to its first step report.")
                             .Register(*registry_)
                             .Add({}, QueueBuckets())),
      heartbeats_missed_(prometheus::BuildCounter()
                             .Name("boulder_heartbeats_missed_total")
                             .Help("Workers declared lost for missing heartbeats.")
                             .Register(*registry_)
                             .Add({})) {
  for (int s = v1::JobState_MIN; s <= v1::JobState_MAX; ++s) {
    auto state = static_cast<v1::JobState>(s);
    if (!v1::JobState_IsValid(s) || state == v1::JOB_STATE_UNSPECIFIED) continue;
    jobs_by_state_[state] = &jobs_.Add({{"state", StateLabel(state)}});
  }
  for (int s = v1::WorkerState_MIN; s <= v1::WorkerState_MAX; ++s) {
    auto state = static_cast<v1::WorkerState>(s);
    if (!v1::WorkerState_IsValid(s) || state == v1::WORKER_STATE_UNSPECIFIED) continue;
    workers_by_state_[state] = &workers_.Add({{"state", StateLabel(state)}});
  }
  for (const char* method : kMethods) {
    duration_by_method_[method] = &rpc_duration_.Add({{"method", method}}, RpcBuckets());
  }
}

void ServerMetrics::ObserveRpc(absl::string_view method, absl::StatusCode code, double seconds) {
  // Family::Add returns the existing child for known labels; the set is bounded by
  // methods x canonical codes.
  rpc_requests_.Add({{"method", std::string(method)}, {"code", absl::StatusCodeToString(code)}})
      .Increment();
  auto it = duration_by_method_.find(method);
  prometheus::Histogram& h =
      it != duration_by_method_.end()
          ? *it->second
          : rpc_duration_.Add({{"method", std::string(method)}}, RpcBuckets());
  h.Observe(seconds);
}

void ServerMetrics::SetJobCounts(const std::map<v1::JobState, int64_t>& counts) {
  for (auto& [state, gauge] : jobs_by_state_) {
    auto it = counts.find(state);
    gauge->Set(it == counts.end() ? 0.0 : static_cast<double>(it->second));
  }
  auto queued = counts.find(v1::QUEUED);
  queue_length_.Set(queued == counts.end() ? 0.0 : static_cast<double>(queued->second));
}

void ServerMetrics::SetWorkerCounts(const std::map<v1::WorkerState, int64_t>& counts) {
  for (auto& [state, gauge] : workers_by_state_) {
    auto it = counts.find(state);
    gauge->Set(it == counts.end() ? 0.0 : static_cast<double>(it->second));
  }
}

void ServerMetrics::ObserveSubmitToRunning(double seconds) { submit_to_running_.Observe(seconds); }

void ServerMetrics::IncHeartbeatsMissed() { heartbeats_missed_.Increment(); }

}  // namespace boulder::server
