// The option flags parsed once, where they are read: --device, --cpu-gemm, --cpu-isa,
// --weights-dtype, --kv-dtype (model_flags.h), --transport, --transfer-write-mode and
// --kv-staging (transport_flags.h) and --router (coordinator_flags.h) reach the options structs
// as enums ("auto" as std::nullopt, where the option has it), and a value outside them is
// refused naming the flag and the valid values.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/reflection.h"
#include "cli/coordinator_flags.h"
#include "cli/etcd_flags.h"
#include "cli/model_flags.h"
#include "cli/node_flags.h"
#include "cli/transport_flags.h"
#include "gtest/gtest.h"
#include "tests/unit/cli/scoped_flags.h"

namespace duet::cli {
namespace {

TEST(TypedFlagsTest, EngineDefaultsAreAutoAndTheInvariantGemm) {
  absl::StatusOr<EngineFlags> e = ReadEngineFlags();
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->device, std::nullopt);
  EXPECT_EQ(e->cpu_gemm, compute::CpuGemm::kInvariant);
  EXPECT_EQ(e->cpu_isa, std::nullopt);
  EXPECT_EQ(e->weights_dtype, std::nullopt);
  EXPECT_EQ(e->kv_dtype, std::nullopt);
}

TEST(TypedFlagsTest, EngineValuesReachEngineAndNodeOptionsTyped) {
  ScopedFlags flags({{"device", "cpu"},
                     {"cpu_gemm", "openblas"},
                     {"cpu_isa", "avx2"},
                     {"weights_dtype", "native"},
                     {"kv_dtype", "int8"}});
  absl::StatusOr<model::EngineOptions> o = EngineOptionsFromFlags();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->device, compute::Device::kCpu);
  EXPECT_EQ(o->cpu_gemm, compute::CpuGemm::kOpenBlas);
  EXPECT_EQ(o->cpu_isa, compute::cpu::CpuIsa::kAvx2);
  EXPECT_EQ(o->weights_dtype, model::WeightsDtype::kNative);
  EXPECT_EQ(o->kv_dtype, kv::KvDtype::kInt8);
  absl::StatusOr<cluster::NodeRuntimeOptions> n = NodeRuntimeOptionsFromFlags("decode");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->node_id, "decode-0");
  EXPECT_EQ(n->device, compute::Device::kCpu);
  EXPECT_EQ(n->cpu_gemm, compute::CpuGemm::kOpenBlas);
  EXPECT_EQ(n->cpu_isa, compute::cpu::CpuIsa::kAvx2);
  EXPECT_EQ(n->weights_dtype, model::WeightsDtype::kNative);
  EXPECT_EQ(n->kv_dtype, kv::KvDtype::kInt8);
}

TEST(TypedFlagsTest, BadEngineValuesAreRefusedNamingTheFlagAndTheValidValues) {
  const std::vector<std::pair<std::string, std::pair<std::string, std::string>>> cases = {
      {"device",
       {"tpu", "--device: unknown compute backend 'tpu': valid names are cpu, cuda, or auto"}},
      {"cpu_gemm",
       {"mkl", "--cpu-gemm: unknown cpu_gemm 'mkl': valid values are invariant, bf16, openblas"}},
      {"cpu_isa",
       {"sse9",
        "--cpu-isa: unknown cpu_isa 'sse9': valid values are scalar, avx2, avx512, "
        "avx512_vnni, avx512_bf16, amx, or auto"}},
      {"weights_dtype",
       {"int3",
        "--weights-dtype: unknown weights_dtype 'int3': valid values are f32, native, bf16, or "
        "auto"}},
      {"kv_dtype",
       {"int4",
        "--kv-dtype: unknown kv_dtype 'int4': valid values are f32, f16, bf16, int8, fp8, "
        "or auto"}},
  };
  for (const auto& [flag, c] : cases) {
    ScopedFlags flags(FlagValues{{flag, c.first}});
    absl::StatusOr<EngineFlags> e = ReadEngineFlags();
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << flag;
    EXPECT_EQ(e.status().message(), c.second);
    EXPECT_EQ(EngineOptionsFromFlags().status(), e.status());
    EXPECT_EQ(NodeRuntimeOptionsFromFlags("prefill").status(), e.status());
  }
}

TEST(TypedFlagsTest, TransportWriteModeAndStagingAreTyped) {
  {
    ScopedFlags flags({{"transfer_write_mode", "memcpy"}, {"kv_staging", "always"}});
    absl::StatusOr<TransportFlags> t = ReadTransportFlags();
    ASSERT_TRUE(t.ok()) << t.status();
    const cluster::NodeTransferOptions o = NodeTransferOptionsOf(*t);
    EXPECT_EQ(o.write_mode, transfer::WriteMode::kMemcpy);
    EXPECT_EQ(o.kv_staging, compute::KvStaging::kAlways);
  }
  {
    ScopedFlags flags(FlagValues{{"transfer_write_mode", "telepathy"}});
    EXPECT_EQ(ReadTransportFlags().status().message(),
              "--transfer-write-mode: unknown write_mode 'telepathy': valid values are auto, put, "
              "am, memcpy");
  }
  ScopedFlags flags(FlagValues{{"kv_staging", "sometimes"}});
  EXPECT_EQ(ReadTransportFlags().status().message(),
            "--kv-staging: unknown kv_staging 'sometimes': valid values are auto, always, never");
}

