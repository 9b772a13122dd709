// The coordinator's TLS and authorization through real gRPC channels: certificates made at run
// time by scripts/gen-certs.sh (openssl), a tokens file with two users, an admin and a join
// token, and the codes each kind of caller gets.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "boulder/v1/job.grpc.pb.h"
#include "boulder/v1/rendezvous.grpc.pb.h"
#include "boulder/v1/worker.grpc.pb.h"
#include "common/grpc_security.h"
#include "common/status_util.h"
#include "server/server.h"
#include "server/test_util.h"

namespace boulder::server {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kAlice[] = "alice-token-0123456789";
constexpr char kBob[] = "bob-token-0123456789";
constexpr char kRoot[] = "root-token-0123456789";
constexpr char kJoin[] = "join-token-0123456789abcdef";

// Certificates and the tokens file, made once for the whole suite.
class Fixtures {
 public:
  Fixtures() {
    const std::string script = BOULDER_GEN_CERTS;
    ok_ = std::system(absl::StrCat(script, " ", dir_.File("pki"), " >/dev/null").c_str()) == 0 &&
          std::system(absl::StrCat(script, " ", dir_.File("other"), " >/dev/null").c_str()) == 0;
    std::ofstream(dir_.File("tokens"))
        << "user alice " << kAlice << "\nuser bob " << kBob << "\nuser root " << kRoot
        << " admin\nworker " << kJoin << "\n";
    std::ofstream(dir_.File("not-pem")) << "hello\n";
  }
  bool ok() const { return ok_; }
  std::string Pki(const std::string& name) const { return dir_.File("pki/" + name); }
  std::string Other(const std::string& name) const { return dir_.File("other/" + name); }
  std::string File(const std::string& name) const { return dir_.File(name); }

 private:
  testing::TempDir dir_;
  bool ok_ = false;
};

Fixtures* fixtures = nullptr;

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fixtures = new Fixtures();
    ASSERT_TRUE(fixtures->ok()) << "scripts/gen-certs.sh failed (is openssl installed?)";
  }
  static void TearDownTestSuite() {
    delete fixtures;
    fixtures = nullptr;
  }

  ServerOptions Options() {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.db_path = dir_.File("boulder.db");
    options.shutdown_grace = absl::Milliseconds(200);
    options.security.cert_file = fixtures->Pki("server.pem");
    options.security.key_file = fixtures->Pki("server.key");
    options.auth_file = fixtures->File("tokens");
    return options;
  }

  void Start(ServerOptions options) {
    auto server = CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  // A TLS channel trusting the test CA, sending `token` (none when empty).
  std::shared_ptr<grpc::Channel> Channel(const std::string& token,
                                         common::ChannelSecurityOptions security = {}) {
    if (security.ca_file.empty() && !security.insecure) security.ca_file = fixtures->Pki("ca.pem");
    security.token = token;
    auto channel = common::CreateSecureChannel(server_->address(), security);
    EXPECT_TRUE(channel.ok()) << channel.status();
    return *channel;
  }

  static void SetDeadline(grpc::ClientContext* context) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  }

  grpc::Status Submit(const std::string& token, int64_t* id = nullptr) {
    auto stub = v1::JobService::NewStub(Channel(token));
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::SubmitJobRequest request;
    request.set_spec_yaml(testing::SmallSpecYaml());
    v1::SubmitJobResponse response;
    grpc::Status s = stub->SubmitJob(&context, request, &response);
    if (id != nullptr) *id = response.job().id();
    return s;
  }

  grpc::Status Get(const std::string& token, int64_t id, v1::Job* job = nullptr) {
    auto stub = v1::JobService::NewStub(Channel(token));
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::GetJobRequest request;
    request.set_job_id(id);
    v1::Job ignored;
    return stub->GetJob(&context, request, job != nullptr ? job : &ignored);
  }

  grpc::Status List(const std::string& token, v1::ListJobsResponse* response) {
    auto stub = v1::JobService::NewStub(Channel(token));
    grpc::ClientContext context;
    SetDeadline(&context);
    return stub->ListJobs(&context, v1::ListJobsRequest(), response);
  }

  grpc::Status Register(const std::string& token) {
    auto stub = v1::WorkerService::NewStub(Channel(token));
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::RegisterWorkerRequest request;
    request.mutable_capabilities()->set_backend("cpu");
    request.mutable_capabilities()->set_cpu_cores(1);
    v1::RegisterWorkerResponse response;
    return stub->RegisterWorker(&context, request, &response);
  }

  testing::TempDir dir_;
  std::unique_ptr<CoordinatorServer> server_;
};

