// CreateNodeTransport: every UCX setting a node is given reaches the transport or is refused by
// name; none is dropped. The transport kinds and UCX profiles parse from their names and back.
#include "cluster/node_transport.h"

#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "transfer/ucx/ucx_transport.h"

namespace duet::cluster {
namespace {

kv::KvLayout Layout() {
  return kv::KvLayout{.model_id = "tiny",
                      .num_layers = 2,
                      .num_kv_heads = 2,
                      .head_dim = 16,
                      .block_size = 16,
                      .dtype = kv::KvDtype::kF32};
}

TEST(NodeTransportTest, KindsAndProfilesRoundTripAndOthersAreRefused) {
  for (TransportKind k :
       {TransportKind::kShm, TransportKind::kTcp, TransportKind::kShmMm, TransportKind::kInproc}) {
    EXPECT_EQ(ParseTransportKind(TransportKindName(k)).value(), k) << k;
  }
  std::ostringstream os;
  os << TransportKind::kShmMm;
  EXPECT_EQ(os.str(), "shm-mm");
  auto bad = ParseTransportKind("carrier-pigeon");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "unknown transport 'carrier-pigeon': valid values are shm, tcp, shm-mm, inproc");

  using transfer::UcxProfileKind;
  for (UcxProfileKind k : {UcxProfileKind::kShm, UcxProfileKind::kTcp, UcxProfileKind::kShmMm}) {
    EXPECT_EQ(transfer::ParseUcxProfileKind(transfer::UcxProfileKindName(k)).value(), k);
  }
  EXPECT_EQ(transfer::UcxProfileOf(UcxProfileKind::kShm).tls, "sysv,cma,self");
  EXPECT_EQ(transfer::UcxProfileOf(UcxProfileKind::kTcp).tls, "tcp,self");
  EXPECT_EQ(transfer::UcxProfileOf(UcxProfileKind::kTcp).net_devices, "lo");
  EXPECT_EQ(transfer::UcxProfileOf(UcxProfileKind::kShmMm).tls, "sysv,self");
  EXPECT_EQ(transfer::UcxProfileByName("shm-mm").value().tls, "sysv,self");
  EXPECT_EQ(transfer::UcxProfileByName("inproc").status().message(),
            "unknown ucx profile 'inproc': valid values are shm, tcp, shm-mm");
}

TEST(NodeTransportTest, ProfilesCreate) {
  for (TransportKind transport :
       {TransportKind::kShm, TransportKind::kShmMm, TransportKind::kTcp}) {
    auto t = CreateNodeTransport({.transport = transport}, "decode-0", Layout());
    EXPECT_TRUE(t.ok()) << transport << ": " << t.status();
  }
}

// The override replaces the profile's list: a list UCX has no transport for fails its init,
// and tcp,self on lo works under the shm profile.
TEST(NodeTransportTest, UcxTlsReplacesTheProfiles) {
  auto bad = CreateNodeTransport({.transport = TransportKind::kShm, .ucx_tls = "no-such-transport"},
                                 "decode-0", Layout());
  EXPECT_FALSE(bad.ok());
  auto tcp = CreateNodeTransport(
      {.transport = TransportKind::kShm, .ucx_net_devices = "lo", .ucx_tls = "tcp,self"},
      "decode-0", Layout());
  EXPECT_TRUE(tcp.ok()) << tcp.status();
}

TEST(NodeTransportTest, WriteModeChunksAndKeepaliveAreChecked) {
  auto chunk = CreateNodeTransport({.chunk_bytes = 0}, "decode-0", Layout());
  ASSERT_FALSE(chunk.ok());
  EXPECT_NE(chunk.status().message().find("chunk_bytes"), std::string::npos) << chunk.status();

  auto am = CreateNodeTransport({.am_chunk_bytes = uint64_t{1} << 40}, "decode-0", Layout());
  ASSERT_FALSE(am.ok());
  EXPECT_NE(am.status().message().find("am_chunk_bytes"), std::string::npos) << am.status();

  auto keepalive = CreateNodeTransport({.keepalive = absl::ZeroDuration()}, "decode-0", Layout());
  ASSERT_FALSE(keepalive.ok());
  EXPECT_NE(keepalive.status().message().find("keepalive"), std::string::npos)
      << keepalive.status();

  for (transfer::WriteMode ok_mode : {transfer::WriteMode::kAuto, transfer::WriteMode::kPut,
                                      transfer::WriteMode::kAm, transfer::WriteMode::kMemcpy}) {
    auto t = CreateNodeTransport({.write_mode = ok_mode}, "decode-0", Layout());
    EXPECT_TRUE(t.ok()) << transfer::WriteModeName(ok_mode) << ": " << t.status();
  }
}

TEST(NodeTransportTest, InprocRefusesUcxSettings) {
  EXPECT_TRUE(
      CreateNodeTransport({.transport = TransportKind::kInproc}, "decode-0", Layout()).ok());
  auto t = CreateNodeTransport({.transport = TransportKind::kInproc, .ucx_tls = "tcp,self"},
                               "decode-0", Layout());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("ucx_tls"), std::string::npos) << t.status();
}

}  // namespace
}  // namespace duet::cluster
