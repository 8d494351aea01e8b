#include "bench/serve_bench/cache_report.h"

#include <map>

#include "absl/strings/str_format.h"
#include "bench/serve_bench/report.h"
#include "bench/serve_bench/stats.h"

namespace duet::bench {
namespace {

bool Completed(const RequestRecord& r) { return r.ok() && !r.cut_at_end; }

// Sums over completed records; each side's hit rate counts only the records that reported it.
struct CacheTotals {
  int requests = 0;
  int64_t prompt = 0;
  int64_t new_tokens = 0;
  int64_t prefill_cached = 0, prefill_prompt = 0;
  int64_t decode_cached = 0, decode_prompt = 0;
  int64_t kv_bytes = 0;
  std::vector<double> kv_per_request, ttft, gap;

  void Add(const RequestRecord& r) {
    ++requests;
    const int p = r.PromptTokens();
    prompt += p;
    new_tokens += r.new_tokens;
    if (r.cache.prefill_cached_tokens >= 0) {
      prefill_cached += r.cache.prefill_cached_tokens;
      prefill_prompt += p;
    }
    if (r.cache.decode_cached_tokens >= 0) {
      decode_cached += r.cache.decode_cached_tokens;
      decode_prompt += p;
    }
    if (r.cache.kv_bytes_sent >= 0) {
      kv_bytes += r.cache.kv_bytes_sent;
      kv_per_request.push_back(static_cast<double>(r.cache.kv_bytes_sent));
    }
    ttft.push_back(r.TtftMs());
    if (r.HasTpot()) gap.push_back(r.FirstToSecondGapMs());
  }
};

nlohmann::json Rate(int64_t cached, int64_t prompt) {
  if (prompt <= 0) return nullptr;
  return static_cast<double>(cached) / static_cast<double>(prompt);
}

nlohmann::json SummaryOf(const std::vector<double>& v) { return SummaryJson(Summarize(v)); }

std::string Pct(const nlohmann::json& rate) {
  return rate.is_number() ? absl::StrFormat("%5.1f%%", 100 * rate.get<double>()) : "     -";
}

}  // namespace

nlohmann::json SummarizePrefixCache(const std::vector<const RequestRecord*>& records) {
  CacheTotals t;
  for (const RequestRecord* r : records) {
    if (Completed(*r)) t.Add(*r);
  }
  return {{"requests", t.requests},
          {"prompt_tokens", t.prompt},
          {"new_tokens", t.new_tokens},
          {"prefill_cached_tokens", t.prefill_cached},
          {"decode_cached_tokens", t.decode_cached},
          {"hit_rate_prefill", Rate(t.prefill_cached, t.prefill_prompt)},
          {"hit_rate_decode", Rate(t.decode_cached, t.decode_prompt)},
          {"kv_bytes_sent_total", t.kv_bytes},
          {"kv_bytes_sent", SummaryOf(t.kv_per_request)}};
}

nlohmann::json SummarizeByTurn(const std::vector<const RequestRecord*>& records) {
  std::map<int, CacheTotals> by_turn;
  for (const RequestRecord* r : records) {
    if (r->turn >= 0 && Completed(*r)) by_turn[r->turn].Add(*r);
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [turn, t] : by_turn) {
    out.push_back({{"turn", turn},
                   {"requests", t.requests},
                   {"prompt_tokens_mean", static_cast<double>(t.prompt) / t.requests},
                   {"new_tokens_mean", static_cast<double>(t.new_tokens) / t.requests},
                   {"hit_rate_prefill", Rate(t.prefill_cached, t.prefill_prompt)},
                   {"hit_rate_decode", Rate(t.decode_cached, t.decode_prompt)},
                   {"kv_bytes_sent", SummaryOf(t.kv_per_request)},
                   {"ttft_ms", SummaryOf(t.ttft)},
                   {"first_to_second_gap_ms", SummaryOf(t.gap)}});
  }
  return out;
}

std::string FormatPrefixCache(const nlohmann::json& cache, const nlohmann::json& by_turn) {
  std::string out;
  if (cache.value("requests", 0) == 0) return out;
  const nlohmann::json& kv = cache["kv_bytes_sent"];
  absl::StrAppendFormat(&out,
                        "  prefix cache: %d prompt tokens, hit rate P %s D %s  |  KV sent per "
                        "request p50 %.0f mean %.0f bytes (%d reported)\n",
                        cache["prompt_tokens"].get<int64_t>(), Pct(cache["hit_rate_prefill"]),
                        Pct(cache["hit_rate_decode"]), kv["p50"].get<double>(),
                        kv["mean"].get<double>(), kv["count"].get<int>());
  if (by_turn.empty()) return out;
  absl::StrAppendFormat(&out, "  %-5s %5s %9s %8s %7s %7s %13s %10s %10s\n", "turn", "n", "prompt",
                        "new", "hit P", "hit D", "KV bytes p50", "TTFT p50", "gap p50");
  for (const nlohmann::json& t : by_turn) {
    absl::StrAppendFormat(
        &out, "  %-5d %5d %9.1f %8.1f %7s %7s %13.0f %10.2f %10.2f\n", t["turn"].get<int>(),
        t["requests"].get<int>(), t["prompt_tokens_mean"].get<double>(),
        t["new_tokens_mean"].get<double>(), Pct(t["hit_rate_prefill"]), Pct(t["hit_rate_decode"]),
        t["kv_bytes_sent"]["p50"].get<double>(), t["ttft_ms"]["p50"].get<double>(),
        t["first_to_second_gap_ms"]["p50"].get<double>());
  }
  return out;
}

}  // namespace duet::bench
