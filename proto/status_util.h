// absl::Status <-> grpc::Status, code for code: the 17 canonical codes are the same in both
// libraries (OK=0 ... UNAUTHENTICATED=16), and the message travels unchanged. A code outside
// that range becomes UNKNOWN with the original number in the message. A duet::ErrorReason
// attached to the status travels too, as a v1::ErrorDetail in the gRPC status's details.
//
//   grpc::Status Service::Reserve(...) { return duet::rpc::ToGrpcStatus(DoReserve(...)); }
//   absl::Status s = duet::rpc::FromGrpcStatus(stub->Reserve(&ctx, req, &resp));
//   absl::Status s = duet::rpc::FromGrpcStatus(status, "Reserve on decode-0");  // annotated
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace duet::rpc {

grpc::StatusCode ToGrpcCode(absl::StatusCode code);
absl::StatusCode FromGrpcCode(grpc::StatusCode code);

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);
// As above, with "context: " prefixed to the message of a non-OK status.
absl::Status FromGrpcStatus(const grpc::Status& status, std::string_view context);

}  // namespace duet::rpc
