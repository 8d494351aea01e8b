// DecodeService over a real DecodeScheduler (inproc transport), called through gRPC on an
// in-process channel (no sockets): the wire contract the coordinator relies on.
#include "decode_node/decode_service.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/base/error_reason.h"
#include "grpcpp/grpcpp.h"
#include "proto/channel.h"
#include "proto/kv_layout_convert.h"
#include "proto/sampling_convert.h"
#include "proto/status_util.h"
#include "tests/unit/decode_node/decode_test_util.h"

namespace duet::decode {
namespace {

using testing::DecodeHarness;

class DecodeServiceTest : public ::testing::Test {
 protected:
  virtual testing::HarnessOptions Options() const { return {}; }
  void SetUp() override {
    ASSERT_TRUE(h_.Init(Options()).ok());
    service_ =
        std::make_unique<DecodeService>(&h_.scheduler(),
                                        DecodeServiceIdentity{.node_id = "decode-0",
                                                              .epoch = [] { return uint64_t{7}; },
                                                              .transfer_address = "d-blob"},
                                        &h_.d_engine().tokenizer());
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::DecodeNode::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }
  void TearDown() override {
    service_->Shutdown();
    h_.scheduler().Shutdown();
    server_->Shutdown(absl::ToChronoTime(DeadlineIn(absl::Seconds(2))));
  }

  v1::ReserveRequest MakeReserve(const std::string& id, const std::vector<int32_t>& prompt,
                                 const model::SamplingParams& params) {
    v1::ReserveRequest req;
    req.set_request_id(id);
    req.set_num_tokens(static_cast<int64_t>(prompt.size()));
    req.set_prompt_tokens(static_cast<int32_t>(prompt.size()));
    req.mutable_prompt_token_ids()->Assign(prompt.begin(), prompt.end());
    *req.mutable_sampling() = rpc::ToProto(params);
    *req.mutable_expected_layout() = rpc::ToProto(h_.layout());
    req.set_deadline_ms(30000);
    req.set_sender_node_id("prefill-0");
    req.set_sender_transfer_address(h_.p_address());
    return req;
  }

  // Reads the whole stream; returns its final status.
  grpc::Status ReadAll(const std::string& id, std::vector<v1::TokenEvent>* events) {
    grpc::ClientContext ctx;
    rpc::SetDeadline(ctx, absl::Seconds(10));
    v1::StreamTokensRequest req;
    req.set_request_id(id);
    auto reader = stub_->StreamTokens(&ctx, req);
    v1::TokenEvent ev;
    while (reader->Read(&ev)) events->push_back(ev);
    return reader->Finish();
  }

  DecodeHarness h_;
  std::unique_ptr<DecodeService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::DecodeNode::Stub> stub_;
};

TEST_F(DecodeServiceTest, ReserveStreamRelease) {
  const model::SamplingParams params{
      .temperature = 0.8f, .seed = 5, .max_tokens = 14, .logprobs = 2};
  const std::vector<int32_t> prompt = h_.Encode("over the wire, seventeen");
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, absl::Seconds(5));
  v1::ReserveResponse resp;
  ASSERT_TRUE(stub_->Reserve(&ctx, MakeReserve("r1", prompt, params), &resp).ok());
  const v1::KvDestination& d = resp.destination();
  EXPECT_EQ(d.request_id(), "r1");
  EXPECT_EQ(d.decode_node().node_id(), "decode-0");
  EXPECT_EQ(d.decode_node().epoch(), 7u);
  EXPECT_EQ(d.transfer_address(), "d-blob");
  EXPECT_EQ(d.block_ids_size(), static_cast<int>((prompt.size() + 3) / 4));
  EXPECT_EQ(d.layout_fingerprint(), h_.layout().Fingerprint());
  EXPECT_EQ(d.layout().fingerprint(), h_.layout().Fingerprint());
  EXPECT_EQ(d.region_num_blocks(), h_.d_pool().num_blocks());
  EXPECT_EQ(d.num_tokens(), static_cast<int64_t>(prompt.size()));
  EXPECT_NE(d.transfer_id(), 0u);

