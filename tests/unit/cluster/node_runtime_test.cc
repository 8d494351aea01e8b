// NodeRuntime: the wiring every serving process shares. Options reach the backend and the
// registration (cpu_gemm, threads, block size, the resolved weights dtype), a pool too small for
// one block is refused naming the sizes, and /metrics says how the node computes.
#include "cluster/node_runtime.h"

#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/auto_option.h"
#include "common/model/synthetic_model.h"
#include "gtest/gtest.h"

namespace duet::cluster {
namespace {

class NodeRuntimeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (std::filesystem::temp_directory_path() /
            ("duet_node_runtime_test_" + std::to_string(getpid())))
               .string();
    ASSERT_TRUE(model::WriteSyntheticModel("tiny", 5, dir_).ok());
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  NodeRuntimeOptions Options() const {
    return {.node_id = "node-t", .model_dir = dir_, .device = compute::Device::kCpu, .threads = 1};
  }
  static std::string dir_;
};
std::string NodeRuntimeTest::dir_;

TEST_F(NodeRuntimeTest, ComputeAndPoolFollowTheOptions) {
  NodeRuntimeOptions o = Options();
  o.cpu_gemm = compute::CpuGemm::kOpenBlas;
  o.threads = 2;
  o.block_size = 8;
  o.kv_cache_bytes = 1 << 20;
  auto rt = NodeRuntime::Load(o, {.role = "test node"});
  ASSERT_TRUE(rt.ok()) << rt.status();
  EXPECT_EQ((*rt)->compute(),
            (NodeCompute{.backend = "cpu", .cpu_gemm = "openblas", .threads = 2}));
  EXPECT_EQ((*rt)->layout().block_size, 8);
  EXPECT_EQ((*rt)->num_blocks(), static_cast<int64_t>((1 << 20) / (*rt)->layout().RegionBytes(1)));
  auto pool = (*rt)->CreatePool();
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->num_blocks(), (*rt)->num_blocks());
  const std::string text = (*rt)->metrics_registry().Render();
  EXPECT_NE(text.find("duet_node_info{node=\"node-t\",role=\"test node\",backend=\"cpu\","
                      "cpu_gemm=\"openblas\",threads=\"2\",block_size=\"8\"} 1"),
            std::string::npos)
      << text;
}

// --kv_dtype reaches the pool's layout, and /metrics says what one token costs in it (an unknown
// name is refused where the flag is parsed: kv_layout_test, cli_test).
TEST_F(NodeRuntimeTest, KvDtypeSetsTheLayoutAndIsReportedPerToken) {
  NodeRuntimeOptions o = Options();
  o.kv_cache_bytes = 1 << 20;
  o.kv_dtype = kv::KvDtype::kInt8;
  auto rt = NodeRuntime::Load(o, {.role = "test node"});
  ASSERT_TRUE(rt.ok()) << rt.status();
  const kv::KvLayout& l = (*rt)->layout();
  EXPECT_EQ(l.dtype, kv::KvDtype::kInt8);
  const double per_token =
      kv::KvBytesPerToken(l.num_layers, l.num_kv_heads, l.head_dim, kv::KvDtype::kInt8);
  EXPECT_EQ(static_cast<double>(l.BytesForTokens(1)), per_token);
  const std::string text = (*rt)->metrics_registry().Render();
  EXPECT_NE(text.find(absl::StrCat("duet_kv_bytes_per_token{node=\"node-t\",role=\"test node\","
                                   "dtype=\"int8\"} ",
                                   static_cast<int64_t>(per_token))),
            std::string::npos)
      << text;
  o.kv_dtype = std::nullopt;
  auto f32 = NodeRuntime::Load(o, {.role = "test node"});
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_EQ((*f32)->layout().dtype, kv::KvDtype::kF32);  // the cpu backend computes in f32
  EXPECT_GT((*f32)->layout().BytesForTokens(1), 3 * l.BytesForTokens(1));
}

TEST_F(NodeRuntimeTest, APoolTooSmallForOneBlockIsRefusedNamingTheSizes) {
  NodeRuntimeOptions o = Options();
  o.kv_cache_bytes = 10;
  auto rt = NodeRuntime::Load(o, {.role = "test node"});
  ASSERT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument) << rt.status();
  EXPECT_NE(rt.status().message().find("a KV cache of 10 bytes"), std::string::npos) << rt.status();
  EXPECT_NE(rt.status().message().find("one block of 16 tokens"), std::string::npos) << rt.status();
}

// What a node registers is the weights dtype its --weights-dtype resolved to, never "auto": on a
// bf16 checkpoint auto keeps the matrices as stored (native) on the invariant GEMM and widens
// them (f32) on OpenBLAS's, so the coordinator keeps such nodes apart; on a float32 checkpoint
// every choice but bf16 computes (and registers) f32.
TEST_F(NodeRuntimeTest, RegistersTheResolvedWeightsDtype) {
  const std::string bf16_dir = dir_ + "_bf16";
  ASSERT_TRUE(model::WriteSyntheticModel("tiny", 5, bf16_dir, {.dtype = "bf16"}).ok());
  struct Case {
    std::string dir;
    std::optional<model::WeightsDtype> asked;
    compute::CpuGemm gemm;
    std::string registered;
  };
  for (const Case& c : std::vector<Case>{
           {bf16_dir, std::nullopt, compute::CpuGemm::kInvariant, "native"},
           {bf16_dir, std::nullopt, compute::CpuGemm::kOpenBlas, "f32"},
           {bf16_dir, model::WeightsDtype::kF32, compute::CpuGemm::kInvariant, "f32"},
           {bf16_dir, model::WeightsDtype::kBf16, compute::CpuGemm::kInvariant, "bf16"},
           {dir_, std::nullopt, compute::CpuGemm::kInvariant, "f32"},
           {dir_, model::WeightsDtype::kNative, compute::CpuGemm::kInvariant, "f32"}}) {
    NodeRuntimeOptions o = Options();
    o.model_dir = c.dir;
    o.weights_dtype = c.asked;
    o.cpu_gemm = c.gemm;
    auto rt = NodeRuntime::Load(o, {.role = "test node"});
    ASSERT_TRUE(rt.ok()) << rt.status();
    EXPECT_EQ((*rt)->compute().weights, c.registered)
        << c.dir << " " << NameOrAuto(c.asked, model::WeightsDtypeName) << " "
        << compute::CpuGemmName(c.gemm);
  }
  std::filesystem::remove_all(bf16_dir);
}

TEST_F(NodeRuntimeTest, BadOptionsAreRefusedByName) {
  NodeRuntimeOptions o = Options();
  o.block_size = 0;
  EXPECT_EQ(NodeRuntime::Load(o, {}).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options();
  o.model_dir = "";
  EXPECT_EQ(NodeRuntime::Load(o, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(NodeRuntimeTest, WithoutACoordinatorJoinIsANoOp) {
  auto rt = NodeRuntime::Load(Options(), {});
  ASSERT_TRUE(rt.ok()) << rt.status();
  EXPECT_TRUE((*rt)->Join({.kind = v1::NODE_KIND_DECODE, .address = "127.0.0.1:1"}).ok());
  EXPECT_EQ((*rt)->epoch(), 0u);
  EXPECT_EQ((*rt)->metrics_port(), -1);
}

}  // namespace
}  // namespace duet::cluster
