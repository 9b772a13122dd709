#include "client/connection.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::client {
namespace {

TEST(ResolveCoordinatorTest, FlagThenEnvironmentThenDefault) {
  EXPECT_EQ(ResolveCoordinator("10.0.0.1:7000", "10.0.0.2:7000"), "10.0.0.1:7000");
  EXPECT_EQ(ResolveCoordinator("", "10.0.0.2:7000"), "10.0.0.2:7000");
  EXPECT_EQ(ResolveCoordinator("", ""), "127.0.0.1:7070");
  EXPECT_EQ(ResolveCoordinator("", nullptr), "127.0.0.1:7070");
}

TEST(ValidateCoordinatorAddressTest, AcceptsHostPortAndSchemes) {
  for (const char* ok : {"127.0.0.1:7070", "coordinator.local:1", "[::1]:7070",
                         "dns:///coordinator:7070", "unix:/tmp/boulder.sock"}) {
    EXPECT_TRUE(ValidateCoordinatorAddress(ok).ok()) << ok;
  }
}

TEST(ValidateCoordinatorAddressTest, RejectsWithTheFlagName) {
  for (const char* bad : {"localhost", "localhost:", ":7070", "host:0", "host:65536", "host:http",
                          "::1:7070", "[]:7070", "my host:7070"}) {
    absl::Status status = ValidateCoordinatorAddress(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(status.message(),
              std::string("--coordinator: expected HOST:PORT, got '") + bad + "'");
  }
}

TEST(ConnectFailureReasonTest, KnownGrpcMessages) {
  EXPECT_EQ(ConnectFailureReason(grpc::Status(
                grpc::StatusCode::UNAVAILABLE,
                "failed to connect to all addresses; last error: UNKNOWN: "
                "ipv4:127.0.0.1:7070: Failed to connect to remote host: Connection refused")),
            "connection refused");
  EXPECT_EQ(ConnectFailureReason(grpc::Status(
                grpc::StatusCode::UNAVAILABLE,
                "DNS resolution failed for nohost:7070: C-ares status is not ARES_SUCCESS "
                "qtype=A name=nohost is_balancer=0: Domain name not found")),
            "cannot resolve the host name");
  EXPECT_EQ(ConnectFailureReason(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                              "Socket closed: Connection reset by peer")),
            "connection reset");
  EXPECT_EQ(ConnectFailureReason(grpc::Status(grpc::StatusCode::CANCELLED, "Cancelling all calls")),
            "the coordinator shut down");
  EXPECT_EQ(ConnectFailureReason(grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed")),
            "connection closed");
}

TEST(ConnectFailureReasonTest, UnknownMessagesKeepTheirLastClause) {
  EXPECT_EQ(ConnectFailureReason(
                grpc::Status(grpc::StatusCode::UNAVAILABLE, "failed to connect: Broken Pipe")),
            "broken pipe");
  EXPECT_THAT(ConnectFailureReason(
                  grpc::Status(grpc::StatusCode::UNAVAILABLE, "failed to connect: Handshake Failed")),
              ::testing::StartsWith("TLS handshake failed: check --tls-ca"));
  EXPECT_EQ(ConnectFailureReason(grpc::Status(grpc::StatusCode::UNAVAILABLE, "")), "unavailable");
  EXPECT_EQ(
      ConnectFailureReason(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded")),
      "no answer");
}

}  // namespace
}  // namespace boulder::client