  Reservation res{.transfer_id = d.transfer_id(),
                  .cached_blocks = d.cached_blocks(),
                  .blocks = {d.block_ids().begin(), d.block_ids().end()}};
  auto first = h_.Prefill(prompt, params, res);
  ASSERT_TRUE(first.ok()) << first.status();
  std::vector<v1::TokenEvent> events;
  grpc::Status st = ReadAll("r1", &events);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_GE(events.size(), 2u);
  EXPECT_TRUE(events[0].admitted());
  EXPECT_EQ(events[0].layer_transfer_us_size(), 2);
  EXPECT_GE(events[0].transfer_tail_us(), 0);
  std::vector<int32_t> tokens = {first->id};
  for (const v1::TokenEvent& e : events) {
    EXPECT_EQ(e.request_id(), "r1");
    if (!e.has_token()) continue;
    EXPECT_EQ(e.index(), static_cast<int>(tokens.size()));
    EXPECT_EQ(e.top_logprobs_size(), 2);
    if (e.top_logprobs_size() > 0) {
      EXPECT_FALSE(e.top_logprobs(0).text().empty());
    }
    tokens.push_back(e.token_id());
  }
  auto ref = h_.Reference(prompt, params);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(tokens, ref->generated_ids);
  EXPECT_EQ(events.back().finish_reason(), v1::FINISH_REASON_MAX_TOKENS);

  // Released after it finished and was read: unknown (not an error).
  grpc::ClientContext rctx;
  v1::ReleaseRequest rel;
  rel.set_request_id("r1");
  v1::ReleaseResponse rresp;
  ASSERT_TRUE(stub_->Release(&rctx, rel, &rresp).ok());
  EXPECT_FALSE(rresp.found());
  const kv::BlockPoolStats stats = h_.d_pool().Stats();
  EXPECT_EQ(stats.available(), stats.total);
}

TEST_F(DecodeServiceTest, ErrorsKeepTheirCodes) {
  const std::vector<int32_t> prompt = h_.Encode("errors");
  // Layout mismatch: FAILED_PRECONDITION naming both sides.
  v1::ReserveRequest req = MakeReserve("bad", prompt, {});
  kv::KvLayout other = h_.layout();
  other.block_size = 8;
  *req.mutable_expected_layout() = rpc::ToProto(other);
  grpc::ClientContext c1;
  v1::ReserveResponse resp;
  grpc::Status st = stub_->Reserve(&c1, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("decode-0"), std::string::npos) << st.error_message();
  EXPECT_NE(st.error_message().find("prefill-0"), std::string::npos) << st.error_message();
  // More than the whole pool: INVALID_ARGUMENT (it can never fit). Out of blocks now (the
  // pool is held by another reservation): RESOURCE_EXHAUSTED, which may pass.
  grpc::ClientContext c2;
  st = stub_->Reserve(&c2, MakeReserve("huge", std::vector<int32_t>(4 * 256 + 1, 66), {}), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("can never fit"), std::string::npos) << st.error_message();
  grpc::ClientContext c2a, c2b, c2c;
  v1::ReserveRequest most = MakeReserve("most", std::vector<int32_t>(4 * 250, 66), {});
  ASSERT_TRUE(stub_->Reserve(&c2a, most, &resp).ok());
  st = stub_->Reserve(&c2b, MakeReserve("more", std::vector<int32_t>(40, 67), {}), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  v1::ReleaseRequest rel;
  rel.set_request_id("most");
  v1::ReleaseResponse rel_resp;
  ASSERT_TRUE(stub_->Release(&c2c, rel, &rel_resp).ok());
  // Unknown stream: NOT_FOUND.
  std::vector<v1::TokenEvent> events;
  EXPECT_EQ(ReadAll("nope", &events).error_code(), grpc::StatusCode::NOT_FOUND);
  // KV that never lands: one ERROR event, then the stream's status says why.
  req = MakeReserve("late", prompt, {});
  req.set_deadline_ms(50);
  grpc::ClientContext c3;
  ASSERT_TRUE(stub_->Reserve(&c3, req, &resp).ok());
  st = ReadAll("late", &events);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].finish_reason(), v1::FINISH_REASON_ERROR);
}

