// Checks duet against llama.cpp's greedy ids (testdata/*_llamacpp_greedy.json, written by
// scripts/compare_llamacpp.py --fixture): per prompt, llama.cpp's ids up to its first near tie.
//
//   ExpectGreedyEqualsLlamaCpp(*engine, kData + "gemma3_llamacpp_greedy.json", /*min_ids=*/50);
//   ExpectTopIdsEqualLlamaCppWhereBothAreClear(*native, *f32, kData + "...", 0.5, 60);
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/engine/local_engine.h"
#include "common/kv/block_table.h"
#include "nlohmann/json.hpp"

namespace duet::model::testing {

// Cases whose smallest top-1 margin (llama.cpp's logits) is below `min_margin` are skipped.
inline void ExpectGreedyEqualsLlamaCpp(LocalEngine& engine, const std::string& fixture,
                                       size_t min_ids, double min_margin = 0) {
  std::ifstream in(fixture);
  ASSERT_TRUE(in.good()) << fixture;
  const nlohmann::json ref = nlohmann::json::parse(in);
  ASSERT_GE(ref["cases"].size(), 5u) << fixture;
  size_t compared = 0;
  for (const nlohmann::json& c : ref["cases"]) {
    if (c["min_margin"].get<double>() < min_margin) continue;
    const std::vector<int32_t> prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    auto got =
        engine.Generate(prompt, {.max_tokens = static_cast<int>(want.size()), .ignore_eos = true});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->generated_ids, want)
        << c["name"] << " (llama.cpp's margins >= " << c["min_margin"] << ")";
    compared += want.size();
  }
  EXPECT_GE(compared, min_ids) << fixture;
}

// The logits of every step of prompt + ids[0, n - 1) (row t: the step that chose ids[t]), from
// two chunks: the prompt but its last token, then the rest with every row's logits.
inline std::vector<float> TeacherForcedLogits(LocalEngine& engine,
                                              const std::vector<int32_t>& prompt,
                                              const std::vector<int32_t>& ids) {
  kv::BlockTable table(&engine.pool());
  std::vector<int32_t> rest = {prompt.back()};
  rest.insert(rest.end(), ids.begin(), ids.end() - 1);
  const int64_t total = static_cast<int64_t>(prompt.size() + rest.size()) - 1;
  EXPECT_TRUE(table.Reserve(total).ok());
  std::vector<SequenceInput> chunks = {
      {.seq_id = 1,
       .tokens = std::vector<int32_t>(prompt.begin(), prompt.end() - 1),
       .start_pos = 0,
       .table = &table,
       .want_logits = false},
      {.seq_id = 1,
       .tokens = rest,
       .start_pos = static_cast<int32_t>(prompt.size()) - 1,
       .table = &table,
       .all_logits = true}};
  for (size_t i = chunks[0].tokens.empty() ? 1 : 0; i < chunks.size(); ++i) {
    auto out = engine.runner().Forward(absl::MakeSpan(&chunks[i], 1), engine.pool().View());
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) return {};
    if (i == 1) return std::move(out->logits);
  }
  return {};
}

// How far row[id] leads every other logit (negative when another is higher).
inline double Lead(const float* row, int vocab, int32_t id) {
  float other = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < vocab; ++j) {
    if (j != id) other = std::max(other, row[j]);
  }
  return static_cast<double>(row[id]) - other;
}

// Teacher-forced against two references: each case's prompt and llama.cpp's ids run through
// `engine` and through `reference` (duet's float32 path). At every step where llama.cpp's id
// leads reference's logits by at least `min_margin` (llama.cpp's own lead is >= the fixture's
// clear margin everywhere), engine's greedy choice must be that id. Steps are judged one by one,
// so a near tie of duet's float32 path drops that step, not the rest of its case; at least
// `min_steps` steps must be compared.
inline void ExpectTopIdsEqualLlamaCppWhereBothAreClear(LocalEngine& engine, LocalEngine& reference,
                                                       const std::string& fixture,
                                                       double min_margin, size_t min_steps) {
  std::ifstream in(fixture);
  ASSERT_TRUE(in.good()) << fixture;
  const nlohmann::json ref = nlohmann::json::parse(in);
  const int vocab = engine.config().vocab_size;
  ASSERT_EQ(reference.config().vocab_size, vocab);
  size_t compared = 0, total = 0;
  for (const nlohmann::json& c : ref["cases"]) {
    const std::vector<int32_t> prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    const std::vector<float> got = TeacherForcedLogits(engine, prompt, want);
    const std::vector<float> base = TeacherForcedLogits(reference, prompt, want);
    ASSERT_EQ(got.size(), want.size() * vocab);
    ASSERT_EQ(base.size(), want.size() * vocab);
    for (size_t t = 0; t < want.size(); ++t) {
      ++total;
      const double base_lead = Lead(base.data() + t * vocab, vocab, want[t]);
      if (base_lead < min_margin) continue;
      ++compared;
      const double lead = Lead(got.data() + t * vocab, vocab, want[t]);
      EXPECT_GT(lead, 0.0) << c["name"] << " step " << t << ": llama.cpp's id " << want[t]
                           << " leads by " << base_lead << " in float32, " << lead << " here";
    }
  }
  EXPECT_GE(compared, min_steps) << fixture << ": " << compared << " of " << total << " steps";
}

}  // namespace duet::model::testing
