// Shared fixtures of the prefill node tests: a synthetic tiny model on disk, a reference engine
// (LocalEngine: what one process would compute), and a decode side made of an inproc transport
// and a second BlockPool standing for the decode node's pool.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "common/engine/local_engine.h"
#include "common/kv/block_pool.h"
#include "common/kv/block_table.h"
#include "common/model/synthetic_model.h"
#include "duet/v1/decode.pb.h"
#include "duet/v1/prefill.grpc.pb.h"
#include "proto/channel.h"
#include "proto/status_util.h"
#include "transfer/kv_stream/kv_notice.h"
#include "transfer/transport.h"

namespace duet::prefill::testing {

// Written on first use (again after RemoveTinyModel), deterministic from its seed.
inline const std::string& TinyModelDir() {
  static const std::string dir =
      (std::filesystem::temp_directory_path() / ("duet_prefill_test_" + std::to_string(getpid())))
          .string();
  if (!std::filesystem::exists(dir + "/config.json")) {
    absl::Status s = model::WriteSyntheticModel("tiny", 5, dir);
    EXPECT_TRUE(s.ok()) << s;
  }
  return dir;
}

inline void RemoveTinyModel() { std::filesystem::remove_all(TinyModelDir()); }

inline std::vector<int32_t> Prompt(int n, int salt, int vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 131 + salt * 17 + 3) % vocab;
  return t;
}

// The single-process reference.
struct Reference {
  std::unique_ptr<model::LocalEngine> engine;

  static Reference Load(int block_size) {
    Reference r;
    auto e = model::LocalEngine::Load(TinyModelDir(), {.device = compute::Device::kCpu,
                                                       .num_threads = 2,
                                                       .block_size = block_size,
                                                       .kv_cache_bytes = 8 << 20});
    EXPECT_TRUE(e.ok()) << e.status();
    if (e.ok()) r.engine = std::move(*e);
    return r;
  }
  int32_t FirstToken(const std::vector<int32_t>& prompt, const model::SamplingParams& p = {}) {
    model::SamplingParams one = p;
    one.max_tokens = 1;
    auto g = engine->Generate(prompt, one);
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? g->generated_ids[0] : -1;
  }
  // The logprob of each prompt token after the first given the ones before it, and the best
  // `top` ids at its position, from one pass over the whole prompt (log-softmax in doubles).
  struct Scored {
    float logprob;
    std::vector<int32_t> top;
  };
  std::vector<Scored> PromptLogprobs(const std::vector<int32_t>& prompt, int top) {
    kv::BlockTable table(&engine->pool());
    EXPECT_TRUE(table.Reserve(static_cast<int64_t>(prompt.size())).ok());
    std::vector<model::SequenceInput> b = {
        {.seq_id = 1, .tokens = prompt, .start_pos = 0, .table = &table, .all_logits = true}};
    auto out = engine->runner().Forward(absl::MakeSpan(b), engine->pool().View());
    EXPECT_TRUE(out.ok()) << out.status();
    std::vector<Scored> scored;
    if (!out.ok()) return scored;
    for (size_t i = 0; i + 1 < prompt.size(); ++i) {
      const float* row = out->Row(i);
      double m = row[0], z = 0;
      for (int v = 0; v < out->vocab; ++v) m = std::max<double>(m, row[v]);
      for (int v = 0; v < out->vocab; ++v) z += std::exp(row[v] - m);
      std::vector<int32_t> ids(out->vocab);
      std::iota(ids.begin(), ids.end(), 0);
      std::stable_sort(ids.begin(), ids.end(),
                       [&](int32_t a, int32_t c) { return row[a] > row[c]; });
      ids.resize(top);
      scored.push_back({static_cast<float>(row[prompt[i + 1]] - (m + std::log(z))), ids});
    }
    return scored;
  }
  // Checks that every prompt token's K and V in `dest` (blocks `dest_blocks` of `dest_pool`,
  // holding the prompt's blocks from `first_block` on) equal, bit for bit, what a one-shot
  // prefill of `prompt` writes.
  void ExpectKvEquals(const std::vector<int32_t>& prompt, const kv::BlockPool& dest_pool,
                      const std::vector<kv::BlockId>& dest_blocks, int64_t first_block = 0) {
    kv::BlockTable table(&engine->pool());
    ASSERT_TRUE(table.Reserve(static_cast<int64_t>(prompt.size())).ok());
    std::vector<model::SequenceInput> b = {
        {.seq_id = 1, .tokens = prompt, .start_pos = 0, .table = &table, .want_logits = true}};
    auto out = engine->runner().Forward(absl::MakeSpan(b), engine->pool().View());
    ASSERT_TRUE(out.ok()) << out.status();
    const kv::KvLayout& l = dest_pool.layout();
    ASSERT_EQ(l, engine->pool().layout());
    const size_t tok_bytes = l.token_elems() * l.dtype_bytes();
    const int64_t n = static_cast<int64_t>(prompt.size());
    ASSERT_EQ(static_cast<int64_t>(dest_blocks.size()), l.BlocksForTokens(n) - first_block);
    int mismatches = 0;
    for (int layer = 0; layer < l.num_layers; ++layer) {
      for (size_t k = 0; k < dest_blocks.size(); ++k) {
        const int64_t i = first_block + static_cast<int64_t>(k);
        const int64_t filled = std::min<int64_t>(l.block_size, n - i * l.block_size);
        const uint8_t* want = engine->pool().BlockAddress(layer, table.blocks()[i]);
        const uint8_t* got = dest_pool.BlockAddress(layer, dest_blocks[k]);
        for (size_t half : {size_t{0}, l.HalfBlockBytes()}) {
          if (std::memcmp(want + half, got + half, filled * tok_bytes) != 0 && mismatches++ < 5) {
            ADD_FAILURE() << "KV differs: layer " << layer << " block " << i
                          << (half ? " (V)" : " (K)") << " of a " << n << "-token prompt";
          }
        }
      }
    }
  }
};