TEST_F(DecodeServiceTest, ReleaseEndsAnOpenStreamCancelled) {
  const model::SamplingParams params{.max_tokens = 3000, .ignore_eos = true};
  const std::vector<int32_t> prompt = h_.Encode("released mid-stream");
  grpc::ClientContext ctx;
  v1::ReserveResponse resp;
  ASSERT_TRUE(stub_->Reserve(&ctx, MakeReserve("r", prompt, params), &resp).ok());
  Reservation res{
      .transfer_id = resp.destination().transfer_id(),
      .cached_blocks = resp.destination().cached_blocks(),
      .blocks = {resp.destination().block_ids().begin(), resp.destination().block_ids().end()}};
  ASSERT_TRUE(h_.Prefill(prompt, params, res).ok());
  grpc::ClientContext sctx;
  rpc::SetDeadline(sctx, absl::Seconds(10));
  v1::StreamTokensRequest sreq;
  sreq.set_request_id("r");
  auto reader = stub_->StreamTokens(&sctx, sreq);
  v1::TokenEvent ev;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(reader->Read(&ev));
  grpc::ClientContext rctx;
  v1::ReleaseRequest rel;
  rel.set_request_id("r");
  v1::ReleaseResponse rresp;
  ASSERT_TRUE(stub_->Release(&rctx, rel, &rresp).ok());
  EXPECT_TRUE(rresp.found());
  EXPECT_GT(rresp.freed_blocks(), 0);
  v1::FinishReason last = v1::FINISH_REASON_UNSPECIFIED;
  while (reader->Read(&ev)) last = ev.finish_reason();
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(last, v1::FINISH_REASON_CANCELLED);
  const kv::BlockPoolStats stats = h_.d_pool().Stats();
  EXPECT_EQ(stats.available(), stats.total);
}

// A decode node that fences the sender of a request still waiting for its KV (it never confirmed
// an abandoned transfer quiet) ends that request's stream with one ERROR event and the status
// UNAVAILABLE whose ErrorDetail keeps the reason sender_fenced: the wire contract the coordinator
// routes by (without that sender), never words in the message.
class DecodeServiceFenceTest : public DecodeServiceTest {
 protected:
  testing::HarnessOptions Options() const override {
    return {.kv_quarantine_bound = absl::Milliseconds(200)};
  }
};

TEST_F(DecodeServiceFenceTest, StreamOfATransferKilledByAFenceKeepsTheReason) {
  const model::SamplingParams params{.max_tokens = 4};
  const std::vector<int32_t> prompt = h_.Encode("a sender that stops answering");
  grpc::ClientContext c1, c2, c3;
  v1::ReserveResponse abandoned, waiting;
  ASSERT_TRUE(stub_->Reserve(&c1, MakeReserve("q", prompt, params), &abandoned).ok());
  Reservation res{.transfer_id = abandoned.destination().transfer_id(),
                  .cached_blocks = abandoned.destination().cached_blocks(),
                  .blocks = {abandoned.destination().block_ids().begin(),
                             abandoned.destination().block_ids().end()}};
  ASSERT_TRUE(h_.Prefill(prompt, params, res, /*layers_to_send=*/1).ok());
  ASSERT_TRUE(stub_->Reserve(&c2, MakeReserve("w", prompt, params), &waiting).ok());
  v1::ReleaseRequest rel;
  rel.set_request_id("q");
  v1::ReleaseResponse rel_resp;
  ASSERT_TRUE(stub_->Release(&c3, rel, &rel_resp).ok());  // quarantined; never confirmed
  std::vector<v1::TokenEvent> events;
  const grpc::Status st = ReadAll("w", &events);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].finish_reason(), v1::FINISH_REASON_ERROR);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  const absl::Status s = rpc::FromGrpcStatus(st);
  EXPECT_EQ(ReasonOf(s), ErrorReason::kSenderFenced) << s;
  EXPECT_NE(s.message().find("'prefill-0' was fenced"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace duet::decode
