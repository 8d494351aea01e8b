#include "transfer/transport_flags.h"

#include <gtest/gtest.h>

#include "absl/flags/flag.h"

namespace duet::transfer {
namespace {

kv::KvLayout Layout() {
  return kv::KvLayout{.model_id = "tiny",
                      .num_layers = 2,
                      .num_kv_heads = 2,
                      .head_dim = 16,
                      .block_size = 16,
                      .dtype = kv::KvDtype::kF32};
}

TEST(TransportFlagsTest, ProfileThenOverrides) {
  absl::SetFlag(&FLAGS_ucx_profile, "tcp");
  auto o = TransportOptionsFromFlags("decode-0", Layout());
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->name, "decode-0");
  EXPECT_EQ(o->tls, "tcp,self");
  EXPECT_EQ(o->net_devices, "lo");
  absl::SetFlag(&FLAGS_ucx_tls, "tcp");
  absl::SetFlag(&FLAGS_transfer_chunk_kib, 256);
  o = TransportOptionsFromFlags("decode-0", Layout());
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->tls, "tcp");
  EXPECT_EQ(o->chunk_bytes, 256u << 10);
  absl::SetFlag(&FLAGS_ucx_profile, "carrier-pigeon");
  EXPECT_FALSE(TransportOptionsFromFlags("x", Layout()).ok());
  absl::SetFlag(&FLAGS_ucx_profile, "shm");
  absl::SetFlag(&FLAGS_ucx_tls, "");
  EXPECT_EQ(TransportOptionsFromFlags("x", Layout())->tls, "posix,sysv,cma,self");
  EXPECT_EQ(TransportBackendFromFlags(), "ucx");
}

}  // namespace
}  // namespace duet::transfer
