// ModelRunner invariants (docs/design.md §5): the KV cache is exact (decode == full recompute,
// invariant 2), a sequence's results do not depend on its batch (the ground of invariant 1), the
// layer-done hook fires once per layer after the layer's K/V are in the pool, and bad input
// changes nothing.
#include "common/model/model_runner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/compute/compute_backend.h"
#include "common/engine/local_engine.h"
#include "common/kv/block_pool.h"
#include "common/kv/block_table.h"
#include "common/model/synthetic_model.h"
#include "common/weights/weights.h"
#include "tests/unit/model/runner_test_util.h"

namespace duet::model {
namespace {

namespace fs = std::filesystem;
using testing::ExpectBatchInvariant;
using testing::ExpectDecodeAndChunksEqualRecompute;
using testing::MakeModel;
using testing::Model;
using testing::RelErr;
using testing::ReserveFor;
using testing::RunOne;
using testing::Tokens;

struct GqaCase {
  int heads, kv_heads;
};

class KvCacheExactTest : public ::testing::TestWithParam<GqaCase> {};

// Decode with the cache gives the logits of a full recompute of the prefix, for lengths that
// cross block boundaries.
TEST_P(KvCacheExactTest, DecodeMatchesRecompute) {
  SyntheticOverrides o;
  o.num_heads = GetParam().heads;
  o.num_kv_heads = GetParam().kv_heads;
  o.head_dim = 16;
  o.hidden = 16 * GetParam().heads;
  Model m = MakeModel(o, /*block_size=*/8);
  const int vocab = m.runner->config().vocab_size;
  for (int prefix : {1, 7, 8, 9, 23}) {
    const std::vector<int32_t> all = Tokens(prefix + 4, prefix, vocab);
    kv::BlockTable cached(m.pool.get());
    RunOne(m, cached, std::vector<int32_t>(all.begin(), all.begin() + prefix));
    for (int step = 0; step < 4; ++step) {
      const int pos = prefix + step;
      std::vector<float> dec = RunOne(m, cached, {all[pos]});
      kv::BlockTable fresh(m.pool.get());
      std::vector<float> full =
          RunOne(m, fresh, std::vector<int32_t>(all.begin(), all.begin() + pos + 1));
      ASSERT_EQ(dec.size(), full.size());
      EXPECT_LT(RelErr(dec, full), 1e-4) << "prefix " << prefix << " step " << step;
    }
  }
  EXPECT_EQ(m.pool->num_available(), m.pool->num_blocks());
}

INSTANTIATE_TEST_SUITE_P(GqaRatios, KvCacheExactTest,
                         ::testing::Values(GqaCase{4, 4}, GqaCase{6, 2}, GqaCase{8, 2}),
                         [](const auto& info) {
                           return "heads" + std::to_string(info.param.heads) + "_kv" +
                                  std::to_string(info.param.kv_heads);
                         });

// Every architecture's block (q/k norms, Gemma's sandwich norms, GeGLU, embedding scale, per-layer
// windows and RoPE bases) keeps the cache exact and chunking harmless: decode and chunked prefill
// give the logits of a full recompute, also past the sliding window.
struct ArchCase {
  const char* arch;
  int layers;
  int window;
};
class ArchKvExactTest : public ::testing::TestWithParam<ArchCase> {};

TEST_P(ArchKvExactTest, DecodeAndChunksMatchRecompute) {
  SyntheticOverrides o;
  o.architecture = GetParam().arch;
  o.num_layers = GetParam().layers;
  if (GetParam().window > 0) o.sliding_window = GetParam().window;
  Model m = MakeModel(o, /*block_size=*/8);
  const ModelConfig& c = m.runner->config();
  if (c.is_gemma()) {
    ASSERT_EQ(c.LayerWindow(0), GetParam().window);
    ASSERT_EQ(c.LayerWindow(5), 0);  // every 6th layer is global
  }
  const int vocab = c.vocab_size;
  const std::vector<int32_t> all = Tokens(30, 9, vocab);
  kv::BlockTable cached(m.pool.get());
  RunOne(m, cached, std::vector<int32_t>(all.begin(), all.begin() + 11));
  for (int pos = 11; pos < 30; ++pos) {
    std::vector<float> dec = RunOne(m, cached, {all[pos]});
    kv::BlockTable fresh(m.pool.get());
    std::vector<float> full =
        RunOne(m, fresh, std::vector<int32_t>(all.begin(), all.begin() + pos + 1));
    ASSERT_EQ(dec.size(), full.size());
    EXPECT_LT(RelErr(dec, full), 1e-4) << c.architecture << " position " << pos;
  }
  kv::BlockTable a(m.pool.get()), b(m.pool.get());
  std::vector<float> one = RunOne(m, a, all);
  RunOne(m, b, std::vector<int32_t>(all.begin(), all.begin() + 17));
  std::vector<float> chunked = RunOne(m, b, std::vector<int32_t>(all.begin() + 17, all.end()));
  EXPECT_LT(RelErr(chunked, one), 1e-4) << c.architecture;
}

INSTANTIATE_TEST_SUITE_P(Architectures, ArchKvExactTest,
                         ::testing::Values(ArchCase{"Qwen2ForCausalLM", 2, 0},
                                           ArchCase{"Qwen3ForCausalLM", 2, 0},
                                           ArchCase{"MistralForCausalLM", 2, 8},
                                           ArchCase{"Gemma3ForCausalLM", 6, 8}),
                         [](const auto& info) { return std::string(info.param.arch); });

// Gemma's sliding window changes its logits on a prompt longer than the window (so the test
// above checks it past the window, not a no-op).
TEST(ModelRunnerTest, GemmaSlidingWindowMatters) {
  SyntheticOverrides o;
  o.architecture = "Gemma3ForCausalLM";
  o.num_layers = 6;
  o.sliding_window = 8;
  Model gemma = MakeModel(o);
  o.sliding_window = 0;
  Model no_window = MakeModel(o);
  const int vocab = gemma.runner->config().vocab_size;
  const std::vector<int32_t> t = Tokens(24, 4, vocab);
  kv::BlockTable a(gemma.pool.get()), b(no_window.pool.get());
  std::vector<float> with = RunOne(gemma, a, t);
  std::vector<float> without = RunOne(no_window, b, t);
  EXPECT_GT(RelErr(with, without), 1e-3) << "the sliding window changed nothing";
}

TEST(ModelRunnerTest, ChunkedPrefillMatchesOneShot) {
  Model m = MakeModel({});
  const auto t = Tokens(40, 3, m.runner->config().vocab_size);
  kv::BlockTable a(m.pool.get()), b(m.pool.get());
  std::vector<float> one = RunOne(m, a, t);
  RunOne(m, b, std::vector<int32_t>(t.begin(), t.begin() + 17));
  std::vector<float> chunked = RunOne(m, b, std::vector<int32_t>(t.begin() + 17, t.end()));
  EXPECT_LT(RelErr(chunked, one), 1e-4);
}

constexpr kv::KvDtype kKvDtypes[] = {kv::KvDtype::kF32, kv::KvDtype::kBF16, kv::KvDtype::kF16,
                                     kv::KvDtype::kInt8, kv::KvDtype::kFp8E4M3};

class KvDtypeTest : public ::testing::TestWithParam<kv::KvDtype> {};

// In every KV dtype the cache is exact: decode with the cache, and a prefill in chunks, give
// bitwise the logits of a full recompute (each token is quantized once, on its own, when it is
// written), across block boundaries.
TEST_P(KvDtypeTest, DecodeAndChunksEqualRecomputeBitwise) {
  Model m = MakeModel({}, /*block_size=*/8, 256, 2, GetParam());
  ExpectDecodeAndChunksEqualRecompute(m, kv::KvDtypeName(GetParam()));
}

// A narrower KV dtype changes the logits (it is really used), but only by its rounding.
class NarrowKvDtypeTest : public ::testing::TestWithParam<kv::KvDtype> {};

TEST_P(NarrowKvDtypeTest, LogitsStayCloseToF32Kv) {
  Model f32 = MakeModel({}, 16, 64, 2, kv::KvDtype::kF32);
  Model q = MakeModel({}, 16, 64, 2, GetParam());
  EXPECT_NE(q.pool->layout().BytesForTokens(1), f32.pool->layout().BytesForTokens(1));
  const auto t = Tokens(40, 9, f32.runner->config().vocab_size);
  kv::BlockTable a(f32.pool.get()), b(q.pool.get());
  const std::vector<float> want = RunOne(f32, a, t), got = RunOne(q, b, t);
  const double err = RelErr(got, want);
  EXPECT_GT(err, 0.0) << kv::KvDtypeName(GetParam());
  EXPECT_LT(err, GetParam() == kv::KvDtype::kFp8E4M3 ? 0.1 : 0.03) << kv::KvDtypeName(GetParam());
}

// A sequence's logits are bitwise identical alone and inside a batch that mixes prefill and
// decode sequences, whatever its position and the thread count, in every KV dtype.
TEST_P(KvDtypeTest, ResultsAreBatchInvariant) {
  ExpectBatchInvariant([d = GetParam()](int threads) { return MakeModel({}, 16, 256, threads, d); },
                       kv::KvDtypeName(GetParam()));
}

// all_logits gives one row per new token, each bitwise the last-token logits of that prefix (so
// a text scored in chunks is scored as token-by-token decoding would), in every KV dtype.
TEST_P(KvDtypeTest, AllLogitsRowsAreEachPrefixsLogits) {
  Model m = MakeModel({}, 8, 256, 2, GetParam());
  const int vocab = m.runner->config().vocab_size;
  const auto t = Tokens(12, 4, vocab);
  kv::BlockTable table(m.pool.get());
  RunOne(m, table, std::vector<int32_t>(t.begin(), t.begin() + 5));
  std::vector<SequenceInput> b = {{.seq_id = 7,
                                   .tokens = std::vector<int32_t>(t.begin() + 5, t.end()),
                                   .start_pos = 5,
                                   .table = &table,
                                   .all_logits = true}};
  ASSERT_TRUE(ReserveFor(b).ok());
  auto out = m.runner->Forward(absl::MakeSpan(b), m.pool->View());
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->seq_ids.size(), 7u);
  for (int i = 0; i < 7; ++i) {
    kv::BlockTable fresh(m.pool.get());
    const std::vector<float> want =
        RunOne(m, fresh, std::vector<int32_t>(t.begin(), t.begin() + 6 + i));
    EXPECT_EQ(0, std::memcmp(out->Row(i), want.data(), vocab * sizeof(float))) << "row " << i;
    EXPECT_EQ(out->seq_ids[i], 7);
  }
  // With `sample`, the rows are the same and the last one's token is what sampling it alone
  // draws; the other rows draw nothing.
  SamplingParams params{.temperature = 0.8f, .seed = 11, .logprobs = 3};
  kv::BlockTable other(m.pool.get());
  RunOne(m, other, std::vector<int32_t>(t.begin(), t.begin() + 5));
  std::vector<SequenceInput> both = {{.seq_id = 8,
                                      .tokens = std::vector<int32_t>(t.begin() + 5, t.end()),
                                      .start_pos = 5,
                                      .table = &other,
                                      .all_logits = true,
                                      .sample = &params}};
  ASSERT_TRUE(ReserveFor(both).ok());
  auto sampled = m.runner->Forward(absl::MakeSpan(both), m.pool->View());
  ASSERT_TRUE(sampled.ok()) << sampled.status();
  ASSERT_EQ(sampled->seq_ids.size(), 7u);
  ASSERT_EQ(sampled->tokens.size(), 7u);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(0, std::memcmp(sampled->Row(i), out->Row(i), vocab * sizeof(float))) << i;
    if (i < 6) {
      EXPECT_EQ(sampled->tokens[i].id, -1) << i;
    }
  }
  const SampledToken want = Sample(out->Row(6), vocab, params, 0);
  EXPECT_EQ(sampled->tokens[6].id, want.id);
  EXPECT_EQ(sampled->tokens[6].logprob, want.logprob);
  EXPECT_EQ(sampled->tokens[6].top_logprobs, want.top_logprobs);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KvDtypeTest, ::testing::ValuesIn(kKvDtypes),
                         [](const auto& info) { return kv::KvDtypeName(info.param); });
