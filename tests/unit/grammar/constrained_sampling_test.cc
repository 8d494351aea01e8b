// Structured output on the engine core: the backend masks a row exactly (MaskLogits), and a
// sequence whose SamplingParams carry a grammar samples only what its GrammarConstraint allows,
// on the tiny synthetic model (byte tokenizer), in chunked prefill and decode, greedy and seeded,
// ending with the grammar; a resumed sequence (its earlier output replayed into the matcher)
// continues token-exact; a refused token is never appended; a grammar without a constraint is
// refused rather than ignored.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/compute/compute_backend.h"
#include "common/engine/local_engine.h"
#include "common/engine/sequence.h"
#include "common/engine/step_runner.h"
#include "common/grammar/grammar_compiler.h"
#include "common/grammar/grammar_constraint.h"
#include "common/kv/block_pool.h"
#include "common/kv/kv_cache_manager.h"
#include "common/model/synthetic_model.h"
#include "common/sampling/sampling.h"
#include "nlohmann/json.hpp"

namespace duet::grammar {
namespace {

constexpr int kBlockSize = 4;

TEST(MaskLogitsTest, OnlyTheAllowedTokensKeepTheirLogits) {
  auto backend = compute::CreateBackend(compute::Device::kCpu, {.num_threads = 1});
  ASSERT_TRUE(backend.ok()) << backend.status();
  constexpr int kVocab = 70;  // three words, the last partly used
  std::vector<float> logits(2 * kVocab);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 13) - 6.f;
  const std::vector<float> before = logits;
  std::vector<int32_t> words(model::TokenMaskWords(kVocab), 0);
  const std::set<int> allowed = {0, 31, 32, 63, 69};
  for (int t : allowed) words[t / 32] |= static_cast<int32_t>(1u << (t % 32));
  // Row 1 masked, row 0 left alone.
  ASSERT_TRUE(
      (*backend)->MaskLogits(logits.data(), 2, kVocab, {{.row = 1, .allowed_words = words}}).ok());
  for (int t = 0; t < kVocab; ++t) {
    EXPECT_EQ(logits[t], before[t]) << t;
    if (allowed.count(t)) {
      EXPECT_EQ(logits[kVocab + t], before[kVocab + t]) << t;
    } else {
      EXPECT_TRUE(std::isinf(logits[kVocab + t]) && logits[kVocab + t] < 0) << t;
    }
  }
  // Greedy and seeded sampling of the masked row pick an allowed token; its logprob is the
  // masked row's.
  for (float temperature : {0.f, 1.f, 5.f}) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
      const compute::SampledToken t =
          compute::SampleRowOnHost(logits.data() + kVocab, kVocab,
                                   {.temperature = temperature, .seed = seed, .num_logprobs = 3});
      EXPECT_TRUE(allowed.count(t.id)) << t.id;
    }
  }
  // Bad masks are refused, nothing changed.
  const std::vector<float> now = logits;
  std::vector<int32_t> short_words(1);
  EXPECT_FALSE(
      (*backend)
          ->MaskLogits(logits.data(), 2, kVocab, {{.row = 0, .allowed_words = short_words}})
          .ok());
  EXPECT_FALSE(
      (*backend)->MaskLogits(logits.data(), 2, kVocab, {{.row = 2, .allowed_words = words}}).ok());
  EXPECT_FALSE(
      (*backend)
          ->MaskLogits(logits.data(), 2, kVocab,
                       {{.row = 0, .allowed_words = words}, {.row = 0, .allowed_words = words}})
          .ok());
  EXPECT_EQ(logits, now);
}