// Each transport name reaches NodeTransferOptions as its cluster::TransportKind and names it
// back; one outside them, and inproc (nodes in one process only), are refused naming the flag.
TEST(TypedFlagsTest, TransportIsTypedAndRoundTrips) {
  {
    absl::StatusOr<TransportFlags> t = ReadTransportFlags();
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->transport, cluster::TransportKind::kShm);  // the default
  }
  for (const auto& [name, kind] : std::vector<std::pair<std::string, cluster::TransportKind>>{
           {"shm", cluster::TransportKind::kShm},
           {"tcp", cluster::TransportKind::kTcp},
           {"shm-mm", cluster::TransportKind::kShmMm}}) {
    ScopedFlags flags(FlagValues{{"transport", name}});
    absl::StatusOr<TransportFlags> t = ReadTransportFlags();
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
    EXPECT_EQ(t->transport, kind) << name;
    const cluster::NodeTransferOptions o = NodeTransferOptionsOf(*t);
    EXPECT_EQ(o.transport, kind) << name;
    EXPECT_EQ(cluster::TransportKindName(o.transport), name);
  }
  {
    ScopedFlags flags(FlagValues{{"transport", "carrier-pigeon"}});
    absl::StatusOr<TransportFlags> t = ReadTransportFlags();
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(t.status().message(),
              "--transport: unknown transport 'carrier-pigeon': valid values are shm, tcp, "
              "shm-mm, inproc");
  }
  ScopedFlags flags(FlagValues{{"transport", "inproc"}});
  absl::StatusOr<TransportFlags> t = ReadTransportFlags();
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(),
            "--transport=inproc connects nodes inside one process only; use shm, tcp or shm-mm");
}

// Each --router reaches RoutingFlags (and so CoordinatorOptions) as its coordinator::RouterMode
// and names it back; anything else is refused naming the flag and the modes.
TEST(TypedFlagsTest, RouterIsTypedAndRoundTrips) {
  {
    absl::StatusOr<RoutingFlags> r = ReadRoutingFlags();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->router, coordinator::RouterMode::kCacheAware);  // the default
  }
  for (const auto& [name, mode] : std::vector<std::pair<std::string, coordinator::RouterMode>>{
           {"cache_aware", coordinator::RouterMode::kCacheAware},
           {"load", coordinator::RouterMode::kLoad},
           {"round_robin", coordinator::RouterMode::kRoundRobin}}) {
    ScopedFlags flags(FlagValues{{"router", name}});
    absl::StatusOr<RoutingFlags> r = ReadRoutingFlags();
    ASSERT_TRUE(r.ok()) << name << ": " << r.status();
    EXPECT_EQ(r->router, mode) << name;
    EXPECT_EQ(coordinator::RouterModeName(r->router), name);
  }
  ScopedFlags flags(FlagValues{{"router", "fastest"}});
  absl::StatusOr<RoutingFlags> r = ReadRoutingFlags();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "--router: unknown router 'fastest': valid values are cache_aware, load, round_robin");
}