INSTANTIATE_TEST_SUITE_P(Dtypes, NarrowKvDtypeTest,
                         ::testing::Values(kv::KvDtype::kBF16, kv::KvDtype::kF16,
                                           kv::KvDtype::kInt8, kv::KvDtype::kFp8E4M3),
                         [](const auto& info) { return kv::KvDtypeName(info.param); });

TEST(ModelRunnerTest, LayerHookFiresPerLayerWithKvAlreadyInThePool) {
  Model m = MakeModel({});
  const int layers = m.runner->config().num_hidden_layers;
  kv::BlockTable t(m.pool.get());
  std::vector<SequenceInput> b = {{.seq_id = 42, .tokens = Tokens(19, 4, 300), .table = &t}};
  std::vector<int> seen;
  auto hook = [&](int layer, absl::Span<const LayerSpan> spans) {
    seen.push_back(layer);
    ASSERT_EQ(spans.size(), 1u);
    EXPECT_EQ(spans[0].seq_id, 42);
    EXPECT_EQ(spans[0].start_pos, 0);
    EXPECT_EQ(spans[0].num_tokens, 19);
    // The layer's K for the last token is written (non-zero) when the hook runs; the next
    // layer's is not yet.
    const kv::KvCacheView v = m.pool->View();
    const kv::BlockId blk = (*spans[0].blocks)[18 / 16];
    const float* k = v.KeyPtr<float>(layer, blk, 18 % 16);
    bool any = false;
    for (int i = 0; i < v.layout.token_elems(); ++i) any |= (k[i] != 0.f);
    EXPECT_TRUE(any) << "layer " << layer << " K not in the pool at hook time";
    if (layer + 1 < layers) {
      const float* next = v.KeyPtr<float>(layer + 1, blk, 18 % 16);
      for (int i = 0; i < v.layout.token_elems(); ++i) ASSERT_EQ(next[i], 0.f);
    }
  };
  ASSERT_TRUE(ReserveFor(b).ok());
  ASSERT_TRUE(m.runner->Forward(absl::MakeSpan(b), m.pool->View(), hook).ok());
  std::vector<int> want(layers);
  for (int i = 0; i < layers; ++i) want[i] = i;
  EXPECT_EQ(seen, want);
}

