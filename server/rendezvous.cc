#include "server/rendezvous.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_util.h"

namespace boulder::server {
namespace {

constexpr char kSet[] = "RendezvousSet";
constexpr char kGet[] = "RendezvousGet";
constexpr size_t kMaxKeyBytes = 256;

std::string ScopeName(int64_t job_id, int32_t attempt) {
  return absl::StrCat("job ", job_id, " attempt ", attempt);
}

absl::Status CheckKey(const std::string& key) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key: must be 1 to ", kMaxKeyBytes, " bytes, got ", key.size()));
  }
  return absl::OkStatus();
}

}  // namespace

RendezvousService::RendezvousService(RendezvousOptions options, ServerMetrics* metrics)
    : options_(std::move(options)), metrics_(metrics) {
  sweeper_ = std::thread([this] { SweepLoop(); });
}

RendezvousService::~RendezvousService() {
  std::vector<Waiter> parked;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    parked.swap(waiters_);
  }
  sweeper_.join();
  for (const Waiter& w : parked) {
    Finish(w, absl::UnavailableError("the coordinator is shutting down"));
  }
}

size_t RendezvousService::NumScopes() {
  absl::MutexLock lock(&mu_);
  return table_.size();
}

void RendezvousService::Finish(const Waiter& w, const absl::Status& status) {
  if (metrics_ != nullptr) {
    metrics_->ObserveRpc(kGet, status.code(), absl::ToDoubleSeconds(absl::Now() - w.start));
  }
  w.reactor->Finish(common::ToGrpcStatus(status));
}

bool RendezvousService::TryFill(const Waiter& w) {
  auto scope = table_.find(w.scope);
  if (scope == table_.end()) return false;
  for (const std::string& key : w.keys) {
    if (scope->second.count(key) == 0) return false;
  }
  w.response->clear_values();
  for (const std::string& key : w.keys) w.response->add_values(scope->second.at(key));
  return true;
}

grpc::ServerUnaryReactor* RendezvousService::RendezvousSet(grpc::CallbackServerContext* context,
                                                           const v1::RendezvousSetRequest* request,
                                                           v1::RendezvousSetResponse* response) {
  const absl::Time start = absl::Now();
  auto finish = [&](const absl::Status& status) {
    if (metrics_ != nullptr) {
      metrics_->ObserveRpc(kSet, status.code(), absl::ToDoubleSeconds(absl::Now() - start));
    }
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(common::ToGrpcStatus(status));
    return reactor;
  };
  if (options_.authorize) {
    if (absl::Status s = options_.authorize(*context); !s.ok()) return finish(s);
  }
  if (absl::Status s = CheckKey(request->key()); !s.ok()) return finish(s);
  if (request->value().size() > options_.max_value_bytes) {
    return finish(absl::InvalidArgumentError(absl::StrCat(
        "value: ", request->value().size(), " bytes is more than ", options_.max_value_bytes)));
  }
  if (absl::Status s = options_.check_scope(request->job_id(), request->attempt()); !s.ok()) {
    return finish(s);
  }
  std::vector<Waiter> done;
  {
    absl::MutexLock lock(&mu_);
    const Scope scope{request->job_id(), request->attempt()};
    auto& keys = table_[scope];
    if (keys.count(request->key()) == 0 && keys.size() >= options_.max_keys_per_scope) {
      return finish(absl::ResourceExhaustedError(
          absl::StrCat(ScopeName(scope.first, scope.second), " already holds ",
                       options_.max_keys_per_scope, " keys")));
    }
    keys[request->key()] = request->value();
    auto first_done = std::stable_partition(waiters_.begin(), waiters_.end(), [&](const Waiter& w) {
      return !(w.scope == scope && TryFill(w));
    });
    done.assign(first_done, waiters_.end());
    waiters_.erase(first_done, waiters_.end());
  }
  for (const Waiter& w : done) Finish(w, absl::OkStatus());
  return finish(absl::OkStatus());
}

grpc::ServerUnaryReactor* RendezvousService::RendezvousGet(grpc::CallbackServerContext* context,
                                                           const v1::RendezvousGetRequest* request,
                                                           v1::RendezvousGetResponse* response) {
  Waiter w;
  w.start = absl::Now();
  w.scope = {request->job_id(), request->attempt()};
  w.keys.assign(request->keys().begin(), request->keys().end());
  w.rank = request->rank();
  w.response = response;
  w.reactor = context->DefaultReactor();
  w.deadline =
      w.start + std::min(absl::Milliseconds(std::max(0, request->wait_ms())), options_.max_wait);
  absl::Status status =
      w.keys.empty() ? absl::InvalidArgumentError("keys: empty") : absl::OkStatus();
  if (status.ok() && options_.authorize) status = options_.authorize(*context);
  for (const std::string& key : w.keys) {
    if (status.ok()) status = CheckKey(key);
  }
  if (status.ok()) status = options_.check_scope(w.scope.first, w.scope.second);
  if (!status.ok()) {
    Finish(w, status);
    return w.reactor;
  }
  {
    absl::MutexLock lock(&mu_);
    if (!TryFill(w)) {
      if (!stopping_ && w.deadline > w.start) {
        waiters_.push_back(w);
        return w.reactor;
      }
      std::vector<std::string> missing;
      const auto& keys = table_[w.scope];
      for (const std::string& key : w.keys) {
        if (keys.count(key) == 0) missing.push_back(key);
      }
      if (keys.empty()) table_.erase(w.scope);
      status = absl::DeadlineExceededError(
          absl::StrCat(ScopeName(w.scope.first, w.scope.second),
                       ": keys not set: ", absl::StrJoin(missing, ", ")));
    }
  }
  Finish(w, status);
  return w.reactor;
}

void RendezvousService::SweepLoop() {
  absl::Time next_scope_check = absl::Now() + options_.scope_check_period;
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.sweep_period);
    if (stopping_) break;
    const absl::Time now = absl::Now();
    std::vector<std::pair<Waiter, std::string>> expired;
    auto first_expired = std::stable_partition(waiters_.begin(), waiters_.end(),
                                               [&](const Waiter& w) { return w.deadline > now; });
    for (auto it = first_expired; it != waiters_.end(); ++it) {
      std::vector<std::string> missing;
      auto scope = table_.find(it->scope);
      for (const std::string& key : it->keys) {
        if (scope == table_.end() || scope->second.count(key) == 0) missing.push_back(key);
      }
      expired.emplace_back(*it, absl::StrJoin(missing, ", "));
    }
    waiters_.erase(first_expired, waiters_.end());
    std::vector<Scope> scopes;
    if (now >= next_scope_check) {
      next_scope_check = now + options_.scope_check_period;
      for (const auto& [scope, keys] : table_) scopes.push_back(scope);
    }
    // check_scope and Finish may take other locks (the coordinator's): call them unlocked.
    mu_.Unlock();
    for (const auto& [w, missing] : expired) {
      Finish(w,
             absl::DeadlineExceededError(absl::StrCat(
                 ScopeName(w.scope.first, w.scope.second), ": keys not set: ", missing, " (rank ",
                 w.rank, " waited ", absl::FormatDuration(w.deadline - w.start), ")")));
    }
    std::vector<Scope> dead;
    for (const Scope& scope : scopes) {
      if (!options_.check_scope(scope.first, scope.second).ok()) dead.push_back(scope);
    }
    mu_.Lock();
    for (const Scope& scope : dead) table_.erase(scope);
  }
}

}  // namespace boulder::server
