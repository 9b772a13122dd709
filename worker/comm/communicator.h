// Communicators: the collectives data-parallel training needs among the ranks of one job
// attempt, behind one interface with two implementations:
//   gloo  (CPU backend)  Gloo over TCP; buffers in host memory; collectives run on a
//                        communication thread so bucketed all-reduces overlap the backward.
//   nccl  (CUDA backend) NCCL; buffers in device memory; collectives run on the
//                        communicator's own CUDA stream, ordered after the compute stream's
//                        work at the time they are issued.
// Both rendezvous through the coordinator (RendezvousClient): every rank announces itself
// under "arrive/<rank>" and waits, up to the timeout, for the others; rank 0 publishes the
// NCCL unique id, or Gloo's store entries go through the same RPC.
//
// Failures: every wait has a deadline (CommOptions::timeout). When a collective fails or
// times out, the communicator is broken: the rank posts "failed/<rank>" and gives the other
// survivors a short grace to do the same; the error names the ranks that did not (dead or
// hung). Each call then returns that error. Errors:
//   DEADLINE_EXCEEDED   ranks never arrived at the rendezvous (named) or a collective timed out;
//   UNAVAILABLE         a peer closed its connection (it died) or the coordinator is gone;
//   FAILED_PRECONDITION the attempt no longer runs (the coordinator dropped its keys);
//   INVALID_ARGUMENT    bad options or an unsupported dtype/op for this implementation.
//
// Thread-safety: one thread (the trainer's) calls a Communicator; the implementation's own
// thread or stream is internal.
#ifndef BOULDER_WORKER_COMM_COMMUNICATOR_H_
#define BOULDER_WORKER_COMM_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/grpc_security.h"
#include "kernels/backend.h"

namespace boulder::comm {

// kMax: the element-wise maximum (FP8 amaxes, agreed flags); NaN handling is the library's,
// but every rank receives the same result.
enum class ReduceOp { kSum, kAvg, kMax };

struct CommOptions {
  int rank = 0;
  int world_size = 1;
  // The rendezvous scope.
  int64_t job_id = 0;
  int32_t attempt = 0;
  // The coordinator's address, "HOST:PORT". Required.
  std::string coordinator;
  // Gloo: the address this rank listens on for its peers (must be reachable from them).
  // Empty: 127.0.0.1 when the coordinator is on a loopback address, else this host's name.
  std::string host;
  // Longest wait at the rendezvous and in any one collective.
  absl::Duration timeout = absl::Seconds(60);
  // After a failure, how long the survivors wait for each other's "failed/<rank>" keys before
  // naming the ranks that posted none. Capped by `timeout`.
  absl::Duration failure_grace = absl::Seconds(3);
  // How the rendezvous client reaches the coordinator (TLS, join token).
  common::ChannelSecurityOptions security;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual const char* name() const = 0;  // "gloo" | "nccl"
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // Blocking collectives over `count` elements at `data`, which lives in the memory of the
  // backend the communicator was made for. Any pending AllReduceAsync work runs first.
  virtual absl::Status AllReduce(void* data, size_t count, kernels::DType dtype, ReduceOp op) = 0;
  virtual absl::Status Broadcast(void* data, size_t bytes, int root) = 0;
  virtual absl::Status Barrier() = 0;

  // Issues an all-reduce that runs behind the caller's later work: the data must be final
  // (host: written; CUDA: enqueued on the backend's stream) and must not be touched until
  // WaitAll(). Issued calls complete in order.
  virtual absl::Status AllReduceAsync(void* data, size_t count, kernels::DType dtype,
                                      ReduceOp op) = 0;
  // Waits until everything issued has completed (CUDA: the backend's stream is ordered after
  // it) and returns the seconds the caller spent blocked here: communication not hidden
  // behind the caller's own work.
  virtual absl::StatusOr<double> WaitAll() = 0;

  // For a training step recorded in a CUDA graph (NCCL; the others return UNIMPLEMENTED):
  // JoinOnDevice orders the backend's stream after everything issued without blocking the
  // caller (no host wait, so it can be recorded); the issued work then counts as waited for.
  virtual absl::Status JoinOnDevice() {
    return absl::UnimplementedError(absl::StrCat(name(), ": no device-side join"));
  }
  // Waits, up to the timeout, until the backend's stream has run everything enqueued on it,
  // watching for failed peers: a replayed graph with collectives in it otherwise waits forever
  // for a rank that died. `what` names the work in errors. Errors as the collectives'.
  virtual absl::Status WaitForBackend(const std::string& what) {
    return absl::UnimplementedError(absl::StrCat(name(), ": cannot wait for ", what));
  }
};

// The address Gloo listens on when CommOptions::host is empty: 127.0.0.1 when `coordinator`
// ("HOST:PORT") is on a loopback address, else this machine's host name.
std::string DefaultCommHost(const std::string& coordinator);

// A communicator for `backend` ("cpu": Gloo, "cuda": NCCL), connected to every rank of
// options.world_size. Blocks until all ranks arrived or options.timeout passed.
// `backend` is not owned and must outlive the communicator.
absl::StatusOr<std::unique_ptr<Communicator>> NewCommunicator(const CommOptions& options,
                                                              kernels::Backend* backend);

// Gloo over TCP, on host memory.
absl::StatusOr<std::unique_ptr<Communicator>> NewGlooCommunicator(const CommOptions& options);

// NCCL on `backend`'s device (a cuda backend). UNIMPLEMENTED in a build without CUDA.
absl::StatusOr<std::unique_ptr<Communicator>> NewNcclCommunicator(const CommOptions& options,
                                                                  kernels::Backend* backend);

}  // namespace boulder::comm

#endif  // BOULDER_WORKER_COMM_COMMUNICATOR_H_
