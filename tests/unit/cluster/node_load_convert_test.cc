// NodeLoad survives the trip through duet.v1.NodeLoad that every heartbeat makes.
#include "cluster/node_load_convert.h"

#include "gtest/gtest.h"

namespace duet::cluster {
namespace {

TEST(NodeLoadConvert, RoundTripsEveryField) {
  const NodeLoad load{.free_blocks = 40,
                      .total_blocks = 100,
                      .queued_tokens = 7,
                      .running_requests = 3,
                      .evictable_blocks = 5,
                      .cached_blocks = 9};
  const v1::NodeLoad p = LoadToProto(load);
  EXPECT_EQ(p.free_blocks(), 40);
  EXPECT_EQ(p.total_blocks(), 100);
  EXPECT_EQ(p.queued_tokens(), 7);
  EXPECT_EQ(p.running_requests(), 3);
  EXPECT_EQ(p.evictable_blocks(), 5);
  EXPECT_EQ(p.cached_blocks(), 9);
  EXPECT_EQ(LoadFromProto(p), load);
  EXPECT_EQ(LoadFromProto(v1::NodeLoad()), NodeLoad{});
}

TEST(NodeComputeConvert, RoundTripsEveryField) {
  const NodeCompute compute{
      .backend = "cpu", .cpu_gemm = "openblas", .threads = 4, .weights = "native"};
  const v1::NodeCompute p = ComputeToProto(compute);
  EXPECT_EQ(p.backend(), "cpu");
  EXPECT_EQ(p.cpu_gemm(), "openblas");
  EXPECT_EQ(p.threads(), 4);
  EXPECT_EQ(p.weights(), "native");
  EXPECT_EQ(ComputeFromProto(p), compute);
  EXPECT_EQ(compute.Numerics(), "cpu, gemm openblas, weights native");
  EXPECT_EQ((NodeCompute{.backend = "cuda"}).Numerics(), "cuda");
  const NodeCompute bf16{.backend = "cpu", .cpu_gemm = "invariant", .weights = "bf16"};
  EXPECT_EQ(ComputeFromProto(ComputeToProto(bf16)), bf16);
  EXPECT_EQ(bf16.Numerics(), "cpu, gemm invariant, weights bf16");
  EXPECT_NE(bf16.Numerics(), (NodeCompute{.backend = "cpu", .cpu_gemm = "invariant"}).Numerics());
  // A node that reports no weights keeps them in f32.
  v1::NodeCompute old = p;
  old.clear_weights();
  EXPECT_EQ(ComputeFromProto(old).weights, "f32");
}

}  // namespace
}  // namespace duet::cluster
