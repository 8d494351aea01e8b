#include "proto/status_util.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/error_reason.h"
#include "duet/v1/common.pb.h"

namespace duet::rpc {

grpc::StatusCode ToGrpcCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return grpc::StatusCode::OK;
    case absl::StatusCode::kCancelled:
      return grpc::StatusCode::CANCELLED;
    case absl::StatusCode::kUnknown:
      return grpc::StatusCode::UNKNOWN;
    case absl::StatusCode::kInvalidArgument:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case absl::StatusCode::kDeadlineExceeded:
      return grpc::StatusCode::DEADLINE_EXCEEDED;
    case absl::StatusCode::kNotFound:
      return grpc::StatusCode::NOT_FOUND;
    case absl::StatusCode::kAlreadyExists:
      return grpc::StatusCode::ALREADY_EXISTS;
    case absl::StatusCode::kPermissionDenied:
      return grpc::StatusCode::PERMISSION_DENIED;
    case absl::StatusCode::kResourceExhausted:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case absl::StatusCode::kFailedPrecondition:
      return grpc::StatusCode::FAILED_PRECONDITION;
    case absl::StatusCode::kAborted:
      return grpc::StatusCode::ABORTED;
    case absl::StatusCode::kOutOfRange:
      return grpc::StatusCode::OUT_OF_RANGE;
    case absl::StatusCode::kUnimplemented:
      return grpc::StatusCode::UNIMPLEMENTED;
    case absl::StatusCode::kInternal:
      return grpc::StatusCode::INTERNAL;
    case absl::StatusCode::kUnavailable:
      return grpc::StatusCode::UNAVAILABLE;
    case absl::StatusCode::kDataLoss:
      return grpc::StatusCode::DATA_LOSS;
    case absl::StatusCode::kUnauthenticated:
      return grpc::StatusCode::UNAUTHENTICATED;
    default:
      return grpc::StatusCode::UNKNOWN;
  }
}

absl::StatusCode FromGrpcCode(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return absl::StatusCode::kOk;
    case grpc::StatusCode::CANCELLED:
      return absl::StatusCode::kCancelled;
    case grpc::StatusCode::UNKNOWN:
      return absl::StatusCode::kUnknown;
    case grpc::StatusCode::INVALID_ARGUMENT:
      return absl::StatusCode::kInvalidArgument;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::StatusCode::kDeadlineExceeded;
    case grpc::StatusCode::NOT_FOUND:
      return absl::StatusCode::kNotFound;
    case grpc::StatusCode::ALREADY_EXISTS:
      return absl::StatusCode::kAlreadyExists;
    case grpc::StatusCode::PERMISSION_DENIED:
      return absl::StatusCode::kPermissionDenied;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return absl::StatusCode::kResourceExhausted;
    case grpc::StatusCode::FAILED_PRECONDITION:
      return absl::StatusCode::kFailedPrecondition;
    case grpc::StatusCode::ABORTED:
      return absl::StatusCode::kAborted;
    case grpc::StatusCode::OUT_OF_RANGE:
      return absl::StatusCode::kOutOfRange;
    case grpc::StatusCode::UNIMPLEMENTED:
      return absl::StatusCode::kUnimplemented;
    case grpc::StatusCode::INTERNAL:
      return absl::StatusCode::kInternal;
    case grpc::StatusCode::UNAVAILABLE:
      return absl::StatusCode::kUnavailable;
    case grpc::StatusCode::DATA_LOSS:
      return absl::StatusCode::kDataLoss;
    case grpc::StatusCode::UNAUTHENTICATED:
      return absl::StatusCode::kUnauthenticated;
    default:
      return absl::StatusCode::kUnknown;
  }
}

namespace {

// A code outside the canonical range keeps its number visible in the message.
std::string MessageFor(int raw_code, bool canonical, std::string_view message) {
  if (canonical) return std::string(message);
  return absl::StrCat("[non-canonical status code ", raw_code, "] ",
                      absl::string_view(message.data(), message.size()));
}

bool IsCanonical(int raw_code) { return raw_code >= 0 && raw_code <= 16; }

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const int raw = status.raw_code();
  absl::string_view msg = status.message();
  std::string details;
  if (const ErrorReason reason = ReasonOf(status); reason != ErrorReason::kNone) {
    v1::ErrorDetail d;
    d.set_reason(ErrorReasonName(reason));
    details = d.SerializeAsString();
  }
  return grpc::Status(ToGrpcCode(status.code()),
                      MessageFor(raw, IsCanonical(raw), std::string_view(msg.data(), msg.size())),
                      details);
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const int raw = static_cast<int>(status.error_code());
  const std::string& msg = status.error_message();
  absl::Status out(FromGrpcCode(status.error_code()), MessageFor(raw, IsCanonical(raw), msg));
  if (v1::ErrorDetail d;
      !status.error_details().empty() && d.ParseFromString(status.error_details())) {
    out = WithReason(std::move(out), ErrorReasonFromName(d.reason()));
  }
  return out;
}

absl::Status FromGrpcStatus(const grpc::Status& status, std::string_view context) {
  if (status.ok()) return absl::OkStatus();
  absl::Status converted = FromGrpcStatus(status);
  absl::string_view msg = converted.message();
  return WithReason(
      absl::Status(converted.code(),
                   absl::StrCat(absl::string_view(context.data(), context.size()), ": ", msg)),
      ReasonOf(converted));
}

}  // namespace duet::rpc
