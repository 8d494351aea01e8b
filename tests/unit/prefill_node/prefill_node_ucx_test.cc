// A whole PrefillNode (UCX transport, gRPC server on loopback, no coordinator) streaming into
// an in-process decode side over UCX shm or tcp (a UCX transport with a UCX-allocated pool):
// the KV that lands is exact, the first token equals a single-process run, every notice
// arrives in order, and P's blocks are all free afterwards.
#include <gtest/gtest.h>

#include <map>
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
#include "transfer/ucx/ucx_transport.h"

namespace duet::prefill {
namespace {

class PrefillNodeUcxTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void TearDownTestSuite() { testing::RemoveTinyModel(); }
};

TEST_P(PrefillNodeUcxTest, StreamsExactKvAndAnswersTheFirstToken) {
  const cluster::TransportKind transport = cluster::ParseTransportKind(GetParam()).value();
  auto node = PrefillNode::Start({.runtime = {.node_id = "prefill-u",
                                              .model_dir = testing::TinyModelDir(),
                                              .device = compute::Device::kCpu,
                                              .threads = 1,
                                              .kv_cache_bytes = 2 << 20},
                                  .transfer = {.transport = transport},
                                  .max_batch_tokens = 96});
  ASSERT_TRUE(node.ok()) << node.status();
  const kv::KvLayout layout = (*node)->layout();

  // The decode side: UCX-allocated pool, as a decode node has.
  auto profile = transfer::UcxProfileByName(GetParam());
  ASSERT_TRUE(profile.ok()) << profile.status();
  auto td = transfer::CreateTransport("ucx", {.name = "decode-u",
                                              .layout = layout,
                                              .tls = profile->tls,
                                              .net_devices = profile->net_devices});
  ASSERT_TRUE(td.ok()) << td.status();
  constexpr int64_t kDecodeBlocks = 64;
  auto region = (*td)->AllocateRegion(layout.RegionBytes(kDecodeBlocks));
  ASSERT_TRUE(region.ok()) << region.status();
  auto dpool =
      kv::BlockPool::CreateOver(layout, kDecodeBlocks, (*region)->base(), (*region)->bytes());
  ASSERT_TRUE(dpool.ok()) << dpool.status();
  auto address = (*td)->LocalAddress();
  ASSERT_TRUE(address.ok()) << address.status();

  testing::Reference ref = testing::Reference::Load(layout.block_size);
  auto stub = v1::PrefillNode::NewStub(rpc::MakeChannel((*node)->address()));
  std::map<uint64_t, testing::Received> got;
  for (int n : {7, 200}) {  // 200 > the budget: two passes
    SCOPED_TRACE(n);
    const std::vector<int32_t> prompt = testing::Prompt(n, n, 320);
    auto blocks = (*dpool)->Allocate(layout.BlocksForTokens(n));
    ASSERT_TRUE(blocks.ok()) << blocks.status();
    v1::PrefillRequest req;
    req.set_request_id("u" + std::to_string(n));
    for (int32_t t : prompt) req.add_prompt_token_ids(t);
    req.set_deadline_ms(20000);
    v1::KvDestination* d = req.mutable_destination();
    d->mutable_decode_node()->set_node_id("decode-u");
    d->set_transfer_address(*address);
    for (kv::BlockId b : *blocks) d->add_block_ids(b);
    *d->mutable_layout() = rpc::ToProto(layout);
    d->set_layout_fingerprint(layout.Fingerprint());
    d->set_region_num_blocks(kDecodeBlocks);
    d->set_num_tokens(n);
    d->set_transfer_id(9000 + n);
    absl::StatusOr<v1::PrefillResponse> r = testing::CallPrefill(stub.get(), req);
    ASSERT_TRUE(r.ok()) << r.status();
    const v1::PrefillResponse& resp = *r;
    EXPECT_EQ(resp.first_token_id(), ref.FirstToken(prompt));
    EXPECT_EQ(resp.layer_transfer_us_size(), layout.num_layers);
    // Notices may trail the write completions P saw by a progress-thread hop.
    const absl::Time deadline = DeadlineIn(absl::Seconds(10));
    while (!got[9000 + n].HasFinal() && absl::Now() < deadline) {
      (*td)->WaitForNotices(std::min(deadline, DeadlineIn(absl::Milliseconds(50))));
      testing::Drain(**td, got);
    }
    const v1::KvCompletion c = testing::ExpectCompleteStream(got[9000 + n], layout.num_layers);
    EXPECT_EQ(c.first_token_id(), resp.first_token_id());
    ref.ExpectKvEquals(prompt, **dpool, *blocks);
  }
  const kv::BlockPoolStats stats = (*node)->PoolStats();
  EXPECT_EQ(stats.available(), stats.total);
  (*node)->Shutdown();
}

INSTANTIATE_TEST_SUITE_P(Profiles, PrefillNodeUcxTest, ::testing::Values("shm", "tcp"));

}  // namespace
}  // namespace duet::prefill
