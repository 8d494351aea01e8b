#include "coordinator/node_calls.h"

#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/channel.h"
#include "proto/status_util.h"

namespace duet::coordinator {
namespace {

// A server-streaming gRPC call, started by the first Read. Cancel may come first: gRPC then
// cancels the call as soon as it starts.
template <typename T>
class GrpcStream final : public NodeStream<T> {
 public:
  using Start = std::function<std::unique_ptr<grpc::ClientReader<T>>(grpc::ClientContext*)>;

  // `stubs` outlive the call; `context` ("Prefill on p0@1") prefixes Finish's error, if set.
  GrpcStream(std::shared_ptr<GrpcNodeCalls::Stubs> stubs, Start start, std::string context)
      : stubs_(std::move(stubs)), start_(std::move(start)), context_(std::move(context)) {}

  grpc::ClientContext& context() { return ctx_; }

  bool Read(T* message) override {
    if (reader_ == nullptr) reader_ = start_(&ctx_);
    return reader_->Read(message);
  }
  absl::Status Finish() override {
    if (reader_ == nullptr) reader_ = start_(&ctx_);
    const grpc::Status s = reader_->Finish();
    return context_.empty() ? rpc::FromGrpcStatus(s) : rpc::FromGrpcStatus(s, context_);
  }
  void Cancel() override { ctx_.TryCancel(); }

 private:
  std::shared_ptr<GrpcNodeCalls::Stubs> stubs_;
  Start start_;
  const std::string context_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<T>> reader_;
};

}  // namespace

std::shared_ptr<GrpcNodeCalls::Stubs> GrpcNodeCalls::StubsFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Stubs>& s = stubs_[address];
  if (s == nullptr) {
    s = std::make_shared<Stubs>();
    std::shared_ptr<grpc::Channel> channel = rpc::MakeChannel(address);
    s->decode = v1::DecodeNode::NewStub(channel);
    s->prefill = v1::PrefillNode::NewStub(channel);
  }
  return s;
}

absl::StatusOr<v1::ReserveResponse> GrpcNodeCalls::Reserve(const NodeInfo& decode,
                                                           const v1::ReserveRequest& request,
                                                           absl::Duration timeout) {
  std::shared_ptr<Stubs> stubs = StubsFor(decode.address);
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, timeout);
  v1::ReserveResponse response;
  absl::Status s = rpc::FromGrpcStatus(stubs->decode->Reserve(&ctx, request, &response),
                                       absl::StrCat("Reserve on ", decode.node.ToString()));
  if (!s.ok()) return s;
  return response;
}

absl::Status GrpcNodeCalls::Release(const NodeInfo& decode, const v1::ReleaseRequest& request,
                                    absl::Duration timeout) {
  std::shared_ptr<Stubs> stubs = StubsFor(decode.address);
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, timeout);
  v1::ReleaseResponse response;
  return rpc::FromGrpcStatus(stubs->decode->Release(&ctx, request, &response));
}

absl::Status GrpcNodeCalls::CancelPrefill(const NodeInfo& prefill,
                                          const v1::CancelPrefillRequest& request,
                                          absl::Duration timeout) {
  std::shared_ptr<Stubs> stubs = StubsFor(prefill.address);
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, timeout);
  v1::CancelPrefillResponse response;
  return rpc::FromGrpcStatus(stubs->prefill->CancelPrefill(&ctx, request, &response));
}

std::unique_ptr<NodeStream<v1::PrefillResponse>> GrpcNodeCalls::Prefill(
    const NodeInfo& prefill, const v1::PrefillRequest& request, absl::Duration timeout) {
  std::shared_ptr<Stubs> stubs = StubsFor(prefill.address);
  v1::PrefillNode::Stub* stub = stubs->prefill.get();
  auto stream = std::make_unique<GrpcStream<v1::PrefillResponse>>(
      std::move(stubs),
      [stub, request](grpc::ClientContext* ctx) { return stub->Prefill(ctx, request); },
      absl::StrCat("Prefill on ", prefill.node.ToString()));
  rpc::SetDeadline(stream->context(), timeout);
  return stream;
}

std::unique_ptr<NodeStream<v1::TokenEvent>> GrpcNodeCalls::StreamTokens(
    const NodeInfo& decode, const v1::StreamTokensRequest& request) {
  std::shared_ptr<Stubs> stubs = StubsFor(decode.address);
  v1::DecodeNode::Stub* stub = stubs->decode.get();
  return std::make_unique<GrpcStream<v1::TokenEvent>>(
      std::move(stubs),
      [stub, request](grpc::ClientContext* ctx) { return stub->StreamTokens(ctx, request); },
      std::string());
}

}  // namespace duet::coordinator
