// Gloo over TCP (see communicator.h). Rendezvous: ArriveAll, then Gloo's full-mesh connect
// through a gloo::rendezvous::Store whose keys live in the coordinator ("gloo/<key>").
// AllReduceAsync hands buckets to one communication thread, which runs them in order while the
// trainer's thread computes the next layers' gradients; blocking collectives run on the
// caller's thread after that queue drained, so the Gloo context is never used concurrently.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "worker/comm/communicator.h"
#include "worker/comm/rendezvous_client.h"

namespace boulder::comm {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// Gloo's store interface reports errors by throwing; these carry our Status text.
class CoordinatorStore final : public gloo::rendezvous::Store {
 public:
  CoordinatorStore(RendezvousClient* client, absl::Duration timeout)
      : client_(client), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status s = client_->Set(Key(key), std::string(data.begin(), data.end()));
    if (!s.ok()) throw std::runtime_error(std::string(s.message()));
  }

  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::vector<std::string>> v = client_->Get({Key(key)}, timeout_);
    if (!v.ok()) throw std::runtime_error(std::string(v.status().message()));
    return std::vector<char>((*v)[0].begin(), (*v)[0].end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, ToChrono(timeout_)); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const std::string& k : keys) full.push_back(Key(k));
    absl::StatusOr<std::vector<std::string>> v =
        client_->Get(full, absl::Milliseconds(timeout.count()));
    if (!v.ok()) throw std::runtime_error(std::string(v.status().message()));
  }

 private:
  static std::string Key(const std::string& key) { return absl::StrCat("gloo/", key); }
  RendezvousClient* client_;
  absl::Duration timeout_;
};

