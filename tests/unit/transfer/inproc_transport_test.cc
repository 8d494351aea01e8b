#include <gtest/gtest.h>

#include <cstring>

#include "common/base/clock.h"
#include "transfer/transport.h"
#include "transfer/ucx/ucx_transport.h"

namespace duet::transfer {
namespace {

kv::KvLayout Layout(const std::string& model = "tiny") {
  return kv::KvLayout{.model_id = model,
                      .num_layers = 2,
                      .num_kv_heads = 2,
                      .head_dim = 4,
                      .block_size = 2,
                      .dtype = kv::KvDtype::kF32};
}

struct Side {
  std::unique_ptr<Transport> t;
  std::unique_ptr<MemoryRegion> region;
};

Side MakeSide(const std::string& name, const kv::KvLayout& layout, size_t bytes) {
  Side s;
  auto t = CreateTransport("inproc", TransportOptions{.name = name, .layout = layout});
  EXPECT_TRUE(t.ok()) << t.status();
  s.t = std::move(*t);
  auto r = s.t->AllocateRegion(bytes);
  EXPECT_TRUE(r.ok()) << r.status();
  s.region = std::move(*r);
  return s;
}

TEST(TransportRegistryTest, KnowsBuiltinsAndRefusesUnknown) {
  auto names = TransportNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "inproc"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "ucx"), names.end());
  auto t = CreateTransport("carrier-pigeon", TransportOptions{.layout = Layout()});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("inproc"), std::string::npos);
}

// TransportOptions::write_mode (--transfer_write_mode): each mode's name parses back to it (the
// name PeerAddress carries); others are refused naming the valid ones.
TEST(WriteModeTest, NamesRoundTripAndOthersAreRefused) {
  for (WriteMode m : {WriteMode::kAuto, WriteMode::kPut, WriteMode::kAm, WriteMode::kMemcpy}) {
    EXPECT_EQ(*ParseWriteMode(WriteModeName(m)), m);
  }
  EXPECT_STREQ(WriteModeName(WriteMode::kMemcpy), "memcpy");
  absl::StatusOr<WriteMode> bad = ParseWriteMode("telepathy");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "unknown write_mode 'telepathy': valid values are auto, put, am, memcpy");
}

TEST(InprocTransportTest, WritesLandBeforeTheirNotice) {
  Side a = MakeSide("a", Layout(), 4096);
  Side b = MakeSide("b", Layout(), 4096);
  auto* src = static_cast<uint8_t*>(a.region->base());
  for (int i = 0; i < 4096; ++i) src[i] = static_cast<uint8_t>(i * 7);
  auto peer = a.t->Connect(*b.t->LocalAddress(), DeadlineIn(absl::Seconds(1)));
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(*a.t->Connect(*b.t->LocalAddress(), DeadlineIn(absl::Seconds(1))), *peer);
  auto back = b.t->Connect(*a.t->LocalAddress(), DeadlineIn(absl::Seconds(1)));
  ASSERT_TRUE(back.ok());
  auto h = a.t->PostWrite(*peer, {{0, 1000, 100}, {500, 2000, 50}}, "n1");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->Wait(DeadlineIn(absl::Seconds(1))).ok());
  EXPECT_EQ(h->Poll(), TransferState::kDone);
  ASSERT_TRUE(b.t->WaitForNotices(DeadlineIn(absl::Seconds(1))));
  auto notices = b.t->DrainNotices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].payload, "n1");
  EXPECT_EQ(notices[0].peer, *back);
  auto* dst = static_cast<uint8_t*>(b.region->base());
  EXPECT_EQ(std::memcmp(dst + 1000, src, 100), 0);
  EXPECT_EQ(std::memcmp(dst + 2000, src + 500, 50), 0);
  EXPECT_EQ(dst[1100], 0);
}