// sampling.h's algorithm as its comment states it, over every candidate (-inf ones too): the
// oracle for the host sampler, which leaves -inf candidates out of its sort.
int32_t SpecDraw(const std::vector<float>& l, const compute::RowSampling& p) {
  const int vocab = static_cast<int>(l.size());
  std::vector<int32_t> idx(vocab);
  for (int i = 0; i < vocab; ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(),
            [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  if (p.top_k > 0 && p.top_k < vocab) idx.resize(p.top_k);
  const double max_l = l[idx[0]];
  std::vector<double> w;
  for (int32_t id : idx) w.push_back(std::exp((l[id] - max_l) * (1.0 / p.temperature)));
  size_t keep = idx.size();
  if (p.min_p > 0.f) {
    for (size_t i = 1; i < keep; ++i) {
      if (w[i] < p.min_p) keep = i;
    }
  }
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += w[i];
  if (p.top_p < 1.f) {
    double acc = 0;
    for (size_t i = 0; i < keep; ++i) {
      acc += w[i] / sum;
      if (acc >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += w[i];
  const double u = compute::SamplingUniform(p.seed, p.step) * kept;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += w[i];
    if (u < acc) return idx[i];
  }
  return idx[keep - 1];
}

// Leaving masked candidates out of the sort changes no draw: every seed, top-k (also past the
// allowed count), top-p and min-p give the spec's token, on masked and unmasked rows.
TEST(MaskLogitsTest, LeavingMaskedCandidatesOutOfTheSortChangesNoDraw) {
  constexpr int kVocab = 300;
  std::vector<float> masked(kVocab), plain(kVocab);
  for (int t = 0; t < kVocab; ++t) {
    plain[t] = std::sin(0.37f * t) * 4.f;
    masked[t] = t % 7 == 3 || t % 11 == 0 ? plain[t] : -std::numeric_limits<float>::infinity();
  }
  for (const compute::RowSampling base :
       {compute::RowSampling{.temperature = 0.7f},
        compute::RowSampling{.temperature = 1.5f, .top_k = 5},
        compute::RowSampling{.temperature = 1.f, .top_k = 200},
        compute::RowSampling{.temperature = 1.2f, .top_p = 0.8f},
        compute::RowSampling{.temperature = 2.f, .min_p = 0.05f}}) {
    for (uint64_t seed = 0; seed < 200; ++seed) {
      compute::RowSampling p = base;
      p.seed = seed;
      p.step = static_cast<int64_t>(seed % 5);
      for (const std::vector<float>* row : {&masked, &plain}) {
        ASSERT_EQ(compute::SampleRowOnHost(row->data(), kVocab, p).id, SpecDraw(*row, p))
            << (row == &masked ? "masked" : "plain") << " seed " << seed << " top_k " << p.top_k
            << " top_p " << p.top_p << " min_p " << p.min_p;
      }
    }
  }
}

const std::string& TinyModelDir() {
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    auto* d = new std::string(
        absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/duet_constrained_tiny_", getpid()));
    if (!model::WriteSyntheticModel("tiny", /*seed=*/5, *d).ok()) std::abort();
    return d;
  }();
  return *dir;
}

class ConstrainedSamplingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = model::LocalEngine::Load(TinyModelDir(), {.device = compute::Device::kCpu,
                                                       .num_threads = 1,
                                                       .block_size = kBlockSize,
                                                       .kv_cache_bytes = 16 << 20});
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    auto pool = kv::BlockPool::Create(engine_->runner().MakeKvLayout(kBlockSize), 512);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    kv_ = std::make_unique<kv::KvCacheManager>(pool_.get(),
                                               engine_->runner().PrefixCacheSeed(kBlockSize), true);
    step_ = std::make_unique<engine::StepRunner>(&engine_->runner(), kv_.get(), engine_->eos_ids());
    auto compiler =
        GrammarCompiler::Create(engine_->tokenizer(), engine_->runner().config().vocab_size, {});
    ASSERT_TRUE(compiler.ok()) << compiler.status();
    compiler_ = std::move(*compiler);
  }

  std::vector<int32_t> Prompt(int n, int salt) const {
    std::vector<int32_t> p(n);
    for (int i = 0; i < n; ++i) p[i] = (i * 31 + salt * 17 + 3) % 256;
    return p;
  }

  // A sequence with its constraint and blocks for its tokens.
  engine::Sequence Admit(std::vector<int32_t> tokens, const model::SamplingParams& params,
                         int generated_before = 0) {
    engine::Sequence seq(1, std::move(tokens), generated_before, params, engine_->eos_ids());
    auto c = ConstraintFor(compiler_.get(), seq.params, seq.given_output());
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) seq.constraint = std::move(*c);
    auto blocks = kv_->AllocateSequence(seq.tokens, static_cast<int64_t>(seq.tokens.size()));
    EXPECT_TRUE(blocks.ok()) << blocks.status();
    if (blocks.ok()) seq.table = std::move(*blocks).MakeTable(pool_.get());
    return seq;
  }

  // Prefill in chunks of `chunk`, then decode to the stop.
  model::StopReason RunToStop(engine::Sequence& seq, int64_t chunk) {
    while (true) {
      if (seq.decoding()) EXPECT_TRUE(kv_->Grow(*seq.table, seq.computed() + 1).ok());
      engine::StepItem item{.seq = &seq, .tokens = std::min(chunk, seq.pending())};
      auto out = step_->Run({&item, 1});
      EXPECT_TRUE(out.ok()) << out.status();
      if (!out.ok()) return model::StopReason::kNone;
      EXPECT_TRUE((*out)[0].error.ok()) << (*out)[0].error;
      if (!(*out)[0].error.ok()) return model::StopReason::kNone;
      if ((*out)[0].sampled && (*out)[0].stop != model::StopReason::kNone) return (*out)[0].stop;
    }
  }

  // The output's text, its trailing EOS dropped.
  std::string Text(const engine::Sequence& seq) const {
    std::vector<int32_t> out(seq.given_output().begin(), seq.given_output().end());
    const std::vector<int32_t> eos = engine_->eos_ids();
    if (!out.empty() && std::count(eos.begin(), eos.end(), out.back())) out.pop_back();
    auto text = engine_->tokenizer().Decode(out);
    EXPECT_TRUE(text.ok()) << text.status();
    return text.ok() ? *text : "";
  }

  std::unique_ptr<model::LocalEngine> engine_;
  std::unique_ptr<kv::BlockPool> pool_;
  std::unique_ptr<kv::KvCacheManager> kv_;
  std::unique_ptr<engine::StepRunner> step_;
  std::unique_ptr<GrammarCompiler> compiler_;
};

// Left alone the tiny model emits arbitrary bytes; constrained, every output is one the grammar
// accepts, and it ends with EOS where the grammar is complete.
TEST_F(ConstrainedSamplingTest, OutputsMatchTheirGrammarGreedyAndSeeded) {
  const std::vector<std::string> choices = {"yes", "no", "maybe"};
  for (const GrammarSpec& spec :
       {GrammarSpec::Choice(choices), GrammarSpec::Regex("[0-9]{4}-[a-c]+"),
        GrammarSpec::JsonSchema(R"({"type": "object", "properties": {"n": {"type": "integer"}},
                                    "required": ["n"], "additionalProperties": false})")}) {
    std::set<std::string> seen;
    for (uint64_t seed = 0; seed < 6; ++seed) {
      model::SamplingParams params{
          .temperature = seed == 0 ? 0.f : 1.3f, .seed = seed, .max_tokens = 64, .grammar = spec};
      engine::Sequence seq = Admit(Prompt(9, static_cast<int>(seed)), params);
      ASSERT_NE(seq.constraint, nullptr);
      EXPECT_EQ(RunToStop(seq, /*chunk=*/4), model::StopReason::kEos)
          << GrammarKindName(spec.kind) << " seed " << seed << ": " << Text(seq);
      EXPECT_TRUE(seq.constraint->Terminated());
      const std::string text = Text(seq);
      seen.insert(text);
      switch (spec.kind) {
        case GrammarKind::kChoice:
          EXPECT_TRUE(std::count(choices.begin(), choices.end(), text)) << text;
          break;
        case GrammarKind::kRegex:
          ASSERT_GE(text.size(), 6u) << text;
          for (int i = 0; i < 4; ++i) EXPECT_TRUE(text[i] >= '0' && text[i] <= '9') << text;
          EXPECT_EQ(text[4], '-') << text;
          for (size_t i = 5; i < text.size(); ++i)
            EXPECT_TRUE(text[i] >= 'a' && text[i] <= 'c') << text;
          break;
        default: {
          const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
          ASSERT_FALSE(j.is_discarded()) << text;
          ASSERT_TRUE(j.is_object() && j.size() == 1 && j.contains("n")) << text;
          EXPECT_TRUE(j["n"].is_number_integer()) << text;
        }
      }
      kv_->Finish(*seq.table, seq.tokens, /*publish=*/false);
    }
    EXPECT_GE(seen.size(), 2u) << GrammarKindName(spec.kind) << ": seeds drew one output";
  }
}

// A length-bounded JSON string is JSON: no unescaped control character (a raw tab), escapes
// allowed, and no string holds a UTF-16 surrogate's bytes
// (scripts/patches/xgrammar-0.2.8-json-bounded-strings.patch); sampled documents parse with a
// strict parser.
TEST_F(ConstrainedSamplingTest, BoundedStringsStayJson) {
  const GrammarSpec spec = GrammarSpec::JsonSchema(
      R"({"type": "object", "properties": {"s": {"type": "string", "minLength": 1,
          "maxLength": 6}}, "required": ["s"], "additionalProperties": false})");
  auto bytes = [](const std::string& text) {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  };
  auto accepts = [&](const std::string& text) {
    auto c = MakeGrammarConstraint(compiler_.get(), spec, bytes(text));
    return c.ok();
  };
  EXPECT_TRUE(accepts(R"({"s": "abc"})"));
  EXPECT_FALSE(accepts("{\"s\": \"a\tb\"}")) << "a raw tab inside a string is not JSON";
  EXPECT_FALSE(accepts("{\"s\": \"a\x15\"}")) << "nor any other control character";
  EXPECT_TRUE(accepts(R"({"s": "a\tb"})")) << "an escaped tab is one character";
  EXPECT_TRUE(accepts(R"({"s": "\"q\u00e9"})"));
  EXPECT_FALSE(accepts(R"({"s": "abcdefg"})")) << "7 characters";
  EXPECT_TRUE(accepts("{\"s\": \"\xc3\xa9\xe2\x82\xac\"}")) << "two code points in UTF-8";
  EXPECT_FALSE(accepts("{\"s\": \"\xed\xa0\x80\"}")) << "a UTF-16 surrogate is not UTF-8";
  // The unbounded string too.
  const GrammarSpec free_string = GrammarSpec::JsonSchema(R"({"type": "string"})");
  EXPECT_FALSE(MakeGrammarConstraint(compiler_.get(), free_string, bytes("\"\xed\xaf\x9d\"")).ok());
  EXPECT_TRUE(MakeGrammarConstraint(compiler_.get(), free_string, bytes("\"\xc3\xa9\"")).ok());
  for (uint64_t seed = 0; seed < 12; ++seed) {
    model::SamplingParams params{
        .temperature = 1.5f, .seed = seed, .max_tokens = 200, .grammar = spec};
    engine::Sequence seq = Admit(Prompt(6, static_cast<int>(seed)), params);
    ASSERT_EQ(RunToStop(seq, 8), model::StopReason::kEos) << seed;
    const std::string text = Text(seq);
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << "seed " << seed << ": " << text;
    kv_->Finish(*seq.table, seq.tokens, /*publish=*/false);
  }
}