// What a Gloo exception means for the job: a peer that closed its socket died (UNAVAILABLE);
// a timeout is DEADLINE_EXCEEDED.
absl::Status FromGloo(const std::exception& e) {
  const std::string what = e.what();
  if (absl::StrContains(what, "Timed out") || absl::StrContains(what, "timed out") ||
      absl::StrContains(what, "timeout")) {
    return absl::DeadlineExceededError(what);
  }
  return absl::UnavailableError(what);
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(const CommOptions& options, std::unique_ptr<RendezvousClient> client,
                   std::shared_ptr<gloo::Context> context)
      : options_(options), client_(std::move(client)), context_(std::move(context)) {
    thread_ = std::thread([this] { Loop(); });
  }

  ~GlooCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  const char* name() const override { return "gloo"; }
  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }

  absl::Status AllReduce(void* data, size_t count, kernels::DType dtype, ReduceOp op) override {
    if (absl::Status s = CheckDType(dtype); !s.ok()) return s;
    if (absl::StatusOr<double> w = WaitAll(); !w.ok()) return w.status();
    return Run("all-reduce", [&] { DoAllReduce({data, count, dtype, op}); });
  }

  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= options_.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("broadcast: root ", root, " is not a rank of ", options_.world_size));
    }
    if (absl::StatusOr<double> w = WaitAll(); !w.ok()) return w.status();
    return Run("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<uint8_t*>(data), bytes);
      opts.setRoot(root);
      opts.setTimeout(ToChrono(options_.timeout));
      gloo::broadcast(opts);
    });
  }

  absl::Status Barrier() override {
    if (absl::StatusOr<double> w = WaitAll(); !w.ok()) return w.status();
    return Run("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTimeout(ToChrono(options_.timeout));
      gloo::barrier(opts);
    });
  }

  absl::Status AllReduceAsync(void* data, size_t count, kernels::DType dtype,
                              ReduceOp op) override {
    if (absl::Status s = CheckDType(dtype); !s.ok()) return s;
    std::unique_lock<std::mutex> lock(mu_);
    if (!error_.ok()) {
      lock.unlock();
      return Explained();
    }
    queue_.push_back({data, count, dtype, op});
    ++pending_;
    cv_.notify_all();
    return absl::OkStatus();
  }

  absl::StatusOr<double> WaitAll() override {
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return pending_ == 0; });
    if (!error_.ok()) {
      lock.unlock();
      return Explained();
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

 private:
  struct Task {
    void* data;
    size_t count;
    kernels::DType dtype;
    ReduceOp op;
  };

  static absl::Status CheckDType(kernels::DType dtype) {
    if (dtype != kernels::DType::kF32 && dtype != kernels::DType::kF64) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gloo all-reduce: dtype ", kernels::DTypeName(dtype), " is not supported (f32, f64)"));
    }
    return absl::OkStatus();
  }

  template <typename T>
  void AllReduceTyped(T* data, size_t count, ReduceOp op) {
    if (count == 0) return;
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, count);
    using Reduce = void (*)(void*, const void*, const void*, size_t);
    opts.setReduceFunction(op == ReduceOp::kMax ? static_cast<Reduce>(&gloo::max<T>)
                                                : static_cast<Reduce>(&gloo::sum<T>));
    opts.setTimeout(ToChrono(options_.timeout));
    gloo::allreduce(opts);
    if (op == ReduceOp::kAvg) {
      const T scale = T(1) / static_cast<T>(options_.world_size);
      for (size_t i = 0; i < count; ++i) data[i] *= scale;
    }
  }

  void DoAllReduce(const Task& t) {
    if (t.dtype == kernels::DType::kF64) {
      AllReduceTyped(static_cast<double*>(t.data), t.count, t.op);
    } else {
      AllReduceTyped(static_cast<float*>(t.data), t.count, t.op);
    }
  }

  // Runs one Gloo operation on this thread, turning an exception into the broken state.
  template <typename F>
  absl::Status Run(const char* what, F&& f) {
    bool broken;
    {
      std::lock_guard<std::mutex> lock(mu_);
      broken = !error_.ok();
    }
    if (broken) return Explained();
    try {
      f();
      return absl::OkStatus();
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = FromGloo(e);
        operation_ = what;
      }
      return Explained();
    }
  }

  // The error with the post-mortem of who failed; computed once, on the caller's thread, never
  // with mu_ held (ExplainFailure makes RPCs).
  absl::Status Explained() {
    if (!explained_.has_value()) {
      explained_ = ExplainFailure(client_.get(), options_.world_size, grace(), operation_, error_);
    }
    return *explained_;
  }

  absl::Duration grace() const { return std::min(options_.failure_grace, options_.timeout); }

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      Task t = queue_.front();
      queue_.pop_front();
      const bool broken = !error_.ok();
      lock.unlock();
      absl::Status status;
      if (!broken) {
        try {
          DoAllReduce(t);
        } catch (const std::exception& e) {
          status = FromGloo(e);
        }
      }
      lock.lock();
      if (!status.ok() && error_.ok()) {
        error_ = status;
        operation_ = "gradient all-reduce";
      }
      --pending_;
      cv_.notify_all();
    }
  }

  const CommOptions options_;
  std::unique_ptr<RendezvousClient> client_;
  std::shared_ptr<gloo::Context> context_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  int pending_ = 0;
  bool stopping_ = false;
  absl::Status error_;                     // the first failure (raw), under mu_
  std::string operation_;                  // what failed, under mu_
  std::optional<absl::Status> explained_;  // the caller's thread only
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> NewGlooCommunicator(const CommOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is not in [0, ", options.world_size, ")"));
  }
  RendezvousClientOptions ro;
  ro.coordinator = options.coordinator;
  ro.job_id = options.job_id;
  ro.attempt = options.attempt;
  ro.rank = options.rank;
  ro.security = options.security;
  absl::StatusOr<std::unique_ptr<RendezvousClient>> client = RendezvousClient::Create(ro);
  if (!client.ok()) return client.status();
  if (absl::Status s = ArriveAll(client->get(), options.world_size, options.timeout); !s.ok()) {
    return s;
  }
  std::string host = options.host;
  if (host.empty()) host = DefaultCommHost(options.coordinator);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
    context->setTimeout(ToChrono(options.timeout));
    CoordinatorStore store(client->get(), options.timeout);
    context->connectFullMesh(store, device);
    return std::unique_ptr<Communicator>(
        new GlooCommunicator(options, *std::move(client), std::move(context)));
  } catch (const std::exception& e) {
    absl::Status cause = FromGloo(e);
    return absl::Status(cause.code(), absl::StrCat("gloo connect on ", host, " (rank ",
                                                   options.rank, "): ", e.what()));
  }
}

}  // namespace boulder::comm
