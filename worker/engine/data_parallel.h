// Data-parallel training glue between the training loop and a comm::Communicator: one model
// replica per rank, each on its own slice of every global batch (ArithmeticData::Get by rank),
// kept identical by
//   - a broadcast of rank 0's parameters (and FP32 master weights) at the start,
//   - an all-reduce (sum) of the gradients in per-layer buckets (each rank's loss gradient is
//     its share of the global batch's mean: ModelOptions::gradient_ranks), each issued as soon as
//     Backward() has finished that layer (Model::set_on_bucket_ready), overlapping the rest of
//     the backward, and waited for before the optimizer step,
//   - a periodic comparison of parameter checksums across ranks.
// The loss is averaged across ranks for reporting.
//
// FP8 (precision fp8, see fp8_state.h), as Transformer Engine's reduce_amax: before each scale
// update every FP8 tensor's amax is replaced by its maximum over the ranks, so every rank
// rolls the same amax into its history and keeps the same scales; and a step is skipped
// (non-finite loss or gradients) on every rank when it is non-finite on any.
//
// Thread-safety: none; used by the training loop's thread. The Model and Backend are not
// owned and must outlive this object.
#ifndef BOULDER_WORKER_ENGINE_DATA_PARALLEL_H_
#define BOULDER_WORKER_ENGINE_DATA_PARALLEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "worker/comm/communicator.h"
#include "worker/engine/fp8_state.h"
#include "worker/engine/model.h"
#include "worker/engine/step_graph.h"

namespace boulder::engine {

class DataParallel final : public StepCollectives {
 public:
  // Connects to the other ranks (blocking up to options.timeout) and makes every replica start
  // from rank 0's parameters. INVALID_ARGUMENT when the model's gradient_ranks is not
  // options.world_size; errors from comm::NewCommunicator and the broadcast.
  static absl::StatusOr<std::unique_ptr<DataParallel>> Create(const comm::CommOptions& options,
                                                              kernels::Backend* backend,
                                                              Model* model);
  ~DataParallel() override;

  // Whether the next Model::Backward() all-reduces its gradients bucket by bucket: true for
  // the last micro-batch of a step (earlier ones only accumulate).
  void ReduceDuringNextBackward(bool reduce);

  // Waits until every bucket's all-reduce finished; the gradients are then the average over
  // ranks. Returns the seconds spent waiting (communication not hidden behind the backward).
  absl::StatusOr<double> FinishGradients();

  // The mean of `local` over the ranks.
  absl::StatusOr<double> AverageLoss(double local);

  // Whether `local_finite` holds on every rank (false when any rank saw a non-finite loss or
  // gradient): the same answer on every rank, so all skip a step or none.
  absl::StatusOr<bool> AllRanksFinite(bool local_finite) { return AllRanksTrue(local_finite); }

  // StepCollectives: the step recorded in a CUDA graph (StepGraph), NCCL only.
  std::string CaptureBlocker() const override;
  void ReduceDuringBackward() override { ReduceDuringNextBackward(true); }
  absl::Status JoinGradientsOnDevice() override;
  absl::Status ReduceFp8AmaxesOnDevice(Fp8State* state) override;
  absl::StatusOr<bool> AllRanksTrue(bool local) override;
  absl::Status WaitForReplay() override;

  // Replaces each of `state`'s amaxes (this step's, before Fp8State::UpdateScales) by its
  // maximum over the ranks. Blocking; on CUDA the backend's stream is ordered after it.
  absl::Status ReduceFp8Amaxes(Fp8State* state);

  // Compares a checksum of the parameters (and master weights) across ranks and returns the
  // one they share. INTERNAL naming the ranks whose replica differs from rank 0's, on every
  // rank.
  absl::StatusOr<uint64_t> CheckReplicas(int64_t step);

  comm::Communicator* communicator() { return comm_.get(); }

 private:
  DataParallel(std::unique_ptr<comm::Communicator> comm, kernels::Backend* backend, Model* model);
  absl::StatusOr<uint64_t> LocalChecksum();

  std::unique_ptr<comm::Communicator> comm_;
  kernels::Backend* backend_;
  Model* model_;
  std::vector<Bucket> buckets_;
  absl::Status issue_error_;  // the first error from issuing a bucket's all-reduce
  void* scratch_ = nullptr;   // backend memory for the loss and the checksums
  size_t scratch_doubles_ = 0;
};

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_DATA_PARALLEL_H_
