// The prefix-cache part of the serving benchmark's report: over the completed requests of a
// class, prompt tokens, the tokens the prefill side (P, or the colocated server) and the decode
// side (D) took from their caches, the hit rates (cached prompt tokens / prompt tokens; null
// when the endpoint reported nothing), and the KV bytes P sent to D per request; for multi_turn
// runs the same by turn index, with TTFT and the first-to-second-token gap.
//
//   nlohmann::json c = SummarizePrefixCache(records);   // c["hit_rate_prefill"], ...
//   nlohmann::json t = SummarizeByTurn(records);        // [] when no record has a turn
//   std::string lines = FormatPrefixCache(c, t);        // for FormatTable
#pragma once

#include <string>
#include <vector>

#include "bench/serve_bench/request_record.h"
#include "nlohmann/json.hpp"

namespace duet::bench {

// Over the records that completed (ok, not cut at the end).
nlohmann::json SummarizePrefixCache(const std::vector<const RequestRecord*>& records);

// One entry per turn index present, ascending: {"turn", "requests", "prompt_tokens_mean",
// "new_tokens_mean", "hit_rate_prefill", "hit_rate_decode", "kv_bytes_sent" (summary),
// "ttft_ms", "first_to_second_gap_ms" (summaries)}.
nlohmann::json SummarizeByTurn(const std::vector<const RequestRecord*>& records);

std::string FormatPrefixCache(const nlohmann::json& cache, const nlohmann::json& by_turn);

}  // namespace duet::bench
