// Checks duet against llama.cpp's greedy ids (testdata/*_llamacpp_greedy.json, written by
// scripts/compare_llamacpp.py --fixture): per prompt, llama.cpp's ids up to its first near tie.
//
//   ExpectGreedyEqualsLlamaCpp(*engine, kData + "gemma3_llamacpp_greedy.json", /*min_ids=*/50);
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "common/model/local_engine.h"
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

}  // namespace duet::model::testing
