// An in-process coordinator rendezvous service on 127.0.0.1 for the comm tests.
#ifndef BOULDER_WORKER_COMM_COMM_TEST_UTIL_H_
#define BOULDER_WORKER_COMM_COMM_TEST_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/rendezvous.h"

namespace boulder::comm {

// Serves RendezvousService; scopes of job 1 are live while `live` is true (any attempt),
// every other job is "not running". `authorize`, when set, is the service's caller check.
class TestRendezvousServer {
 public:
  explicit TestRendezvousServer(
      std::function<absl::Status(const grpc::ServerContextBase&)> authorize = nullptr) {
    server::RendezvousOptions options;
    options.authorize = std::move(authorize);
    options.check_scope = [this](int64_t job, int32_t attempt) -> absl::Status {
      if (job == 1 && live.load()) return absl::OkStatus();
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job, " attempt ", attempt, " is not running"));
    };
    options.scope_check_period = absl::Milliseconds(50);
    service_ = std::make_unique<server::RendezvousService>(options, nullptr);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  ~TestRendezvousServer() {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_.reset();
    service_.reset();
  }

  const std::string& address() const { return address_; }
  server::RendezvousService* service() { return service_.get(); }

  std::atomic<bool> live{true};

 private:
  std::unique_ptr<server::RendezvousService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace boulder::comm

#endif  // BOULDER_WORKER_COMM_COMM_TEST_UTIL_H_