TEST_F(SecurityTest, MissingOrWrongTokenIsUnauthenticated) {
  Start(Options());
  v1::ListJobsResponse response;
  grpc::Status none = List("", &response);
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(none.error_message(), HasSubstr("no credentials"));
  grpc::Status wrong = List("alice-token-0123456788", &response);
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(wrong.error_message(), "invalid token");
  EXPECT_EQ(Submit("").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Register("").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Register("not-the-join-token-000").error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(SecurityTest, JoinTokenOnlyForWorkerRpcsAndUserTokensOnlyForJobs) {
  Start(Options());
  EXPECT_TRUE(Register(kJoin).ok());
  grpc::Status user_register = Register(kAlice);
  EXPECT_EQ(user_register.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(user_register.error_message(), HasSubstr("join token"));
  EXPECT_EQ(Register(kRoot).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Submit(kJoin).error_code(), grpc::StatusCode::PERMISSION_DENIED);

  // Heartbeats and reports need the join token too.
  auto stub = v1::WorkerService::NewStub(Channel(kAlice));
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::HeartbeatRequest hb;
  hb.set_worker_id("w-1");
  v1::HeartbeatResponse hb_response;
  EXPECT_EQ(stub->Heartbeat(&context, hb, &hb_response).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  // Anyone authenticated may list workers.
  for (const char* token : {kAlice, kJoin}) {
    auto workers = v1::WorkerService::NewStub(Channel(token));
    grpc::ClientContext c;
    SetDeadline(&c);
    v1::ListWorkersResponse listed;
    EXPECT_TRUE(workers->ListWorkers(&c, v1::ListWorkersRequest(), &listed).ok()) << token;
    EXPECT_EQ(listed.workers_size(), 1);
  }
}

TEST_F(SecurityTest, UsersSeeOnlyTheirOwnJobsUnlessAdmin) {
  Start(Options());
  int64_t alice_job = 0;
  int64_t bob_job = 0;
  ASSERT_TRUE(Submit(kAlice, &alice_job).ok());
  ASSERT_TRUE(Submit(kBob, &bob_job).ok());

  v1::Job job;
  ASSERT_TRUE(Get(kAlice, alice_job, &job).ok());
  EXPECT_EQ(job.owner(), "alice");
  grpc::Status denied = Get(kBob, alice_job);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(denied.error_message(),
            absl::StrCat("user bob may not read job ", alice_job, ": it belongs to another user"));
  EXPECT_TRUE(Get(kRoot, alice_job).ok());

  v1::ListJobsResponse listed;
  ASSERT_TRUE(List(kBob, &listed).ok());
  ASSERT_EQ(listed.jobs_size(), 1);
  EXPECT_EQ(listed.jobs(0).id(), bob_job);
  listed.Clear();
  ASSERT_TRUE(List(kRoot, &listed).ok());
  EXPECT_EQ(listed.jobs_size(), 2);

  auto bob = v1::JobService::NewStub(Channel(kBob));
  {
    grpc::ClientContext c;
    SetDeadline(&c);
    v1::GetJobLogsRequest request;
    request.set_job_id(alice_job);
    v1::GetJobLogsResponse response;
    EXPECT_EQ(bob->GetJobLogs(&c, request, &response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext c;
    SetDeadline(&c);
    v1::WatchJobRequest request;
    request.set_job_id(alice_job);
    auto reader = bob->WatchJob(&c, request);
    v1::JobEvent event;
    EXPECT_FALSE(reader->Read(&event));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext c;
    SetDeadline(&c);
    v1::CancelJobRequest request;
    request.set_job_id(alice_job);
    v1::Job response;
    grpc::Status s = bob->CancelJob(&c, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(), HasSubstr("may not cancel"));
  }
  ASSERT_TRUE(Get(kAlice, alice_job, &job).ok());
  EXPECT_EQ(job.state(), v1::QUEUED) << "bob's refused cancel changed nothing";

  auto root = v1::JobService::NewStub(Channel(kRoot));
  grpc::ClientContext c;
  SetDeadline(&c);
  v1::CancelJobRequest request;
  request.set_job_id(alice_job);
  v1::Job cancelled;
  ASSERT_TRUE(root->CancelJob(&c, request, &cancelled).ok());
  EXPECT_EQ(cancelled.state(), v1::CANCELLED);
}

TEST_F(SecurityTest, OwnerSurvivesRestart) {
  int64_t id = 0;
  Start(Options());
  ASSERT_TRUE(Submit(kAlice, &id).ok());
  server_->Shutdown();
  server_.reset();
  Start(Options());
  EXPECT_EQ(Get(kBob, id).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  v1::Job job;
  ASSERT_TRUE(Get(kAlice, id, &job).ok());
  EXPECT_EQ(job.owner(), "alice");
}

TEST_F(SecurityTest, TlsRefusesPlaintextAndUnknownCas) {
  Start(Options());
  common::ChannelSecurityOptions plaintext;
  plaintext.insecure = true;
  auto stub = v1::JobService::NewStub(Channel(kAlice, plaintext));
  grpc::ClientContext c1;
  SetDeadline(&c1);
  v1::ListJobsResponse response;
  grpc::Status s1 = stub->ListJobs(&c1, v1::ListJobsRequest(), &response);
  EXPECT_EQ(s1.error_code(), grpc::StatusCode::UNAVAILABLE) << s1.error_message();

  common::ChannelSecurityOptions other_ca;
  other_ca.ca_file = fixtures->Other("ca.pem");
  auto stub2 = v1::JobService::NewStub(Channel(kAlice, other_ca));
  grpc::ClientContext c2;
  SetDeadline(&c2);
  EXPECT_EQ(stub2->ListJobs(&c2, v1::ListJobsRequest(), &response).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityTest, PlaintextStillChecksTokensWhenAskedTo) {
  ServerOptions options = Options();
  options.security = common::ServerSecurityOptions();
  options.security.insecure = true;
  Start(options);
  common::ChannelSecurityOptions plaintext;
  plaintext.insecure = true;
  v1::ListJobsResponse response;
  for (const auto& [token, code] : std::vector<std::pair<std::string, grpc::StatusCode>>{
           {"", grpc::StatusCode::UNAUTHENTICATED},
           {"wrong-token-0123456789", grpc::StatusCode::UNAUTHENTICATED},
           {kAlice, grpc::StatusCode::OK}}) {
    auto stub = v1::JobService::NewStub(Channel(token, plaintext));
    grpc::ClientContext c;
    SetDeadline(&c);
    grpc::Status s = stub->ListJobs(&c, v1::ListJobsRequest(), &response);
    EXPECT_EQ(s.error_code(), code) << token << ": " << s.error_message();
  }
}

TEST_F(SecurityTest, MutualTlsRequiresAClientCertificateFromTheCa) {
  ServerOptions options = Options();
  options.security.client_ca_file = fixtures->Pki("ca.pem");
  Start(options);
  v1::ListJobsResponse response;
  EXPECT_EQ(List(kAlice, &response).error_code(), grpc::StatusCode::UNAVAILABLE)
      << "no client certificate";

  common::ChannelSecurityOptions wrong;
  wrong.cert_file = fixtures->Other("client.pem");
  wrong.key_file = fixtures->Other("client.key");
  auto stub = v1::JobService::NewStub(Channel(kAlice, wrong));
  grpc::ClientContext c;
  SetDeadline(&c);
  EXPECT_EQ(stub->ListJobs(&c, v1::ListJobsRequest(), &response).error_code(),
            grpc::StatusCode::UNAVAILABLE)
      << "a client certificate from another CA";

  common::ChannelSecurityOptions good;
  good.cert_file = fixtures->Pki("client.pem");
  good.key_file = fixtures->Pki("client.key");
  auto stub2 = v1::JobService::NewStub(Channel(kAlice, good));
  grpc::ClientContext c2;
  SetDeadline(&c2);
  grpc::Status s = stub2->ListJobs(&c2, v1::ListJobsRequest(), &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// What a trainer's rendezvous channel gets without a client certificate, or with one from
// another CA, from a coordinator that requires one: gRPC says only "Socket closed" (the TLS 1.3
// client finished its handshake before the server checked the certificate), so the status is
// explained.
TEST_F(SecurityTest, ConnectionClosedAfterTheHandshakeIsExplained) {
  ServerOptions options = Options();
  options.security.client_ca_file = fixtures->Pki("ca.pem");
  Start(options);
  common::ChannelSecurityOptions none;
  none.ca_file = fixtures->Pki("ca.pem");
  common::ChannelSecurityOptions other = none;
  other.cert_file = fixtures->Other("client.pem");
  other.key_file = fixtures->Other("client.key");
  for (const common::ChannelSecurityOptions& security : {none, other}) {
    auto stub = v1::RendezvousService::NewStub(Channel(kJoin, security));
    grpc::ClientContext c;
    SetDeadline(&c);
    v1::RendezvousSetRequest request;
    request.set_job_id(1);
    request.set_attempt(1);
    request.set_key("arrive/0");
    v1::RendezvousSetResponse response;
    const absl::Status s = common::ExplainClosedConnection(
        common::FromGrpcStatus(stub->RendezvousSet(&c, request, &response)), security);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("Socket closed"));
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(security.cert_file.empty()
                              ? "pass --tls-cert and --tls-key signed by that CA"
                              : absl::StrCat("may not accept the client certificate '",
                                             security.cert_file, "'")));
  }
  // Other statuses, and plaintext channels, are left alone.
  const absl::Status refused = absl::UnavailableError("Connection refused");
  EXPECT_EQ(common::ExplainClosedConnection(refused, none), refused);
  common::ChannelSecurityOptions plaintext;
  plaintext.insecure = true;
  const absl::Status closed = absl::UnavailableError("Socket closed");
  EXPECT_EQ(common::ExplainClosedConnection(closed, plaintext), closed);
  EXPECT_EQ(common::ExplainClosedConnection(absl::NotFoundError("Socket closed"), none),
            absl::NotFoundError("Socket closed"));
}

// The trainers' rendezvous takes only the worker join token; the token is checked before the
// job and attempt are looked at.
TEST_F(SecurityTest, RendezvousNeedsTheJoinToken) {
  Start(Options());
  auto set = [this](const std::string& token) {
    auto stub = v1::RendezvousService::NewStub(Channel(token));
    grpc::ClientContext c;
    SetDeadline(&c);
    v1::RendezvousSetRequest request;
    request.set_job_id(42);
    request.set_attempt(1);
    request.set_key("arrive/0");
    request.set_value("1");
    v1::RendezvousSetResponse response;
    return stub->RendezvousSet(&c, request, &response);
  };
  grpc::Status none = set("");
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED) << none.error_message();
  EXPECT_THAT(none.error_message(), HasSubstr("no credentials"));
  grpc::Status wrong = set("join-token-0123456789abcdeX");
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED) << wrong.error_message();
  EXPECT_THAT(wrong.error_message(), HasSubstr("invalid token"));
  grpc::Status user = set(kAlice);
  EXPECT_EQ(user.error_code(), grpc::StatusCode::PERMISSION_DENIED) << user.error_message();
  grpc::Status join = set(kJoin);
  EXPECT_EQ(join.error_code(), grpc::StatusCode::NOT_FOUND) << join.error_message();
  EXPECT_THAT(join.error_message(), HasSubstr("job 42"));

  auto stub = v1::RendezvousService::NewStub(Channel(""));
  grpc::ClientContext c;
  SetDeadline(&c);
  v1::RendezvousGetRequest request;
  request.set_job_id(42);
  request.set_attempt(1);
  request.add_keys("arrive/0");
  request.set_wait_ms(0);
  v1::RendezvousGetResponse response;
  EXPECT_EQ(stub->RendezvousGet(&c, request, &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(SecurityTest, OversizedRequestIsRefusedAndTheServerGoesOn) {
  Start(Options());
  auto stub = v1::JobService::NewStub(Channel(kAlice));
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::SubmitJobRequest request;
  request.set_spec_yaml(std::string(common::kMaxServerReceiveBytes + 1024, '#'));
  v1::SubmitJobResponse response;
  EXPECT_EQ(stub->SubmitJob(&context, request, &response).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(Submit(kAlice).ok());
}

grpc::Status HealthCheck(std::shared_ptr<grpc::Channel> channel) {
  grpc::GenericStub generic(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  generic.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                    &response, [&](grpc::Status s) {
                      status = s;
                      done.Notify();
                    });
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(10))) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no answer");
  }
  return status;
}

TEST_F(SecurityTest, PlaintextHealthPortServesOnlyHealth) {
  ServerOptions options = Options();
  options.health_listen = "127.0.0.1:0";
  Start(options);
  ASSERT_NE(server_->health_address(), "");
  auto plaintext =
      grpc::CreateChannel(server_->health_address(), grpc::InsecureChannelCredentials());
  grpc::Status health = HealthCheck(plaintext);
  EXPECT_TRUE(health.ok()) << health.error_message();
  auto stub = v1::JobService::NewStub(plaintext);
  grpc::ClientContext c;
  SetDeadline(&c);
  v1::ListJobsResponse response;
  EXPECT_EQ(stub->ListJobs(&c, v1::ListJobsRequest(), &response).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(SecurityTest, HealthCheckNeedsNoToken) {
  Start(Options());
  grpc::GenericStub generic(Channel(""));
  grpc::ClientContext context;
  SetDeadline(&context);
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  generic.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                    &response, [&](grpc::Status s) {
                      status = s;
                      done.Notify();
                    });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(SecurityTest, StartRefusesBadSecurityOptions) {
  struct Case {
    std::function<void(ServerOptions&)> change;
    const char* message;
  };
  const Case cases[] = {
      {[](ServerOptions& o) { o.auth_file.clear(); }, "auth_file: a tokens file is required"},
      {[](ServerOptions& o) { o.security.cert_file.clear(); }, "tls_cert, tls_key: a server"},
      {[](ServerOptions& o) { o.security.insecure = true; }, "insecure: plaintext was asked"},
      {[](ServerOptions& o) { o.security.cert_file = fixtures->File("not-pem"); },
       "is not a PEM file"},
      {[](ServerOptions& o) { o.security.key_file = fixtures->File("missing"); },
       "tls_key: cannot read"},
      {[](ServerOptions& o) { o.auth_file = fixtures->File("not-pem"); },
       "not-pem:1: unknown entry 'hello'"},
  };
  for (const Case& c : cases) {
    ServerOptions options = Options();
    c.change(options);
    auto server = CoordinatorServer::Start(options);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(server.status().message()), HasSubstr(c.message));
  }
  // Plaintext without authentication is allowed when asked for.
  ServerOptions insecure = Options();
  insecure.security = common::ServerSecurityOptions();
  insecure.security.insecure = true;
  insecure.auth_file.clear();
  auto server = CoordinatorServer::Start(insecure);
  EXPECT_TRUE(server.ok()) << server.status();
}

}  // namespace
}  // namespace boulder::server