// An abandoned pass stops after the layer it was abandoned in, leaves each table as it was
// (the blocks its caller reserved, and its tokens), and the same tokens run again give exactly
// the uninterrupted result.
TEST(ModelRunnerTest, AbandonedPassStopsAtTheLayerAndLeavesTheTablesAsTheyWere) {
  Model m = MakeModel({});
  const int vocab = m.runner->config().vocab_size;
  ASSERT_GE(m.runner->config().num_hidden_layers, 2);
  kv::BlockTable t(m.pool.get()), ref(m.pool.get());
  const std::vector<int32_t> head = Tokens(10, 1, vocab), tail = Tokens(30, 2, vocab);
  for (kv::BlockTable* table : {&t, &ref}) {
    std::vector<SequenceInput> b = {{.tokens = head, .table = table}};
    ASSERT_TRUE(ReserveFor(b).ok());
    ASSERT_TRUE(m.runner->Forward(absl::MakeSpan(b), m.pool->View()).ok());
  }
  std::vector<int> seen;
  std::vector<SequenceInput> cut = {
      {.tokens = tail, .start_pos = 10, .table = &t, .want_logits = true}};
  ASSERT_TRUE(ReserveFor(cut).ok());  // 40 tokens: 3 blocks of 16
  const int64_t available = m.pool->num_available();
  const std::vector<kv::BlockId> blocks = t.blocks();
  ASSERT_EQ(blocks.size(), 3u);
  auto r = m.runner->Forward(
      absl::MakeSpan(cut), m.pool->View(),
      [&](int layer, absl::Span<const LayerSpan>) { seen.push_back(layer); },
      [&] { return seen.size() == 1; });
  EXPECT_TRUE(absl::IsCancelled(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("abandoned after layer 0"), std::string::npos) << r.status();
  EXPECT_EQ(seen, std::vector<int>{0});
  EXPECT_EQ(t.num_tokens(), 10);
  EXPECT_EQ(t.blocks(), blocks);
  EXPECT_EQ(m.pool->num_available(), available);

  std::vector<SequenceInput> again = {
      {.tokens = tail, .start_pos = 10, .table = &t, .want_logits = true}};
  std::vector<SequenceInput> whole = {
      {.tokens = tail, .start_pos = 10, .table = &ref, .want_logits = true}};
  ASSERT_TRUE(ReserveFor(whole).ok());
  auto a = m.runner->Forward(absl::MakeSpan(again), m.pool->View(), nullptr, [] { return false; });
  auto w = m.runner->Forward(absl::MakeSpan(whole), m.pool->View());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(a->logits, w->logits);
  EXPECT_EQ(t.num_tokens(), 40);
  EXPECT_EQ(t.blocks(), blocks);
}

// Forward never allocates: a table without room for its new tokens fails the whole batch with
// FailedPrecondition naming the sequence, and no table or block changes (the caller grows them).
TEST(ModelRunnerTest, TableWithoutRoomIsRefusedAndNothingIsAllocated) {
  Model m = MakeModel({}, /*block_size=*/16, /*num_blocks=*/8);
  const int vocab = m.runner->config().vocab_size;
  kv::BlockTable roomy(m.pool.get()), short_table(m.pool.get());
  ASSERT_TRUE(roomy.Reserve(20).ok());
  ASSERT_TRUE(short_table.Reserve(16).ok());  // one block: 16 tokens of room, 20 needed
  const std::vector<kv::BlockId> roomy_blocks = roomy.blocks(), short_blocks = short_table.blocks();
  const int64_t available = m.pool->num_available();
  std::vector<int> layers;
  std::vector<SequenceInput> b = {
      {.seq_id = 1, .tokens = Tokens(20, 1, vocab), .table = &roomy},
      {.seq_id = 2, .tokens = Tokens(20, 2, vocab), .table = &short_table}};
  auto r =
      m.runner->Forward(absl::MakeSpan(b), m.pool->View(),
                        [&](int layer, absl::Span<const LayerSpan>) { layers.push_back(layer); });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("sequence 2"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("20 tokens"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("capacity 16"), std::string::npos) << r.status();
  EXPECT_TRUE(layers.empty());
  EXPECT_EQ(m.pool->num_available(), available);
  EXPECT_EQ(roomy.blocks(), roomy_blocks);
  EXPECT_EQ(short_table.blocks(), short_blocks);
  EXPECT_EQ(roomy.num_tokens(), 0);
  EXPECT_EQ(short_table.num_tokens(), 0);
  // An empty table has no room either; once the caller reserves, the same batch runs.
  kv::BlockTable empty(m.pool.get());
  std::vector<SequenceInput> one = {{.seq_id = 3, .tokens = {1, 2}, .table = &empty}};
  EXPECT_EQ(m.runner->Forward(absl::MakeSpan(one), m.pool->View()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(empty.blocks().empty());
  EXPECT_EQ(m.pool->num_available(), available);
  ASSERT_TRUE(short_table.Reserve(20).ok());
  auto ok = m.runner->Forward(absl::MakeSpan(b), m.pool->View());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(short_table.num_tokens(), 20);
  EXPECT_EQ(short_table.blocks().size(), 2u);
}

TEST(ModelRunnerTest, BadInputIsRefusedAndChangesNothing) {
  Model m = MakeModel({}, 16, /*num_blocks=*/4);
  const int vocab = m.runner->config().vocab_size;
  kv::BlockTable t(m.pool.get()), u(m.pool.get());
  ASSERT_TRUE(t.Reserve(2).ok());  // room, so that only the input is wrong
  std::vector<SequenceInput> bad_id = {{.tokens = {1, vocab}, .table = &t}};
  auto r = m.runner->Forward(absl::MakeSpan(bad_id), m.pool->View());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("outside the vocabulary"), std::string::npos);
  std::vector<SequenceInput> bad_pos = {{.tokens = {1}, .start_pos = 3, .table = &t}};
  EXPECT_EQ(m.runner->Forward(absl::MakeSpan(bad_pos), m.pool->View()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.num_tokens(), 0);
  EXPECT_EQ(t.blocks().size(), 1u);
  // 40 + 40 tokens need 6 blocks of 16; the pool has 4: the caller's Reserve is out of blocks,
  // and Forward refuses the batch it could not grow.
  std::vector<SequenceInput> too_big = {{.seq_id = 1, .tokens = Tokens(40, 1, vocab), .table = &t},
                                        {.seq_id = 2, .tokens = Tokens(40, 2, vocab), .table = &u}};
  EXPECT_EQ(ReserveFor(too_big).code(), absl::StatusCode::kResourceExhausted);
  const int64_t available = m.pool->num_available();
  EXPECT_EQ(m.runner->Forward(absl::MakeSpan(too_big), m.pool->View()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.pool->num_available(), available);
  EXPECT_EQ(t.num_tokens(), 0);
  EXPECT_EQ(u.num_tokens(), 0);
  // A pool of another layout is refused, naming both.
  kv::KvLayout other = m.runner->MakeKvLayout(16);
  other.num_kv_heads += 1;
  auto other_pool = *kv::BlockPool::Create(other, 4);
  std::vector<SequenceInput> ok = {{.tokens = {1, 2}, .table = &t}};
  auto mismatch = m.runner->Forward(absl::MakeSpan(ok), other_pool->View());
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kFailedPrecondition);
}

// Forward with `sample` gives exactly the token Sample() picks from Forward's logits, per
// sequence (its own parameters and step), in batches that mix sequences that sample, want
// logits, or both; sampled-only batches bring no logits to the host.
TEST(ModelRunnerTest, SamplingInForwardEqualsSampleOfTheLogits) {
  Model m = MakeModel({});
  const int vocab = m.runner->config().vocab_size;
  const std::vector<SamplingParams> params = {
      {.logprobs = 3},
      {.temperature = 0.9f, .top_k = 20, .seed = 4},
      {.temperature = 1.3f, .top_p = 0.8f, .seed = 11, .logprobs = 5},
      {.temperature = 0.7f, .seed = 2}};
  const int n = static_cast<int>(params.size());
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);  // 0: all sample; 1: all both; 2: mixed
    std::vector<std::unique_ptr<kv::BlockTable>> ref_tables, tables;
    for (int i = 0; i < n; ++i) {
      ref_tables.push_back(std::make_unique<kv::BlockTable>(m.pool.get()));
      tables.push_back(std::make_unique<kv::BlockTable>(m.pool.get()));
    }
    std::vector<std::vector<int32_t>> next(n);
    for (int i = 0; i < n; ++i) next[i] = Tokens(5 + 3 * i, i, vocab);
    for (int step = 0; step < 3; ++step) {
      std::vector<SequenceInput> ref, batch;
      for (int i = 0; i < n; ++i) {
        ref.push_back({.seq_id = i,
                       .tokens = next[i],
                       .start_pos = static_cast<int32_t>(ref_tables[i]->num_tokens()),
                       .table = ref_tables[i].get(),
                       .want_logits = true});
        const bool sample = variant != 2 || i % 2 == 1;
        batch.push_back({.seq_id = i,
                         .tokens = next[i],
                         .start_pos = static_cast<int32_t>(tables[i]->num_tokens()),
                         .table = tables[i].get(),
                         .want_logits = variant != 0 || !sample,
                         .sample = sample ? &params[i] : nullptr,
                         .sample_step = step + i});
      }
      ASSERT_TRUE(ReserveFor(ref).ok());
      ASSERT_TRUE(ReserveFor(batch).ok());
      auto want = m.runner->Forward(absl::MakeSpan(ref), m.pool->View());
      auto got = m.runner->Forward(absl::MakeSpan(batch), m.pool->View());
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->seq_ids, want->seq_ids);
      ASSERT_EQ(got->tokens.size(), static_cast<size_t>(n));
      EXPECT_EQ(got->logits.size(), variant == 0 ? 0u : want->logits.size());
      for (int i = 0; i < n; ++i) {
        SCOPED_TRACE(i);
        const SampledToken& t = got->tokens[i];
        if (batch[i].sample == nullptr) {
          EXPECT_EQ(t.id, -1);
          next[i] = {static_cast<int32_t>(step * 31 + i) % vocab};
          continue;
        }
        const SampledToken expect = Sample(want->Row(i), vocab, params[i], step + i);
        EXPECT_EQ(t.id, expect.id);
        EXPECT_EQ(t.logprob, expect.logprob);
        EXPECT_EQ(t.top_logprobs, expect.top_logprobs);
        next[i] = {t.id};
      }
      if (variant == 2) {  // the logits of the mixed batch are the reference's
        EXPECT_EQ(got->logits, want->logits);
      }
    }
  }
  // Bad sampling parameters are refused before anything runs.
  kv::BlockTable t(m.pool.get());
  const SamplingParams bad{.temperature = 1.f, .top_p = 0.f};
  std::vector<SequenceInput> b = {{.tokens = {1, 2}, .table = &t, .sample = &bad}};
  auto r = m.runner->Forward(absl::MakeSpan(b), m.pool->View());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.num_tokens(), 0);
}

