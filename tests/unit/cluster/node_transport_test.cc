// CreateNodeTransport: every UCX setting a node is given reaches the transport or is refused by
// name; none is dropped.
#include "cluster/node_transport.h"

#include <string>

#include "gtest/gtest.h"

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

TEST(NodeTransportTest, ProfilesCreate) {
  for (const char* transport : {"shm", "shm-mm", "tcp"}) {
    auto t = CreateNodeTransport({.transport = transport}, "decode-0", Layout());
    EXPECT_TRUE(t.ok()) << transport << ": " << t.status();
  }
  auto bad = CreateNodeTransport({.transport = "carrier-pigeon"}, "decode-0", Layout());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("carrier-pigeon"), std::string::npos);
}

// The override replaces the profile's list: a list UCX has no transport for fails its init,
// and tcp,self on lo works under the shm profile.
TEST(NodeTransportTest, UcxTlsReplacesTheProfiles) {
  auto bad = CreateNodeTransport({.transport = "shm", .ucx_tls = "no-such-transport"}, "decode-0",
                                 Layout());
  EXPECT_FALSE(bad.ok());
  auto tcp = CreateNodeTransport(
      {.transport = "shm", .ucx_net_devices = "lo", .ucx_tls = "tcp,self"}, "decode-0", Layout());
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
  EXPECT_TRUE(CreateNodeTransport({.transport = "inproc"}, "decode-0", Layout()).ok());
  auto t =
      CreateNodeTransport({.transport = "inproc", .ucx_tls = "tcp,self"}, "decode-0", Layout());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("ucx_tls"), std::string::npos) << t.status();
}

}  // namespace
}  // namespace duet::cluster
