#include "proto/status_util.h"

#include <string>

#include "common/base/error_reason.h"
#include "gtest/gtest.h"

namespace duet::rpc {
namespace {

struct CodePair {
  absl::StatusCode absl_code;
  grpc::StatusCode grpc_code;
};

// Written out by hand (not derived from the numeric values) so a wrong arm in either switch fails.
constexpr CodePair kPairs[] = {
    {absl::StatusCode::kOk, grpc::StatusCode::OK},
    {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
    {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
    {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
    {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
    {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
    {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
    {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
    {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
    {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
    {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
    {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
    {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
    {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
    {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
    {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
    {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
};

TEST(StatusUtilTest, EveryCanonicalCodeMapsOneToOne) {
  for (const CodePair& p : kPairs) {
    EXPECT_EQ(ToGrpcCode(p.absl_code), p.grpc_code) << absl::StatusCodeToString(p.absl_code);
    EXPECT_EQ(FromGrpcCode(p.grpc_code), p.absl_code) << absl::StatusCodeToString(p.absl_code);
  }
  // One to one: no two absl codes land on the same gRPC code.
  for (const CodePair& a : kPairs) {
    for (const CodePair& b : kPairs) {
      if (a.absl_code != b.absl_code) {
        EXPECT_NE(ToGrpcCode(a.absl_code), ToGrpcCode(b.absl_code));
      }
    }
  }
}

TEST(StatusUtilTest, StatusRoundTripKeepsCodeAndMessage) {
  for (const CodePair& p : kPairs) {
    if (p.absl_code == absl::StatusCode::kOk) continue;
    const std::string msg = "request r7: " + absl::StatusCodeToString(p.absl_code);
    absl::Status original(p.absl_code, msg);
    grpc::Status g = ToGrpcStatus(original);
    EXPECT_EQ(g.error_code(), p.grpc_code);
    EXPECT_EQ(g.error_message(), msg);
    absl::Status back = FromGrpcStatus(g);
    EXPECT_EQ(back, original);
  }
}

TEST(StatusUtilTest, OkIsOkBothWays) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK, "Reserve").ok());
}

TEST(StatusUtilTest, NonCanonicalCodesBecomeUnknownAndKeepTheNumber) {
  absl::Status odd(static_cast<absl::StatusCode>(42), "odd");
  grpc::Status g = ToGrpcStatus(odd);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_NE(g.error_message().find("42"), std::string::npos) << g.error_message();
  EXPECT_NE(g.error_message().find("odd"), std::string::npos);

  grpc::Status godd(static_cast<grpc::StatusCode>(99), "weird");
  absl::Status a = FromGrpcStatus(godd);
  EXPECT_EQ(a.code(), absl::StatusCode::kUnknown);
  EXPECT_NE(a.message().find("99"), absl::string_view::npos) << a.message();
}

TEST(StatusUtilTest, ContextIsPrefixedAndCodeKept) {
  grpc::Status g(grpc::StatusCode::RESOURCE_EXHAUSTED, "no free blocks");
  absl::Status a = FromGrpcStatus(g, "Reserve on decode-0");
  EXPECT_EQ(a.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.message(), "Reserve on decode-0: no free blocks");
}

// The machine-readable reason survives the trip (and the context added on the way); a status
// without one, or with details that are not duet's, has none.
TEST(StatusUtilTest, ErrorReasonTravelsOverGrpc) {
  const absl::Status fenced = WithReason(absl::UnavailableError("sender 'prefill-0' is fenced"),
                                         ErrorReason::kSenderFenced);
  const grpc::Status g = ToGrpcStatus(fenced);
  EXPECT_FALSE(g.error_details().empty());
  const absl::Status back = FromGrpcStatus(g, "Reserve on decode-0");
  EXPECT_EQ(back.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(back.message(), "Reserve on decode-0: sender 'prefill-0' is fenced");
  EXPECT_EQ(ReasonOf(back), ErrorReason::kSenderFenced);
  EXPECT_EQ(ReasonOf(FromGrpcStatus(ToGrpcStatus(
                WithReason(absl::UnavailableError("x"), ErrorReason::kSenderUnreachable)))),
            ErrorReason::kSenderUnreachable);
  EXPECT_EQ(ReasonOf(FromGrpcStatus(ToGrpcStatus(absl::UnavailableError("x")))),
            ErrorReason::kNone);
  EXPECT_TRUE(ToGrpcStatus(absl::UnavailableError("x")).error_details().empty());
  EXPECT_EQ(ReasonOf(FromGrpcStatus(
                grpc::Status(grpc::StatusCode::UNAVAILABLE, "x", "\xff not a detail"))),
            ErrorReason::kNone);
}

}  // namespace
}  // namespace duet::rpc