// A request resumed after k output tokens (its prompt ends with them; the constraint replays
// them) continues exactly as the uninterrupted run: what a decode node or a re-route does.
TEST_F(ConstrainedSamplingTest, AResumedSequenceContinuesTokenExact) {
  const model::SamplingParams params{.temperature = 1.1f,
                                     .seed = 7,
                                     .max_tokens = 40,
                                     .grammar = GrammarSpec::Regex("[a-z]{3,12}")};
  engine::Sequence whole = Admit(Prompt(10, 3), params);
  ASSERT_EQ(RunToStop(whole, 16), model::StopReason::kEos);
  const std::vector<int32_t> out(whole.given_output().begin(), whole.given_output().end());
  kv_->Finish(*whole.table, whole.tokens, /*publish=*/false);
  ASSERT_GE(out.size(), 4u);
  for (int k : {1, 2, 3}) {
    std::vector<int32_t> tokens = Prompt(10, 3);
    tokens.insert(tokens.end(), out.begin(), out.begin() + k);
    engine::Sequence resumed = Admit(tokens, params, /*generated_before=*/k);
    ASSERT_EQ(RunToStop(resumed, 5), model::StopReason::kEos) << k;
    EXPECT_EQ(std::vector<int32_t>(resumed.given_output().begin(), resumed.given_output().end()),
              out)
        << "resumed after " << k;
    kv_->Finish(*resumed.table, resumed.tokens, /*publish=*/false);
  }
  // Replaying tokens the grammar refuses is an error naming the token, not a constraint.
  const int32_t digit = '7';
  auto refused = ConstraintFor(compiler_.get(), params, {&digit, 1});
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("token 55"), std::string::npos) << refused.status();
}