TEST(InprocTransportTest, RefusesOutOfRangeOps) {
  Side a = MakeSide("a", Layout(), 4096);
  Side b = MakeSide("b", Layout(), 1024);
  auto peer = a.t->Connect(*b.t->LocalAddress(), DeadlineIn(absl::Seconds(1)));
  ASSERT_TRUE(peer.ok());
  EXPECT_EQ(a.t->PostWrite(*peer, {{0, 1000, 100}}, std::nullopt).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(a.t->PostWrite(*peer, {{4000, 0, 100}}, std::nullopt).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_FALSE(a.t->PostWrite(*peer, {{0, 0, 0}}, std::nullopt).ok());
}

TEST(InprocTransportTest, LayoutMismatchNamesBothSides) {
  Side a = MakeSide("prefill-0", Layout("llama"), 4096);
  Side b = MakeSide("decode-0", Layout("mistral"), 4096);
  auto peer = a.t->Connect(*b.t->LocalAddress(), DeadlineIn(absl::Seconds(1)));
  ASSERT_FALSE(peer.ok());
  EXPECT_EQ(peer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(peer.status().message().find("prefill-0"), std::string::npos);
  EXPECT_NE(peer.status().message().find("decode-0"), std::string::npos);
  EXPECT_NE(peer.status().message().find("mistral"), std::string::npos);
}

TEST(InprocTransportTest, LostPeerIsAnError) {
  Side a = MakeSide("a", Layout(), 4096);
  auto b = std::make_unique<Side>(MakeSide("b", Layout(), 4096));
  auto peer = a.t->Connect(*b->t->LocalAddress(), DeadlineIn(absl::Seconds(1)));
  ASSERT_TRUE(peer.ok());
  EXPECT_TRUE(a.t->PeerStatus(*peer).ok());
  b.reset();
  EXPECT_EQ(a.t->PeerStatus(*peer).code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(a.t->PostWrite(*peer, {{0, 0, 8}}, "x").ok());
}

TEST(InprocTransportTest, LocalAddressNeedsARegion) {
  auto t = CreateTransport("inproc", TransportOptions{.name = "x", .layout = Layout()});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->LocalAddress().status().code(), absl::StatusCode::kFailedPrecondition);
  auto r = (*t)->AllocateRegion(64);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*t)->AllocateRegion(64).status().code(), absl::StatusCode::kAlreadyExists);
}

// The ucx "am" lane over tcp in one process (two workers on lo): an eager chunk goes out as
// messages of at most 48 KiB (each one UCX fragment) and a chunk above am_eager_max_bytes as one
// rendezvous message; either way every byte lands at its offset before the notice is delivered
// and no receive record is left behind.
class UcxAmLaneTest : public ::testing::TestWithParam<uint64_t /*am_eager_max_bytes*/> {};

TEST_P(UcxAmLaneTest, RunsLandByteExactBeforeTheNotice) {
  constexpr size_t kBytes = 4 << 20;
  auto profile = UcxProfileByName("tcp");
  ASSERT_TRUE(profile.ok()) << profile.status();
  auto make = [&](const std::string& name) {
    TransportOptions o{.name = name,
                       .layout = Layout(),
                       .tls = profile->tls,
                       .net_devices = profile->net_devices,
                       .write_mode = WriteMode::kAm};
    o.am_chunk_bytes = 1 << 20;
    o.am_eager_max_bytes = GetParam();
    return CreateTransport("ucx", o);
  };
  auto sender = make("sender");
  auto receiver = make("receiver");
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  auto src = (*sender)->AllocateRegion(kBytes);
  auto dst = (*receiver)->AllocateRegion(kBytes);
  ASSERT_TRUE(src.ok() && dst.ok());
  auto* s = static_cast<uint8_t*>((*src)->base());
  for (size_t i = 0; i < kBytes; ++i) s[i] = static_cast<uint8_t>(i * 131 + 7);
  const absl::Time deadline = DeadlineIn(absl::Seconds(20));
  auto to_receiver = (*sender)->Connect(*(*receiver)->LocalAddress(), deadline);
  ASSERT_TRUE(to_receiver.ok()) << to_receiver.status();
  ASSERT_TRUE((*receiver)->Connect(*(*sender)->LocalAddress(), deadline).ok());
  EXPECT_EQ((*sender)->GetPeerInfo(*to_receiver)->lane, "am");
  // Odd lengths and offsets: a run of a few bytes, one just over a 48 KiB message, one over
  // the 1 MiB chunk, and one of 1.5 MiB.
  const std::vector<WriteOp> ops = {{3, 1001, 5},
                                    {4096, 8192, (48 << 10) + 1},
                                    {200000, 300001, (1 << 20) + 12345},
                                    {2500000, 2400000, 3 << 19}};
  auto h = (*sender)->PostWrite(*to_receiver, ops, std::string("done"));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->Wait(deadline).ok()) << h->status();
  std::vector<Notice> notices;
  while (notices.empty() && (*receiver)->WaitForNotices(deadline)) {
    notices = (*receiver)->DrainNotices();
  }
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].payload, "done");
  const auto* d = static_cast<const uint8_t*>((*dst)->base());
  for (const WriteOp& op : ops) {
    EXPECT_EQ(std::memcmp(d + op.remote_offset, s + op.local_offset, op.length), 0)
        << "run at " << op.remote_offset << " (+" << op.length << ")";
  }
  EXPECT_EQ((*receiver)->Stats().pending_arrivals, 0);
}

INSTANTIATE_TEST_SUITE_P(EagerAndRendezvous, UcxAmLaneTest,
                         ::testing::Values(uint64_t{4} << 20, uint64_t{64} << 10),
                         [](const auto& info) {
                           return info.param > (1 << 20) ? std::string("Eager")
                                                         : std::string("RendezvousAbove64KiB");
                         });

}  // namespace
}  // namespace duet::transfer
