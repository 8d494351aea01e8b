// A whole DecodeNode (UCX transport with a UCX-allocated pool, gRPC server on loopback, no
// coordinator) fed by an in-process prefill side over UCX shm or tcp: tokens equal a
// single-process run, every block is free afterwards, Shutdown is idempotent.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/base/clock.h"
#include "decode_node/decode_node.h"
#include "proto/channel.h"
#include "proto/kv_layout_convert.h"
#include "proto/sampling_convert.h"
#include "tests/unit/decode_node/decode_test_util.h"

namespace duet::decode {
namespace {

class DecodeNodeUcxTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DecodeNodeUcxTest, TokensEqualLocalEngine) {
  testing::PrefillSide p;
  ASSERT_TRUE(p.Init("ucx", /*block_size=*/4, GetParam()).ok());
  const cluster::TransportKind transport = cluster::ParseTransportKind(GetParam()).value();
  auto node = DecodeNode::Start({.runtime = {.node_id = "decode-0",
                                             .model_dir = testing::TinyModelDir(),
                                             .device = compute::Device::kCpu,
                                             .threads = 1,
                                             .block_size = 4,
                                             .kv_cache_bytes = 256 << 10},
                                 .transfer = {.transport = transport}});
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_GT((*node)->port(), 0);
  EXPECT_EQ((*node)->PoolStats().total,
            static_cast<int64_t>((256 << 10) / p.layout().RegionBytes(1)));
  ASSERT_TRUE(p.ConnectTo((*node)->transfer_address()).ok());
  auto stub = v1::DecodeNode::NewStub(rpc::MakeChannel((*node)->address()));

  const std::vector<std::pair<std::string, model::SamplingParams>> cases = {
      {"ucx", {.max_tokens = 12}},
      {"a longer prompt that spans blocks", {.temperature = 0.9f, .seed = 4, .max_tokens = 20}},
      {"z", {.temperature = 1.0f, .top_k = 5, .seed = 8, .max_tokens = 1}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].first);
    const std::vector<int32_t> prompt = p.Encode(cases[i].first);
    const model::SamplingParams& params = cases[i].second;
    v1::ReserveRequest req;
    req.set_request_id("r" + std::to_string(i));
    req.set_num_tokens(static_cast<int64_t>(prompt.size()));
    req.mutable_prompt_token_ids()->Assign(prompt.begin(), prompt.end());
    *req.mutable_sampling() = rpc::ToProto(params);
    *req.mutable_expected_layout() = rpc::ToProto(p.layout());
    req.set_deadline_ms(10000);
    req.set_sender_node_id("prefill-0");
    req.set_sender_transfer_address(p.address());
    grpc::ClientContext ctx;
    rpc::SetDeadline(ctx, absl::Seconds(10));
    v1::ReserveResponse resp;
    grpc::Status st = stub->Reserve(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    Reservation res{
        .transfer_id = resp.destination().transfer_id(),
        .cached_blocks = resp.destination().cached_blocks(),
        .blocks = {resp.destination().block_ids().begin(), resp.destination().block_ids().end()}};
    auto first = p.Prefill(prompt, params, res);
    ASSERT_TRUE(first.ok()) << first.status();

    grpc::ClientContext sctx;
    rpc::SetDeadline(sctx, absl::Seconds(10));
    v1::StreamTokensRequest sreq;
    sreq.set_request_id(req.request_id());
    auto reader = stub->StreamTokens(&sctx, sreq);
    std::vector<int32_t> tokens = {first->id};
    v1::TokenEvent ev;
    v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
    bool admitted = false;
    while (reader->Read(&ev)) {
      admitted |= ev.admitted();
      if (ev.has_token()) tokens.push_back(ev.token_id());
      finish = ev.finish_reason();
    }
    st = reader->Finish();
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_TRUE(admitted);
    auto ref = p.Reference(prompt, params);
    ASSERT_TRUE(ref.ok());
    EXPECT_EQ(tokens, ref->generated_ids);
    EXPECT_EQ(finish, v1::FINISH_REASON_MAX_TOKENS);
  }
  const kv::BlockPoolStats stats = (*node)->PoolStats();
  EXPECT_EQ(stats.available(), stats.total);
  (*node)->Shutdown();
  (*node)->Shutdown();
}

INSTANTIATE_TEST_SUITE_P(Profiles, DecodeNodeUcxTest, ::testing::Values("shm", "tcp"));

TEST(DecodeNodeStart, BadOptionsFailClearly) {
  auto node = DecodeNode::Start({.runtime = {.node_id = "decode-0", .model_dir = ""}});
  EXPECT_EQ(node.status().code(), absl::StatusCode::kInvalidArgument);
  node = DecodeNode::Start(
      {.runtime = {.node_id = "decode-0",
                   .model_dir = testing::TinyModelDir(),
                   .device = compute::Device::kCpu,
                   .threads = 1},
       .transfer = {.transport = cluster::TransportKind::kInproc, .ucx_tls = "tcp,self"}});
  EXPECT_EQ(node.status().code(), absl::StatusCode::kInvalidArgument) << node.status();
  EXPECT_NE(node.status().message().find("ucx_tls"), std::string::npos) << node.status();
  node = DecodeNode::Start({.runtime = {.node_id = "decode-0",
                                        .model_dir = testing::TinyModelDir(),
                                        .device = compute::Device::kCpu,
                                        .threads = 1,
                                        .kv_cache_bytes = 10}});
  EXPECT_EQ(node.status().code(), absl::StatusCode::kInvalidArgument) << node.status();
}

}  // namespace
}  // namespace duet::decode