TEST_F(ConstrainedSamplingTest, ARefusedTokenIsNeverAppended) {
  const model::SamplingParams params{.max_tokens = 8, .grammar = GrammarSpec::Choice({"ab"})};
  engine::Sequence seq = Admit(Prompt(5, 1), params);
  const size_t before = seq.tokens.size();
  auto bad = step_->Append(seq, 'b');  // "ab" must start with 'a'
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(seq.tokens.size(), before);
  EXPECT_EQ(seq.sampling_state.generated(), 0);
  auto good = step_->Append(seq, 'a');  // the prefill node's first token, say
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(*good, model::StopReason::kNone);
  kv_->Finish(*seq.table, seq.tokens, /*publish=*/false);
}

// A grammar is never silently dropped: a sequence carrying one without its constraint is
// refused by the step, and a node without a tokenizer refuses to build one.
TEST_F(ConstrainedSamplingTest, AGrammarWithoutItsConstraintIsRefused) {
  const model::SamplingParams params{.max_tokens = 8, .grammar = GrammarSpec::JsonObject()};
  engine::Sequence seq = Admit(Prompt(5, 2), params);
  seq.constraint.reset();
  engine::StepItem item{.seq = &seq, .tokens = seq.pending()};
  auto out = step_->Run({&item, 1});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("structured output"), std::string::npos) << out.status();
  kv_->Finish(*seq.table, seq.tokens, /*publish=*/false);
  auto none = ConstraintFor(nullptr, params, {});
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(absl::IsUnimplemented(none.status())) << none.status();
  // And the sampling parameters refuse what cannot be combined with a grammar.
  EXPECT_FALSE((model::SamplingParams{.ignore_eos = true, .grammar = GrammarSpec::JsonObject()})
                   .Validate(512)
                   .ok());
  EXPECT_FALSE((model::SamplingParams{.min_tokens = 2, .grammar = GrammarSpec::JsonObject()})
                   .Validate(512)
                   .ok());
}

}  // namespace
}  // namespace duet::grammar