// Penalties and min_tokens sample from the sequence's SamplingState, which Forward requires
// (and checks against sample_step).
TEST(ModelRunnerTest, PenaltiesSampleFromTheSequencesState) {
  Model m = MakeModel({});
  const int vocab = m.runner->config().vocab_size;
  const SamplingParams p{.temperature = 0.8f,
                         .seed = 3,
                         .min_p = 0.02f,
                         .repetition_penalty = 1.4f,
                         .presence_penalty = 0.5f,
                         .frequency_penalty = 0.3f,
                         .logit_bias = {{1, 3.f}},
                         .min_tokens = 2};
  const std::vector<int32_t> prompt = Tokens(6, 1, vocab);
  SamplingState state(p, {0}, prompt, {});
  kv::BlockTable ref_table(m.pool.get()), table(m.pool.get());
  std::vector<int32_t> next = prompt;
  for (int step = 0; step < 4; ++step) {
    std::vector<SequenceInput> ref = {{.tokens = next,
                                       .start_pos = static_cast<int32_t>(ref_table.num_tokens()),
                                       .table = &ref_table}};
    std::vector<SequenceInput> b = {{.tokens = next,
                                     .start_pos = static_cast<int32_t>(table.num_tokens()),
                                     .table = &table,
                                     .want_logits = false,
                                     .sample = &p,
                                     .sample_step = step,
                                     .sample_state = &state}};
    ASSERT_TRUE(ReserveFor(ref).ok());
    ASSERT_TRUE(ReserveFor(b).ok());
    auto want = m.runner->Forward(absl::MakeSpan(ref), m.pool->View());
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = m.runner->Forward(absl::MakeSpan(b), m.pool->View());
    ASSERT_TRUE(got.ok()) << got.status();
    const SampledToken expect = Sample(want->Row(0), vocab, p, step, &state);
    EXPECT_EQ(got->tokens[0].id, expect.id);
    EXPECT_EQ(got->tokens[0].logprob, expect.logprob);
    state.AddGenerated(expect.id);
    next = {expect.id};
  }
  kv::BlockTable t(m.pool.get());
  std::vector<SequenceInput> no_state = {{.tokens = {1, 2}, .table = &t, .sample = &p}};
  EXPECT_EQ(m.runner->Forward(absl::MakeSpan(no_state), m.pool->View()).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<SequenceInput> wrong_step = {
      {.tokens = {1, 2}, .table = &t, .sample = &p, .sample_step = 1, .sample_state = &state}};
  EXPECT_EQ(m.runner->Forward(absl::MakeSpan(wrong_step), m.pool->View()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.num_tokens(), 0);
}

TEST(LocalEngineTest, GreedyGenerationIsDeterministicAndStops) {
  const fs::path dir = fs::temp_directory_path() / ("duet_engine_test_" + std::to_string(getpid()));
  ASSERT_TRUE(WriteSyntheticModel("tiny", 5, dir.string()).ok());
  auto e1 =
      LocalEngine::Load(dir.string(), {.device = compute::Device::kCpu, .kv_cache_bytes = 8 << 20});
  auto e2 = LocalEngine::Load(
      dir.string(), {.device = compute::Device::kCpu, .num_threads = 1, .kv_cache_bytes = 8 << 20});
  fs::remove_all(dir);
  ASSERT_TRUE(e1.ok()) << e1.status();
  ASSERT_TRUE(e2.ok()) << e2.status();
  auto ids = (*e1)->tokenizer().Encode("Hello, duet", true);
  ASSERT_TRUE(ids.ok());
  SamplingParams p{.max_tokens = 12, .ignore_eos = true};
  auto a = (*e1)->Generate(*ids, p);
  auto b = (*e2)->Generate(*ids, p);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->generated_ids, b->generated_ids);
  EXPECT_EQ(a->generated_ids.size(), 12u);
  EXPECT_EQ(a->stop, StopReason::kMaxTokens);
  EXPECT_EQ(a->decode_ms.size(), 11u);
  // Stop on the third generated token.
  SamplingParams stop = p;
  stop.stop_token_ids = {a->generated_ids[2]};
  auto c = (*e1)->Generate(*ids, stop);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->stop, StopReason::kStopToken);
  EXPECT_LE(c->generated_ids.size(), 3u);
  EXPECT_EQ((*e1)->pool().num_available(), (*e1)->pool().num_blocks());
  EXPECT_FALSE((*e1)->Generate({}, p).ok());
}

