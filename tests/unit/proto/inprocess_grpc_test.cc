// The generated services link and run, and a status crosses a real gRPC call with its code and
// message intact. Uses an in-process channel: no sockets.
#include <memory>
#include <string>

#include "duet/v1/decode.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/status_util.h"

namespace duet::rpc {
namespace {

class FakeDecode final : public v1::DecodeNode::Service {
 public:
  grpc::Status Reserve(grpc::ServerContext*, const v1::ReserveRequest* req,
                       v1::ReserveResponse* resp) override {
    if (req->num_tokens() > 64) {
      return ToGrpcStatus(absl::ResourceExhaustedError("decode-0: 4 free blocks, need 5"));
    }
    v1::KvDestination* dest = resp->mutable_destination();
    dest->set_request_id(req->request_id());
    dest->set_transfer_address(std::string("\0\1\2", 3));
    for (int b = 0; b < (req->num_tokens() + 15) / 16; ++b) dest->add_block_ids(b + 10);
    return grpc::Status::OK;
  }

  grpc::Status StreamTokens(grpc::ServerContext*, const v1::StreamTokensRequest* req,
                            grpc::ServerWriter<v1::TokenEvent>* writer) override {
    for (int i = 1; i <= 3; ++i) {
      v1::TokenEvent ev;
      ev.set_request_id(req->request_id());
      ev.set_token_id(100 + i);
      ev.set_index(i);
      ev.set_has_token(true);
      if (i == 3) ev.set_finish_reason(v1::FINISH_REASON_MAX_TOKENS);
      writer->Write(ev);
    }
    return grpc::Status::OK;
  }
};

class InProcessGrpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::DecodeNode::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  FakeDecode service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::DecodeNode::Stub> stub_;
};

TEST_F(InProcessGrpcTest, ReserveAnswersWithADestination) {
  grpc::ClientContext ctx;
  v1::ReserveRequest req;
  req.set_request_id("r1");
  req.set_num_tokens(40);
  v1::ReserveResponse resp;
  absl::Status s = FromGrpcStatus(stub_->Reserve(&ctx, req, &resp));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(resp.destination().request_id(), "r1");
  EXPECT_EQ(resp.destination().transfer_address(), std::string("\0\1\2", 3));
  ASSERT_EQ(resp.destination().block_ids_size(), 3);
  EXPECT_EQ(resp.destination().block_ids(2), 12);
}

TEST_F(InProcessGrpcTest, RefusalKeepsItsCodeAndMessageAcrossTheCall) {
  grpc::ClientContext ctx;
  v1::ReserveRequest req;
  req.set_request_id("r2");
  req.set_num_tokens(80);
  v1::ReserveResponse resp;
  absl::Status s = FromGrpcStatus(stub_->Reserve(&ctx, req, &resp), "Reserve r2");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "Reserve r2: decode-0: 4 free blocks, need 5");
}

TEST_F(InProcessGrpcTest, TokenStreamEndsWithAFinishReason) {
  grpc::ClientContext ctx;
  v1::StreamTokensRequest req;
  req.set_request_id("r3");
  auto reader = stub_->StreamTokens(&ctx, req);
  v1::TokenEvent ev;
  int n = 0;
  v1::FinishReason last = v1::FINISH_REASON_UNSPECIFIED;
  while (reader->Read(&ev)) {
    ++n;
    EXPECT_EQ(ev.token_id(), 100 + n);
    last = ev.finish_reason();
  }
  EXPECT_TRUE(FromGrpcStatus(reader->Finish()).ok());
  EXPECT_EQ(n, 3);
  EXPECT_EQ(last, v1::FINISH_REASON_MAX_TOKENS);
}

}  // namespace
}  // namespace duet::rpc
