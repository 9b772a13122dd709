// NCCL (see communicator.h). Rendezvous: ArriveAll, then rank 0 publishes its ncclUniqueId
// under "nccl/unique_id" and the others fetch it; ncclCommInitRankConfig runs non-blocking so
// that a peer that never joins is a timeout, not a hang. Collectives run on the communicator's
// own stream, which first waits (cudaStreamWaitEvent) for the work the backend's stream had
// enqueued when the collective was issued, so bucket all-reduces overlap the rest of the
// backward. WaitAll polls the stream and ncclCommGetAsyncError against the timeout and aborts
// the communicator when it passes.
//
// NVLink SHARP (NVLS) multicast stays off unless the environment says otherwise: NCCL reads
// NCCL_NVLS_ENABLE, which is set to 0 here only when unset.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/env.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_backend.h"
#include "worker/comm/communicator.h"
#include "worker/comm/rendezvous_client.h"

namespace boulder::comm {
namespace {

// NCCL results as Status (kernels/cuda/check.h style, kept here so the kernels need no NCCL):
// a remote or system failure is UNAVAILABLE (the job's peers are gone), a bad argument
// INVALID_ARGUMENT, anything else INTERNAL.
absl::Status NcclStatus(ncclResult_t err, const char* what, const char* file, int line) {
  if (err == ncclSuccess || err == ncclInProgress) return absl::OkStatus();
  std::string msg =
      absl::StrCat(what, " failed at ", file, ":", line, ": ", ncclGetErrorString(err));
  if (err == ncclRemoteError || err == ncclSystemError) return absl::UnavailableError(msg);
  if (err == ncclInvalidArgument || err == ncclInvalidUsage) return absl::InvalidArgumentError(msg);
  return absl::InternalError(msg);
}

#define NCCL_CHECK(call)                                             \
  do {                                                               \
    absl::Status _s = NcclStatus((call), #call, __FILE__, __LINE__); \
    if (!_s.ok()) return _s;                                         \
  } while (0)

constexpr char kUniqueIdKey[] = "nccl/unique_id";
// A wait on the NCCL stream (and on a non-blocking init) polls without sleeping for its first
// kSpin (the loss average and FP8's small collectives end within it), then every kPoll (a
// sleep also takes the kernel's timer slack, 50 us by default, on top).
constexpr auto kSpin = std::chrono::microseconds(500);
constexpr auto kPoll = std::chrono::microseconds(20);

absl::StatusOr<ncclDataType_t> NcclType(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kF32:
      return ncclFloat32;
    case kernels::DType::kF64:
      return ncclFloat64;
    case kernels::DType::kBF16:
      return ncclBfloat16;
  }
  return absl::InvalidArgumentError("nccl: unknown dtype");
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kSum:
      break;
  }
  return ncclSum;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const CommOptions& options, std::unique_ptr<RendezvousClient> client,
                   cudaStream_t compute)
      : options_(options), client_(std::move(client)), compute_(compute) {}

  ~NcclCommunicator() override {
    if (comm_ != nullptr) {
      if (needs_abort_) {
        ncclCommAbort(comm_);
      } else {
        cudaStreamSynchronize(stream_);
        ncclCommDestroy(comm_);
      }
    }
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (backend_done_ != nullptr) cudaEventDestroy(backend_done_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  absl::Status Init() {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&backend_done_, cudaEventDisableTiming));
    CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
    if (absl::Status s = ArriveAll(client_.get(), options_.world_size, options_.timeout); !s.ok()) {
      return s;
    }
    ncclUniqueId id;
    if (options_.rank == 0) {
      NCCL_CHECK(ncclGetUniqueId(&id));
      absl::Status s = client_->Set(kUniqueIdKey, std::string(id.internal, sizeof(id.internal)));
      if (!s.ok()) return s;
    } else {
      absl::StatusOr<std::vector<std::string>> v = client_->Get({kUniqueIdKey}, options_.timeout);
      if (!v.ok()) return v.status();
      if ((*v)[0].size() != sizeof(id.internal)) {
        return absl::InternalError(absl::StrCat("nccl: unique id of ", (*v)[0].size(),
                                                " bytes from rank 0, expected ",
                                                sizeof(id.internal)));
      }
      std::memcpy(id.internal, (*v)[0].data(), sizeof(id.internal));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    NCCL_CHECK(ncclCommInitRankConfig(&comm_, options_.world_size, id, options_.rank, &config));
    return Poll("nccl init", /*stream_done=*/nullptr);
  }

  const char* name() const override { return "nccl"; }
  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }

  absl::Status AllReduce(void* data, size_t count, kernels::DType dtype, ReduceOp op) override {
    if (absl::Status s = AllReduceAsync(data, count, dtype, op); !s.ok()) return s;
    return WaitAll().status();
  }

  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= options_.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("broadcast: root ", root, " is not a rank of ", options_.world_size));
    }
    if (absl::Status s = Broken(); !s.ok()) return s;
    if (absl::Status s = OrderAfterCompute(); !s.ok()) return Fail("broadcast", s);
    absl::Status s = NcclStatus(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_),
                                "ncclBroadcast", __FILE__, __LINE__);
    if (s.ok()) s = Settle("ncclBroadcast");
    if (!s.ok()) return Fail("broadcast", s);
    pending_ = true;
    operation_ = "broadcast";
    return WaitAll().status();
  }

  absl::Status Barrier() override {
    return AllReduce(scratch_, 1, kernels::DType::kF32, ReduceOp::kSum);
  }

  absl::Status AllReduceAsync(void* data, size_t count, kernels::DType dtype,
                              ReduceOp op) override {
    if (absl::Status s = Broken(); !s.ok()) return s;
    absl::StatusOr<ncclDataType_t> type = NcclType(dtype);
    if (!type.ok()) return type.status();
    if (absl::Status s = OrderAfterCompute(); !s.ok()) return Fail("all-reduce", s);
    absl::Status s = NcclStatus(ncclAllReduce(data, data, count, *type, NcclOp(op), comm_, stream_),
                                "ncclAllReduce", __FILE__, __LINE__);
    if (s.ok()) s = Settle("ncclAllReduce");
    if (!s.ok()) return Fail("all-reduce", s);
    pending_ = true;
    operation_ = "all-reduce";
    return absl::OkStatus();
  }

  absl::StatusOr<double> WaitAll() override {
    if (absl::Status s = Broken(); !s.ok()) return s;
    if (!pending_) return 0.0;
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status s = RecordDone(); !s.ok()) return s;
    if (absl::Status s = Poll(operation_, done_); !s.ok()) return Fail(operation_, s);
    if (absl::Status s = BackendWaitsForDone(); !s.ok()) return s;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  absl::Status JoinOnDevice() override {
    if (absl::Status s = Broken(); !s.ok()) return s;
    if (!pending_) return absl::OkStatus();
    if (absl::Status s = RecordDone(); !s.ok()) return s;
    return BackendWaitsForDone();
  }

  absl::Status WaitForBackend(const std::string& what) override {
    if (absl::Status s = Broken(); !s.ok()) return s;
    if (cudaError_t e = cudaEventRecord(backend_done_, compute_); e != cudaSuccess) {
      return Fail(what, kernels::cuda::CudaStatus(e, "cudaEventRecord", __FILE__, __LINE__));
    }
    if (absl::Status s = Poll(what, backend_done_); !s.ok()) return Fail(what, s);
    return absl::OkStatus();
  }

 private:
  absl::Status Broken() {
    if (!explained_.has_value()) return absl::OkStatus();
    return *explained_;
  }

  absl::Status Fail(const std::string& what, const absl::Status& cause) {
    if (!explained_.has_value()) {
      needs_abort_ = true;
      explained_ = ExplainFailure(client_.get(), options_.world_size,
                                  std::min(options_.failure_grace, options_.timeout), what, cause);
    }
    return *explained_;
  }

  // done_ marks the end of everything issued on stream_ so far.
  absl::Status RecordDone() {
    if (cudaError_t e = cudaEventRecord(done_, stream_); e != cudaSuccess) {
      return Fail(operation_, kernels::cuda::CudaStatus(e, "cudaEventRecord", __FILE__, __LINE__));
    }
    return absl::OkStatus();
  }

  // Later work on the backend's stream (the optimizer) reads the reduced gradients: it waits
  // for done_, and the issued work counts as waited for.
  absl::Status BackendWaitsForDone() {
    if (cudaError_t e = cudaStreamWaitEvent(compute_, done_, 0); e != cudaSuccess) {
      return Fail(operation_,
                  kernels::cuda::CudaStatus(e, "cudaStreamWaitEvent", __FILE__, __LINE__));
    }
    pending_ = false;
    events_used_ = 0;
    return absl::OkStatus();
  }

  // Makes stream_ wait for what the backend's stream has enqueued so far.
  absl::Status OrderAfterCompute() {
    if (events_used_ == events_.size()) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      events_.push_back(e);
    }
    cudaEvent_t e = events_[events_used_++];
    CUDA_CHECK(cudaEventRecord(e, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, e, 0));
    return absl::OkStatus();
  }

  // A non-blocking communicator may still be enqueueing the last call (ncclInProgress, e.g.
  // while it connects to peers lazily): wait for that, up to the timeout, before the next.
  absl::Status Settle(const char* what) {
    const absl::Time deadline = absl::Now() + options_.timeout;
    while (true) {
      ncclResult_t async = ncclSuccess;
      NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclInProgress) return NcclStatus(async, what, __FILE__, __LINE__);
      if (absl::Now() >= deadline) {
        needs_abort_ = true;
        return absl::DeadlineExceededError(absl::StrCat(what, ": still in progress after ",
                                                        absl::FormatDuration(options_.timeout)));
      }
      std::this_thread::sleep_for(kPoll);
    }
  }

  // Waits for `event` (or, when null, for the communicator's init) while watching NCCL's
  // asynchronous error, up to the timeout.
  absl::Status Poll(const std::string& what, cudaEvent_t event) {
    const absl::Time deadline = absl::Now() + options_.timeout;
    const auto spin_until = std::chrono::steady_clock::now() + kSpin;
    while (true) {
      ncclResult_t async = ncclSuccess;
      NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        return NcclStatus(async, what.c_str(), __FILE__, __LINE__);
      }
      if (event == nullptr) {
        if (async == ncclSuccess) return absl::OkStatus();
      } else {
        cudaError_t e = cudaEventQuery(event);
        if (e == cudaSuccess) return absl::OkStatus();
        if (e != cudaErrorNotReady)
          return kernels::cuda::CudaStatus(e, "cudaEventQuery", __FILE__, __LINE__);
      }
      if (absl::Now() >= deadline) {
        needs_abort_ = true;  // the destructor aborts rather than waits
        return absl::DeadlineExceededError(
            absl::StrCat(what, ": no progress within ", absl::FormatDuration(options_.timeout)));
      }
      if (std::chrono::steady_clock::now() < spin_until) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(kPoll);
      }
    }
  }

  const CommOptions options_;
  std::unique_ptr<RendezvousClient> client_;
  cudaStream_t compute_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  cudaEvent_t backend_done_ = nullptr;  // WaitForBackend
  std::vector<cudaEvent_t> events_;
  size_t events_used_ = 0;
  float* scratch_ = nullptr;
  ncclComm_t comm_ = nullptr;
  bool pending_ = false;
  std::string operation_ = "all-reduce";
  bool needs_abort_ = false;  // a failure or timeout: abort, do not wait, on destruction
  std::optional<absl::Status> explained_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> NewNcclCommunicator(const CommOptions& options,
                                                                  kernels::Backend* backend) {
  auto* cuda = dynamic_cast<kernels::cuda::CudaBackend*>(backend);
  if (cuda == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: needs the cuda backend, got '", backend->name(), "'"));
  }
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is not in [0, ", options.world_size, ")"));
  }
  // Leave NVLink multicast off unless the operator turned it on explicitly.
  setenv(common::kEnvNcclNvlsEnable, "0", /*overwrite=*/0);
  RendezvousClientOptions ro;
  ro.coordinator = options.coordinator;
  ro.job_id = options.job_id;
  ro.attempt = options.attempt;
  ro.rank = options.rank;
  ro.security = options.security;
  absl::StatusOr<std::unique_ptr<RendezvousClient>> client = RendezvousClient::Create(ro);
  if (!client.ok()) return client.status();
  auto comm = std::make_unique<NcclCommunicator>(options, *std::move(client), cuda->stream());
  if (absl::Status s = comm->Init(); !s.ok()) return s;
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace boulder::comm