// Generate grows its table before each Forward: a prompt, or a generation, past the pool fails
// with the pool's ResourceExhausted, and its blocks come back.
TEST(LocalEngineTest, GenerationPastThePoolIsResourceExhausted) {
  const fs::path dir = fs::temp_directory_path() / ("duet_engine_full_" + std::to_string(getpid()));
  ASSERT_TRUE(WriteSyntheticModel("tiny", 5, dir.string()).ok());
  // kv_cache_bytes = 1: a pool of one block of 4 tokens.
  auto e = LocalEngine::Load(
      dir.string(), {.device = compute::Device::kCpu, .block_size = 4, .kv_cache_bytes = 1});
  fs::remove_all(dir);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ((*e)->pool().num_blocks(), 1);
  const SamplingParams p{.max_tokens = 8, .ignore_eos = true};
  auto fits = (*e)->Generate({1, 2, 3}, {.max_tokens = 2, .ignore_eos = true});
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->generated_ids.size(), 2u);
  auto long_prompt = (*e)->Generate({1, 2, 3, 4, 5}, p);
  EXPECT_TRUE(absl::IsResourceExhausted(long_prompt.status())) << long_prompt.status();
  auto long_generation = (*e)->Generate({1, 2, 3}, p);  // the 5th token has no room
  EXPECT_TRUE(absl::IsResourceExhausted(long_generation.status())) << long_generation.status();
  EXPECT_EQ((*e)->pool().num_available(), 1);
}

