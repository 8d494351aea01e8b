// NodeStatusService over in-process gRPC on 127.0.0.1 with a real BlockPool: a stream starts
// with a snapshot of load and cache, then carries the load at its interval and the pool's
// events as they happen, to every subscriber alike.
#include "cluster/node_status_service.h"

#include <atomic>
#include <memory>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/kv/block_hash.h"
#include "gtest/gtest.h"
#include "proto/channel.h"

namespace duet::cluster {
namespace {

kv::KvLayout Layout() {
  return kv::KvLayout{.model_id = "tiny",
                      .num_layers = 1,
                      .num_kv_heads = 1,
                      .head_dim = 4,
                      .block_size = 4,
                      .dtype = kv::KvDtype::kF32};
}

class NodeStatusServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pool_ = kv::BlockPool::Create(Layout(), 16).value();
    service_ = std::make_unique<NodeStatusService>(
        &registry_,
        NodeStatusServiceOptions{.node_id = "decode-0", .load_interval = absl::Milliseconds(50)});
    auto server = rpc::StartServer("127.0.0.1:0", {service_.get()}, &port_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override {
    service_->Stop();
    server_->Shutdown();
  }
  absl::Status Attach() {
    return service_->Attach({.epoch = [] { return uint64_t{7}; },
                             .load =
                                 [this] {
                                   v1::NodeLoad l;
                                   l.set_total_blocks(16);
                                   l.set_queued_tokens(loads_.fetch_add(1));
                                   return l;
                                 },
                             .cache_pool = pool_.get()});
  }
  // Publishes one block of tokens `first..first+3` under the chain's first hash.
  kv::BlockHash Publish(int32_t first) {
    std::vector<int32_t> t(4);
    std::iota(t.begin(), t.end(), first);
    const kv::BlockHash h = kv::ChainHashes(kv::SeedFromText("test"), t, 4)[0];
    std::vector<kv::BlockId> id = pool_->Allocate(1).value();
    EXPECT_TRUE(pool_->Publish(id[0], h, t).value());
    EXPECT_TRUE(pool_->Free(id).ok());
    return h;
  }

  metrics::Registry registry_;
  std::unique_ptr<kv::BlockPool> pool_;
  std::unique_ptr<NodeStatusService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::atomic<int> loads_{0};
};

struct Stream {
  grpc::ClientContext ctx;
  std::unique_ptr<v1::NodeStatusStream::Stub> stub;
  std::unique_ptr<grpc::ClientReader<v1::StatusUpdate>> reader;
};

std::unique_ptr<Stream> Open(int port, uint64_t epoch) {
  auto s = std::make_unique<Stream>();
  s->stub = v1::NodeStatusStream::NewStub(rpc::MakeChannel(absl::StrCat("127.0.0.1:", port)));
  v1::WatchStatusRequest req;
  req.mutable_node()->set_node_id("decode-0");
  req.mutable_node()->set_epoch(epoch);
  rpc::SetDeadline(s->ctx, absl::Seconds(10));
  s->reader = s->stub->Watch(&s->ctx, req);
  return s;
}

TEST_F(NodeStatusServiceTest, SnapshotThenLoadAtItsIntervalAndEventsAsTheyHappen) {
  const kv::BlockHash before = Publish(100);  // cached before anyone subscribes
  ASSERT_TRUE(Attach().ok());
  std::unique_ptr<Stream> a = Open(port_, 7);
  std::unique_ptr<Stream> b = Open(port_, 0);  // any incarnation
  v1::StatusUpdate u;
  for (Stream* s : {a.get(), b.get()}) {
    ASSERT_TRUE(s->reader->Read(&u));
    EXPECT_EQ(u.node().node_id(), "decode-0");
    EXPECT_EQ(u.node().epoch(), 7u);
    EXPECT_TRUE(u.has_load());
    ASSERT_TRUE(u.kv_events().snapshot());
    ASSERT_EQ(u.kv_events().events_size(), 1);
    EXPECT_EQ(u.kv_events().events(0).hash_low(), before.low);
  }
  const uint64_t next = u.kv_events().first_seq();
  // Loads keep coming, about one per interval (50 ms).
  const absl::Time start = absl::Now();
  int loads = 0;
  while (loads < 4 && a->reader->Read(&u)) loads += u.has_load() ? 1 : 0;
  EXPECT_EQ(loads, 4);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  // An event reaches both subscribers within tens of milliseconds.
  const absl::Time published = absl::Now();
  const kv::BlockHash after = Publish(200);
  for (Stream* s : {a.get(), b.get()}) {
    bool seen = false;
    while (!seen && s->reader->Read(&u)) {
      if (u.kv_events().events_size() == 0) continue;
      EXPECT_FALSE(u.kv_events().snapshot());
      ASSERT_EQ(u.kv_events().events_size(), 1);
      EXPECT_EQ(u.kv_events().first_seq(), next);
      EXPECT_EQ(u.kv_events().events(0).hash_low(), after.low);
      seen = true;
    }
    EXPECT_TRUE(seen);
  }
  EXPECT_LT(absl::Now() - published, absl::Milliseconds(200));
  a->ctx.TryCancel();
  b->ctx.TryCancel();
}

TEST_F(NodeStatusServiceTest, RefusesBeforeAttachAndAnotherIncarnation) {
  v1::StatusUpdate u;
  std::unique_ptr<Stream> early = Open(port_, 7);
  EXPECT_FALSE(early->reader->Read(&u));
  EXPECT_EQ(early->reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  ASSERT_TRUE(Attach().ok());
  EXPECT_FALSE(Attach().ok());  // once
  std::unique_ptr<Stream> other = Open(port_, 6);
  EXPECT_FALSE(other->reader->Read(&u));
  EXPECT_EQ(other->reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(NodeStatusServiceTest, StopEndsEveryStream) {
  ASSERT_TRUE(Attach().ok());
  std::unique_ptr<Stream> s = Open(port_, 7);
  v1::StatusUpdate u;
  ASSERT_TRUE(s->reader->Read(&u));
  const absl::Time stopped = absl::Now();
  service_->Stop();
  while (s->reader->Read(&u)) {
  }
  EXPECT_EQ(s->reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(1));
}

}  // namespace
}  // namespace duet::cluster
