#include "worker/engine/data_parallel.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace boulder::engine {

DataParallel::DataParallel(std::unique_ptr<comm::Communicator> comm, kernels::Backend* backend,
                           Model* model)
    : comm_(std::move(comm)),
      backend_(backend),
      model_(model),
      buckets_(model->layout().Buckets()) {}

DataParallel::~DataParallel() {
  model_->set_on_bucket_ready(nullptr);
  // Nothing may still write into the model's buffers once it is gone.
  if (comm_ != nullptr) comm_->WaitAll().IgnoreError();
  if (scratch_ != nullptr) backend_->Free(scratch_);
}

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::Create(const comm::CommOptions& options,
                                                                   kernels::Backend* backend,
                                                                   Model* model) {
  if (model->options().gradient_ranks != options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data parallel: the model scales its loss gradient for ", model->options().gradient_ranks,
        " rank(s) (ModelOptions::gradient_ranks), but the world size is ", options.world_size,
        "; the summed gradients would not be the global batch's mean"));
  }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> comm =
      comm::NewCommunicator(options, backend);
  if (!comm.ok()) return comm.status();
  std::unique_ptr<DataParallel> dp(new DataParallel(*std::move(comm), backend, model));
  // Loss (1) and two 32-bit halves of each rank's checksum.
  dp->scratch_doubles_ = 1 + 2 * static_cast<size_t>(options.world_size);
  absl::StatusOr<void*> scratch = backend->Alloc(dp->scratch_doubles_ * sizeof(double));
  if (!scratch.ok()) return scratch.status();
  dp->scratch_ = *scratch;
  // Every rank initialises from the same seed already; the broadcast makes rank 0's replica
  // the truth whatever each rank computed (and checks the links end to end).
  const size_t n = model->num_params();
  if (absl::Status s = backend->Synchronize(); !s.ok()) return s;
  if (absl::Status s = dp->comm_->Broadcast(model->params(),
                                            n * kernels::DTypeSize(backend->compute_dtype()), 0);
      !s.ok()) {
    return s;
  }
  if (model->master_params() != nullptr) {
    if (absl::Status s = dp->comm_->Broadcast(
            model->master_params(), model->master_bytes(), 0);
        !s.ok()) {
      return s;
    }
  }
  return dp;
}

void DataParallel::ReduceDuringNextBackward(bool reduce) {
  if (!reduce) {
    model_->set_on_bucket_ready(nullptr);
    return;
  }
  const size_t elem = kernels::DTypeSize(backend_->compute_dtype());
  model_->set_on_bucket_ready([this, elem](int i) {
    if (!issue_error_.ok()) return;
    const Bucket& b = buckets_[i];
    // A bucket is one layer (or the embeddings, or the final LayerNorm and head): frozen
    // tensors are frozen whole layers or the embeddings, so a bucket is all trainable or has no
    // gradient at all.
    const std::optional<size_t> g = model_->GradOffset(b.offset);
    if (!g.has_value()) return;
    // A sum: each rank's loss gradient is already its share of the global batch's mean
    // (ModelOptions::gradient_ranks).
    issue_error_ = comm_->AllReduceAsync(static_cast<char*>(model_->grads()) + *g * elem, b.numel,
                                         backend_->compute_dtype(), comm::ReduceOp::kSum);
  });
}

absl::StatusOr<double> DataParallel::FinishGradients() {
  model_->set_on_bucket_ready(nullptr);
  absl::StatusOr<double> waited = comm_->WaitAll();
  if (!issue_error_.ok()) return issue_error_;
  return waited;
}

std::string DataParallel::CaptureBlocker() const {
  if (std::string(comm_->name()) == "nccl") return "";
  return absl::StrCat("the ", comm_->name(),
                      " communicator's collectives run on the host, which a CUDA graph cannot "
                      "record");
}

absl::Status DataParallel::JoinGradientsOnDevice() {
  model_->set_on_bucket_ready(nullptr);
  if (!issue_error_.ok()) return issue_error_;
  return comm_->JoinOnDevice();
}

absl::Status DataParallel::ReduceFp8AmaxesOnDevice(Fp8State* state) {
  if (absl::Status s = comm_->AllReduceAsync(state->amax(0),
                                             static_cast<size_t>(state->num_tensors()),
                                             kernels::DType::kF32, comm::ReduceOp::kMax);
      !s.ok()) {
    return s;
  }
  return comm_->JoinOnDevice();
}