// What the decode side received, per transfer id.
struct Received {
  std::vector<transfer::KvNotice> notices;  // in arrival order
  bool HasFinal() const {
    for (const auto& n : notices)
      if (n.kind == transfer::KvNoticeKind::kFinal) return true;
    return false;
  }
  bool HasAborted() const {
    for (const auto& n : notices)
      if (n.kind == transfer::KvNoticeKind::kAborted) return true;
    return false;
  }
};

inline void Drain(transfer::Transport& t, std::map<uint64_t, Received>& got) {
  for (transfer::Notice& n : t.DrainNotices()) {
    auto k = transfer::DecodeKvNotice(n.payload);
    ASSERT_TRUE(k.ok()) << k.status();
    got[k->request_id].notices.push_back(*k);
  }
}

// Every layer exactly once, then the final notice last; returns the KvCompletion it carried.
inline v1::KvCompletion ExpectCompleteStream(const Received& r, int num_layers) {
  v1::KvCompletion c;
  std::vector<int> seen(num_layers, 0);
  EXPECT_FALSE(r.notices.empty());
  for (size_t i = 0; i < r.notices.size(); ++i) {
    const transfer::KvNotice& n = r.notices[i];
    if (n.kind == transfer::KvNoticeKind::kLayer) {
      EXPECT_TRUE(n.layer >= 0 && n.layer < num_layers) << n.layer;
      if (n.layer >= 0 && n.layer < num_layers) ++seen[n.layer];
    } else {
      EXPECT_EQ(n.kind, transfer::KvNoticeKind::kFinal);
      EXPECT_EQ(i, r.notices.size() - 1) << "the final notice must come last";
      EXPECT_TRUE(c.ParseFromString(n.payload));
    }
  }
  for (int l = 0; l < num_layers; ++l) EXPECT_EQ(seen[l], 1) << "layer " << l;
  return c;
}

// Calls Prefill and checks its three-message protocol: `scheduled` alone, the first token
// (kv_landed false, no transfer timings), then kv_landed with the same token. Returns the last
// message, or the call's error.
inline absl::StatusOr<v1::PrefillResponse> CallPrefill(v1::PrefillNode::Stub* stub,
                                                       const v1::PrefillRequest& req) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, absl::Seconds(30));
  auto reader = stub->Prefill(&ctx, req);
  std::vector<v1::PrefillResponse> got;
  v1::PrefillResponse m;
  while (reader->Read(&m)) got.push_back(m);
  absl::Status s = rpc::FromGrpcStatus(reader->Finish());
  if (!s.ok()) return s;
  EXPECT_EQ(got.size(), 3u);
  if (got.size() != 3u) return absl::InternalError("Prefill did not answer with three messages");
  EXPECT_TRUE(got[0].scheduled());
  EXPECT_EQ(got[0].request_id(), req.request_id());
  EXPECT_EQ(got[0].prefill_compute_us(), 0);
  EXPECT_FALSE(got[1].scheduled());
  EXPECT_FALSE(got[1].kv_landed());
  EXPECT_EQ(got[1].layer_transfer_us_size(), 0);
  EXPECT_TRUE(got[2].kv_landed());
  EXPECT_FALSE(got[2].scheduled());
  EXPECT_EQ(got[1].first_token_id(), got[2].first_token_id());
  EXPECT_EQ(got[1].prefill_compute_us(), got[2].prefill_compute_us());
  return got[2];
}

}  // namespace duet::prefill::testing
