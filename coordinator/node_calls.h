// NodeCalls: every call the coordinator makes to its prefill and decode nodes, behind one
// interface, so that the request driver (request_driver.h) runs against scripted nodes in tests.
// GrpcNodeCalls is the real one: one channel and stub pair per node address, created on first
// use. A failed call's status names the call and node where the caller needs it ("Reserve on
// decode-0@3: ...", "Prefill on prefill-1@2: ...") and keeps the node's ErrorReason
// (common/base/error_reason.h): decisions read the reason and the code, never the message.
//
//   GrpcNodeCalls calls;
//   absl::StatusOr<v1::ReserveResponse> r = calls.Reserve(d, reserve_request, absl::Seconds(5));
//   std::unique_ptr<NodeStream<v1::TokenEvent>> s = calls.StreamTokens(d, stream_request);
//   // its reader thread:  while (s->Read(&event)) {...}  absl::Status status = s->Finish();
//   // any thread:         s->Cancel();  // Read returns false soon after
#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/node_registry.h"
#include "duet/v1/decode.grpc.pb.h"
#include "duet/v1/prefill.grpc.pb.h"

namespace duet::coordinator {

// One server-streaming call. It starts with the first Read (on the reader's thread: starting a
// call may block); Read and Finish belong to that one thread, Cancel to any thread.
template <typename T>
class NodeStream {
 public:
  virtual ~NodeStream() = default;
  // The next message; false once the call is over (ended, failed or cancelled).
  virtual bool Read(T* message) = 0;
  // Once Read returned false: the call's status.
  virtual absl::Status Finish() = 0;
  // Any time, before the first Read too: ends the call; Read returns false soon after.
  virtual void Cancel() = 0;
};

class NodeCalls {
 public:
  virtual ~NodeCalls() = default;
  // DecodeNode.Reserve, within `timeout`. Errors: "Reserve on <decode>: ...".
  virtual absl::StatusOr<v1::ReserveResponse> Reserve(const NodeInfo& decode,
                                                      const v1::ReserveRequest& request,
                                                      absl::Duration timeout) = 0;
  virtual absl::Status Release(const NodeInfo& decode, const v1::ReleaseRequest& request,
                               absl::Duration timeout) = 0;
  virtual absl::Status CancelPrefill(const NodeInfo& prefill,
                                     const v1::CancelPrefillRequest& request,
                                     absl::Duration timeout) = 0;
  // PrefillNode.Prefill, within `timeout`. Finish's errors: "Prefill on <prefill>: ...".
  virtual std::unique_ptr<NodeStream<v1::PrefillResponse>> Prefill(
      const NodeInfo& prefill, const v1::PrefillRequest& request, absl::Duration timeout) = 0;
  // DecodeNode.StreamTokens, without a deadline (it lasts as long as the decode).
  virtual std::unique_ptr<NodeStream<v1::TokenEvent>> StreamTokens(
      const NodeInfo& decode, const v1::StreamTokensRequest& request) = 0;
};

class GrpcNodeCalls final : public NodeCalls {
 public:
  GrpcNodeCalls() = default;
  GrpcNodeCalls(const GrpcNodeCalls&) = delete;
  GrpcNodeCalls& operator=(const GrpcNodeCalls&) = delete;

  absl::StatusOr<v1::ReserveResponse> Reserve(const NodeInfo& decode,
                                              const v1::ReserveRequest& request,
                                              absl::Duration timeout) override;
  absl::Status Release(const NodeInfo& decode, const v1::ReleaseRequest& request,
                       absl::Duration timeout) override;
  absl::Status CancelPrefill(const NodeInfo& prefill, const v1::CancelPrefillRequest& request,
                             absl::Duration timeout) override;
  std::unique_ptr<NodeStream<v1::PrefillResponse>> Prefill(const NodeInfo& prefill,
                                                           const v1::PrefillRequest& request,
                                                           absl::Duration timeout) override;
  std::unique_ptr<NodeStream<v1::TokenEvent>> StreamTokens(
      const NodeInfo& decode, const v1::StreamTokensRequest& request) override;

  // Stubs for one node address.
  struct Stubs {
    std::unique_ptr<v1::DecodeNode::Stub> decode;
    std::unique_ptr<v1::PrefillNode::Stub> prefill;
  };

 private:
  std::shared_ptr<Stubs> StubsFor(const std::string& address);

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Stubs>> stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace duet::coordinator