absl::Status DataParallel::WaitForReplay() {
  return comm_->WaitForBackend("the replayed training step");
}

absl::StatusOr<bool> DataParallel::AllRanksTrue(bool local) {
  // The maximum of every rank's "false" flag.
  const double flag = local ? 0.0 : 1.0;
  backend_->CopyFromHost(scratch_, &flag, sizeof(double));
  if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
  if (absl::Status s = comm_->AllReduce(scratch_, 1, kernels::DType::kF64, comm::ReduceOp::kMax);
      !s.ok()) {
    return s;
  }
  double any_false = 0.0;
  backend_->CopyToHost(&any_false, scratch_, sizeof(double));
  if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
  return any_false == 0.0;
}

absl::Status DataParallel::ReduceFp8Amaxes(Fp8State* state) {
  // The communicator orders itself after the backend's stream (NCCL) or runs after the
  // synchronous CPU backend's casts (Gloo, host memory).
  return comm_->AllReduce(state->amax(0), static_cast<size_t>(state->num_tensors()),
                          kernels::DType::kF32, comm::ReduceOp::kMax);
}

absl::StatusOr<double> DataParallel::AverageLoss(double local) {
  backend_->CopyFromHost(scratch_, &local, sizeof(double));
  if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
  if (absl::Status s = comm_->AllReduce(scratch_, 1, kernels::DType::kF64, comm::ReduceOp::kAvg);
      !s.ok()) {
    return s;
  }
  double mean = 0.0;
  backend_->CopyToHost(&mean, scratch_, sizeof(double));
  if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
  return mean;
}

absl::StatusOr<uint64_t> DataParallel::LocalChecksum() {
  // Reduced where the bytes are (Backend::Checksum: on the GPU, 8 bytes come back). Hashing a
  // host copy byte by byte took 2.5 s for GPT-2's 744 MB of parameters and master weights
  // (bench/dp-gpu-2026-12-04.md).
  absl::StatusOr<uint64_t> h = backend_->Checksum(
      model_->params(), model_->num_params() * kernels::DTypeSize(backend_->compute_dtype()));
  if (!h.ok() || model_->master_params() == nullptr) return h;
  absl::StatusOr<uint64_t> master = backend_->Checksum(
      model_->master_params(), model_->master_bytes());
  if (!master.ok()) return master.status();
  return *h ^ (*master + 0x9e3779b97f4a7c15ull + (*h << 6) + (*h >> 2));
}

absl::StatusOr<uint64_t> DataParallel::CheckReplicas(int64_t step) {
  absl::StatusOr<uint64_t> mine = LocalChecksum();
  if (!mine.ok()) return mine.status();
  const int world = comm_->world_size(), rank = comm_->rank();
  // Each rank fills its own two slots (32-bit halves: exact in a double); the sum gathers all.
  std::vector<double> sums(2 * static_cast<size_t>(world), 0.0);
  sums[2 * rank] = static_cast<double>(*mine >> 32);
  sums[2 * rank + 1] = static_cast<double>(*mine & 0xffffffffull);
  double* slots = static_cast<double*>(scratch_) + 1;
  backend_->CopyFromHost(slots, sums.data(), sums.size() * sizeof(double));
  if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
  if (absl::Status s =
          comm_->AllReduce(slots, sums.size(), kernels::DType::kF64, comm::ReduceOp::kSum);
      !s.ok()) {
    return s;
  }
  backend_->CopyToHost(sums.data(), slots, sums.size() * sizeof(double));
  if (absl::Status s = backend_->Synchronize(); !s.ok()) return s;
  auto checksum = [&](int r) {
    return (static_cast<uint64_t>(sums[2 * r]) << 32) | static_cast<uint64_t>(sums[2 * r + 1]);
  };
  std::vector<std::string> diverged;
  for (int r = 1; r < world; ++r) {
    if (checksum(r) != checksum(0))
      diverged.push_back(absl::StrFormat("%d (%016x)", r, checksum(r)));
  }
  if (diverged.empty()) return checksum(0);
  return absl::InternalError(absl::StrFormat(
      "step %d: parameter replicas diverged: rank%s %s differ%s from rank 0 (checksum %016x)", step,
      diverged.size() == 1 ? "" : "s", absl::StrJoin(diverged, ", "),
      diverged.size() == 1 ? "s" : "", checksum(0)));
}

}  // namespace boulder::engine