// A model directory with config.json and safetensors but no tokenizer files runs ids in, ids
// out (vLLM's --skip-tokenizer-init), generating what the same model with its tokenizer does.
TEST(LocalEngineTest, ModelWithoutTokenizerFilesRunsOnIds) {
  const fs::path dir =
      fs::temp_directory_path() / ("duet_engine_notok_" + std::to_string(getpid()));
  ASSERT_TRUE(WriteSyntheticModel("tiny", 5, dir.string()).ok());
  auto with =
      LocalEngine::Load(dir.string(), {.device = compute::Device::kCpu, .kv_cache_bytes = 8 << 20});
  ASSERT_TRUE(with.ok()) << with.status();
  ASSERT_TRUE(fs::remove(dir / "tokenizer_config.json"));
  auto without =
      LocalEngine::Load(dir.string(), {.device = compute::Device::kCpu, .kv_cache_bytes = 8 << 20});
  fs::remove_all(dir);
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_TRUE((*with)->has_tokenizer());
  EXPECT_FALSE((*without)->has_tokenizer());
  const SamplingParams p{.max_tokens = 6, .ignore_eos = true};
  auto a = (*with)->Generate({1, 2, 3, 4}, p);
  auto b = (*without)->Generate({1, 2, 3, 4}, p);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->generated_ids, b->generated_ids);
}

}  // namespace
}  // namespace duet::model