// Membership on etcd: endpoints, prefix and TTL typed; a node takes one discovery.
TEST(TypedFlagsTest, EtcdFlagsAreTypedAndANodeTakesOneDiscovery) {
  {
    absl::StatusOr<etcd::EtcdMembershipOptions> off = ReadEtcdFlags();
    ASSERT_TRUE(off.ok()) << off.status();
    EXPECT_FALSE(off->enabled());
  }
  {
    ScopedFlags flags({{"etcd_endpoints", "http://127.0.0.1:2379,127.0.0.1:2380"},
                       {"etcd_prefix", "/prod"},
                       {"etcd_lease_ttl_s", "3"}});
    absl::StatusOr<etcd::EtcdMembershipOptions> m = ReadEtcdFlags();
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->endpoints,
              (std::vector<std::string>{"http://127.0.0.1:2379", "http://127.0.0.1:2380"}));
    EXPECT_EQ(m->prefix, "/prod");
    EXPECT_EQ(m->lease_ttl, absl::Seconds(3));
    EXPECT_EQ(m->Describe(), "etcd http://127.0.0.1:2379,http://127.0.0.1:2380 /prod");
    absl::StatusOr<cluster::NodeRuntimeOptions> node = NodeRuntimeOptionsFromFlags("decode");
    ASSERT_TRUE(node.ok()) << node.status();
    EXPECT_EQ(node->etcd.prefix, "/prod");
    EXPECT_TRUE(node->coordinator_address.empty());
  }
  {
    ScopedFlags flags(
        {{"etcd_endpoints", "http://127.0.0.1:2379"}, {"coordinator", "127.0.0.1:5000"}});
    absl::StatusOr<cluster::NodeRuntimeOptions> node = NodeRuntimeOptionsFromFlags("decode");
    EXPECT_TRUE(absl::IsInvalidArgument(node.status())) << node.status();
    EXPECT_NE(node.status().message().find("--etcd-endpoints and --coordinator"), std::string::npos)
        << node.status();
  }
  {
    ScopedFlags flags({{"etcd_endpoints", "https://127.0.0.1:2379,https://127.0.0.1:2380"},
                       {"etcd_ca_file", "/etc/etcd/ca.pem"},
                       {"etcd_cert_file", "/etc/duet/node.pem"},
                       {"etcd_key_file", "/etc/duet/node.key"}});
    absl::StatusOr<etcd::EtcdMembershipOptions> m = ReadEtcdFlags();
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(m->tls.has_value());
    EXPECT_EQ(m->tls->ca_file, "/etc/etcd/ca.pem");
    EXPECT_EQ(m->tls->cert_file, "/etc/duet/node.pem");
    EXPECT_EQ(m->tls->key_file, "/etc/duet/node.key");
    EXPECT_EQ(m->client_options().tls->key_file, "/etc/duet/node.key");
  }
  for (const FlagValues& bad : std::vector<FlagValues>{
           {{"etcd_endpoints", "https://127.0.0.1:2379"}},
           {{"etcd_endpoints", "https://127.0.0.1:2379,http://127.0.0.1:2380"},
            {"etcd_ca_file", "ca.pem"}},
           {{"etcd_endpoints", "https://127.0.0.1:2379"},
            {"etcd_ca_file", "ca.pem"},
            {"etcd_cert_file", "n.pem"}},
           {{"etcd_endpoints", "http://127.0.0.1:2379"}, {"etcd_ca_file", "ca.pem"}},
           {{"etcd_ca_file", "ca.pem"}},
           {{"etcd_endpoints", "ftp://127.0.0.1:2379"}},
           {{"etcd_endpoints", "http://127.0.0.1:2379,"}},
           {{"etcd_endpoints", "http://127.0.0.1:2379"}, {"etcd_prefix", "/duet/"}},
           {{"etcd_endpoints", "http://127.0.0.1:2379"}, {"etcd_lease_ttl_s", "0"}},
           {{"etcd_prefix", "/other"}},
           {{"etcd_lease_ttl_s", "9"}}}) {
    ScopedFlags flags(bad);
    absl::StatusOr<etcd::EtcdMembershipOptions> m = ReadEtcdFlags();
    EXPECT_TRUE(absl::IsInvalidArgument(m.status())) << bad.back().first << ": " << m.status();
    EXPECT_NE(m.status().message().find("--etcd-"), std::string::npos) << m.status();
  }
}

// The disk tier's flags reach the node's options; a size or rule without a path, a path without
// a size, and write-through with an admission rule are refused naming the flags.
TEST(TypedFlagsTest, KvDiskFlagsAreTypedAndRefusedWhereIncomplete) {
  {
    ScopedFlags flags({{"kv_disk_path", "/var/tmp/kv"},
                       {"kv_disk_bytes", "1048576"},
                       {"kv_disk_admit_hits", "2"}});
    absl::StatusOr<cluster::NodeRuntimeOptions> o = NodeRuntimeOptionsFromFlags("decode");
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->kv_disk.path, "/var/tmp/kv");
    EXPECT_EQ(o->kv_disk.bytes, 1048576);
    EXPECT_EQ(o->kv_disk.admit_after_hits, 2);
    EXPECT_FALSE(o->kv_disk.write_through);
  }
  EXPECT_TRUE(NodeRuntimeOptionsFromFlags("decode")->kv_disk.path.empty());
  const std::vector<std::pair<FlagValues, std::string>> bad = {
      {{{"kv_disk_bytes", "1048576"}}, "--kv_disk_path"},
      {{{"kv_disk_write_through", "true"}}, "--kv_disk_path"},
      {{{"kv_disk_path", "/var/tmp/kv"}}, "--kv_disk_bytes"},
      {{{"kv_disk_path", "/var/tmp/kv"},
        {"kv_disk_bytes", "1048576"},
        {"kv_disk_write_through", "true"},
        {"kv_disk_admit_hits", "1"}},
       "--kv_disk_admit_hits"},
  };
  for (const auto& [values, names] : bad) {
    ScopedFlags flags(values);
    absl::StatusOr<cluster::NodeRuntimeOptions> o = NodeRuntimeOptionsFromFlags("decode");
    ASSERT_FALSE(o.ok()) << names;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(o.status().message().find(names), std::string::npos) << o.status();
  }
}

}  // namespace
}  // namespace duet::cli
