// Graph capture for the CUDA backend: the ops enqueued between BeginCapture() and EndCapture()
// are recorded by stream capture on the backend's stream and instantiated as one executable
// graph; Replay() launches it on the same stream.
//
// What makes recorded work safe to replay is the callers' side (backend.h): fixed buffers,
// per-step values read from device memory. Here: the capture runs in thread-local mode, so a
// forbidden call from this thread (a stream or device sync, cudaMalloc) fails the capture
// rather than running; cuBLASLt's autotuning skips capturing streams (LtMatmul::Tune); and
// once a graph exists the scratch buffer it recorded stays allocated when the scratch grows.
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_backend.h"

namespace boulder::kernels::cuda {
namespace {

class CudaGraph final : public Backend::Graph {
 public:
  CudaGraph(cudaGraph_t graph, cudaGraphExec_t exec, int64_t nodes)
      : graph_(graph), exec_(exec), nodes_(nodes) {}
  ~CudaGraph() override {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  int64_t num_nodes() const override { return nodes_; }
  cudaGraphExec_t exec() const { return exec_; }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  int64_t nodes_;
};

}  // namespace

absl::Status CudaBackend::BeginCapture() {
  if (capturing_) return absl::FailedPreconditionError("cuda backend: already capturing a graph");
  if (profiling_) {
    return absl::FailedPreconditionError(
        "cuda backend: graph capture with per-op profiling on (its events would be recorded)");
  }
  if (!sticky_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda backend: graph capture after an error: ", sticky_.message()));
  }
  JoinNormSquared();  // a capture must not wait on work enqueued before it on another stream
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Backend::Graph>> CudaBackend::EndCapture() {
  if (!capturing_)
    return absl::FailedPreconditionError("cuda backend: EndCapture without BeginCapture");
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  absl::Status failed = sticky_;
  cudaError_t err = cudaStreamEndCapture(stream_, &graph);
  if (failed.ok()) failed = CudaStatus(err, "cudaStreamEndCapture", __FILE__, __LINE__);
  cudaGraphExec_t exec = nullptr;
  size_t nodes = 0;
  if (failed.ok())
    failed = CudaStatus(cudaGraphGetNodes(graph, nullptr, &nodes), "cudaGraphGetNodes", __FILE__,
                        __LINE__);
  if (failed.ok()) {
    failed = CudaStatus(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate", __FILE__,
                        __LINE__);
  }
  if (!failed.ok()) {
    if (graph) cudaGraphDestroy(graph);
    // Nothing recorded ran, so the failure leaves no device state behind: clear it (the
    // runtime's last error too) so the same ops can run eagerly.
    cudaGetLastError();
    sticky_ = absl::OkStatus();
    return absl::Status(failed.code(), absl::StrCat("graph capture: ", failed.message()));
  }
  if (nodes > 0) {  // the graph may have recorded the scratches' addresses
    scratch_.keep_retired();
    norm_scratch_.keep_retired();
  }
  return std::make_unique<CudaGraph>(graph, exec, static_cast<int64_t>(nodes));
}

void CudaBackend::Replay(const Graph& graph) {
  if (!Ok()) return;
  if (capturing_) {
    return Fail(absl::FailedPreconditionError("cuda backend: Replay while capturing a graph"));
  }
  const auto* g = dynamic_cast<const CudaGraph*>(&graph);
  if (g == nullptr) {
    return Fail(absl::InvalidArgumentError("cuda backend: Replay of a graph it did not record"));
  }
  Check(cudaGraphLaunch(g->exec(), stream_), "cudaGraphLaunch");
}

}  // namespace boulder::kernels::cuda
