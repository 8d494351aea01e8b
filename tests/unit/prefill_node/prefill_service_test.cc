// PrefillNode end to end in one process: the gRPC service on 127.0.0.1 and an inproc transport
// to a decode side made of a BlockPool. A Prefill call lands the exact KV and answers the
// reference first token; a destination with another KV layout is refused naming both nodes;
// bad block counts are refused; CancelPrefill of an unknown id reports found=false; every
// block of P's pool is free afterwards.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "duet/v1/prefill.grpc.pb.h"
#include "prefill_node/prefill_node.h"
#include "proto/channel.h"
#include "proto/kv_layout_convert.h"
#include "proto/status_util.h"
#include "tests/unit/prefill_node/prefill_test_util.h"
#include "transfer/transport.h"

namespace duet::prefill {
namespace {

using testing::Drain;
using testing::ExpectCompleteStream;
using testing::Prompt;
using testing::Received;
using testing::Reference;
using testing::TinyModelDir;

class PrefillServiceTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() { testing::RemoveTinyModel(); }

  void SetUp() override {
    auto node = PrefillNode::Start({.runtime = {.node_id = "prefill-t",
                                                .model_dir = TinyModelDir(),
                                                .device = compute::Device::kCpu,
                                                .threads = 2,
                                                .kv_cache_bytes = 4 << 20},
                                    .transfer = {.transport = cluster::TransportKind::kInproc},
                                    .max_batch_tokens = 64});
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
    layout_ = node_->layout();
    dpool_ = *kv::BlockPool::Create(layout_, 256);
    td_ = *transfer::CreateTransport("inproc", {.name = "decode-t", .layout = layout_});
    dregion_ = *td_->Register(dpool_->region(), dpool_->region_bytes());
    stub_ = v1::PrefillNode::NewStub(rpc::MakeChannel(node_->address()));
  }
  void TearDown() override {
    node_->Shutdown();
    node_->Shutdown();  // idempotent
  }

  v1::PrefillRequest Request(const std::string& id, uint64_t tid,
                             const std::vector<int32_t>& prompt) {
    v1::PrefillRequest req;
    req.set_request_id(id);
    for (int32_t t : prompt) req.add_prompt_token_ids(t);
    req.set_deadline_ms(20000);
    v1::KvDestination* d = req.mutable_destination();
    d->set_request_id(id);
    d->mutable_decode_node()->set_node_id("decode-t");
    d->set_transfer_address(*td_->LocalAddress());
    absl::StatusOr<std::vector<kv::BlockId>> blocks =
        dpool_->Allocate(layout_.BlocksForTokens(prompt.size()));
    EXPECT_TRUE(blocks.ok()) << blocks.status();
    if (blocks.ok()) {
      for (kv::BlockId b : *blocks) d->add_block_ids(b);
    }
    *d->mutable_layout() = rpc::ToProto(layout_);
    d->set_layout_fingerprint(layout_.Fingerprint());
    d->set_region_num_blocks(dpool_->num_blocks());
    d->set_num_tokens(static_cast<int64_t>(prompt.size()));
    d->set_transfer_id(tid);
    return req;
  }
  absl::StatusOr<v1::PrefillResponse> Call(const v1::PrefillRequest& req) {
    return testing::CallPrefill(stub_.get(), req);
  }
  void ExpectAllFree() {
    const kv::BlockPoolStats s = node_->PoolStats();
    EXPECT_EQ(s.available(), s.total);
  }

  std::unique_ptr<PrefillNode> node_;
  kv::KvLayout layout_;
  std::unique_ptr<kv::BlockPool> dpool_;
  std::unique_ptr<transfer::Transport> td_;
  std::unique_ptr<transfer::MemoryRegion> dregion_;
  std::unique_ptr<v1::PrefillNode::Stub> stub_;
};

TEST_F(PrefillServiceTest, PrefillLandsExactKvAndAnswersTheFirstToken) {
  Reference ref = Reference::Load(layout_.block_size);
  std::map<uint64_t, Received> got;
  for (int n : {3, 64, 150}) {  // 150 > the 64-token budget: chunked
    const std::vector<int32_t> prompt = Prompt(n, n, 320);
    const v1::PrefillRequest req = Request("svc-" + std::to_string(n), 500 + n, prompt);
    auto resp = Call(req);
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->request_id(), req.request_id());
    EXPECT_EQ(resp->first_token_id(), ref.FirstToken(prompt)) << n;
    EXPECT_EQ(resp->layer_transfer_us_size(), layout_.num_layers);
    EXPECT_GE(resp->transfer_tail_us(), 0);
    const std::vector<kv::BlockId> dest(req.destination().block_ids().begin(),
                                        req.destination().block_ids().end());
    ref.ExpectKvEquals(prompt, *dpool_, dest);
    Drain(*td_, got);
    const v1::KvCompletion c = ExpectCompleteStream(got[500 + n], layout_.num_layers);
    EXPECT_EQ(c.first_token_id(), resp->first_token_id());
  }
  ExpectAllFree();
}

TEST_F(PrefillServiceTest, RefusesAnotherLayoutNamingBothNodes) {
  v1::PrefillRequest req = Request("mismatch", 1, Prompt(20, 1, 320));
  kv::KvLayout other = layout_;
  other.block_size = 32;
  *req.mutable_destination()->mutable_layout() = rpc::ToProto(other);
  req.mutable_destination()->set_layout_fingerprint(other.Fingerprint());
  auto resp = Call(req);
  ASSERT_TRUE(absl::IsFailedPrecondition(resp.status())) << resp.status();
  EXPECT_NE(resp.status().message().find("prefill-t"), std::string::npos) << resp.status();
  EXPECT_NE(resp.status().message().find("decode-t"), std::string::npos) << resp.status();
  ExpectAllFree();
}

TEST_F(PrefillServiceTest, RefusesBadRequestsAndUnknownCancels) {
  v1::PrefillRequest req = Request("blocks", 2, Prompt(40, 1, 320));
  req.mutable_destination()->mutable_block_ids()->RemoveLast();
  EXPECT_TRUE(absl::IsInvalidArgument(Call(req).status()));

  req = Request("token", 3, Prompt(10, 1, 320));
  req.set_prompt_token_ids(0, 100000);
  EXPECT_TRUE(absl::IsInvalidArgument(Call(req).status()));

  req = Request("nodest", 4, Prompt(10, 1, 320));
  req.clear_destination();
  EXPECT_TRUE(absl::IsInvalidArgument(Call(req).status()));

  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, absl::Seconds(5));
  v1::CancelPrefillRequest cancel;
  cancel.set_request_id("never-seen");
  v1::CancelPrefillResponse cresp;
  ASSERT_TRUE(stub_->CancelPrefill(&ctx, cancel, &cresp).ok());
  EXPECT_FALSE(cresp.found());
  ExpectAllFree();
}

}  // namespace
}  // namespace duet::prefill
