#include "bench/serve_bench/report.h"

#include <cctype>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/serve_bench/cache_report.h"

namespace duet::bench {
namespace {

// Errors are grouped by their message with every run of digits replaced by '#', so that
// per-request ids and counters do not make each error its own group.
std::string ErrorPattern(const std::string& message) {
  std::string out;
  for (size_t i = 0; i < message.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(message[i]))) {
      if (out.empty() || out.back() != '#') out.push_back('#');
    } else {
      out.push_back(message[i]);
    }
  }
  return out;
}

}  // namespace

bool MeetsSlo(const RequestRecord& r, const Slo& slo) {
  if (r.cut_at_end || !r.ok()) return false;
  return MeetsSlo(slo, r.TtftMs(), r.HasTpot() ? r.SloTpotMs() : 0, r.HasTpot(), r.E2eMs());
}

SloAttainment MeasureSloAttainment(const std::vector<const RequestRecord*>& records,
                                   const Slo& slo) {
  SloAttainment a;
  for (const RequestRecord* r : records) {
    if (r->cut_at_end) continue;
    ++a.requests;
    if (!r->ok()) continue;
    const bool ttft = slo.ttft_ms <= 0 || r->TtftMs() <= slo.ttft_ms;
    const bool tpot = slo.tpot_ms <= 0 || !r->HasTpot() || r->SloTpotMs() <= slo.tpot_ms;
    const bool e2e = slo.e2e_ms <= 0 || r->E2eMs() <= slo.e2e_ms;
    a.met_ttft += ttft;
    a.met_tpot += tpot;
    a.met_e2e += e2e;
    a.met_all += ttft && tpot && e2e;
  }
  return a;
}

nlohmann::json SummaryJson(const Summary& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"min", s.min}, {"p50", s.p50},
          {"p90", s.p90},     {"p99", s.p99},   {"max", s.max}};
}

nlohmann::json SummarizeClass(const std::vector<const RequestRecord*>& records, double duration_s,
                              const ReportOptions& options) {
  std::vector<double> ttft, tpot, itl, e2e, gap, lag, prompt, output;
  std::vector<double> queue, reserve, prefill, tail, admission, server_ttft, tail_share, resume;
  std::vector<double> last_layer, max_layer;
  int completed = 0, failed = 0, cut = 0, retried = 0, short_output = 0, resumed = 0, resumes = 0;
  int64_t out_tokens = 0, in_tokens = 0;
  std::map<std::string, std::pair<std::string, int>> errors;  // pattern -> (example, count)
  for (const RequestRecord* r : records) {
    if (r->cut_at_end) {
      // Still streaming when the run ended (a long background decode): its tokens so far are
      // real measurements of the latencies, though the request counts in no throughput.
      ++cut;
      if (!r->token_ns.empty()) ttft.push_back(r->TtftMs());
      if (r->HasTpot()) {
        tpot.push_back(r->TpotMs());
        gap.push_back(r->FirstToSecondGapMs());
        for (double x : r->ItlMs()) itl.push_back(x);
      }
      continue;
    }
    if (!r->ok()) {
      ++failed;
      const std::string msg(r->status.message());
      auto& e = errors[ErrorPattern(msg)];
      if (e.second++ == 0) e.first = msg;
      continue;
    }
    ++completed;
    if (r->output_tokens() < r->max_tokens) ++short_output;
    ttft.push_back(r->TtftMs());
    e2e.push_back(r->E2eMs());
    lag.push_back(r->schedule_lag_ms);
    if (r->HasTpot()) {
      tpot.push_back(r->TpotMs());
      gap.push_back(r->FirstToSecondGapMs());
      for (double x : r->ItlMs()) itl.push_back(x);
    }
    const int p = r->PromptTokens();
    prompt.push_back(p);
    output.push_back(r->output_tokens());
    in_tokens += p;
    out_tokens += r->output_tokens();
    if (r->has_server_timings) {
      const ServerTimings& s = r->server;
      queue.push_back(s.queue_us / 1e3);
      reserve.push_back(s.reserve_us / 1e3);
      prefill.push_back(s.prefill_compute_us / 1e3);
      tail.push_back(s.transfer_tail_us / 1e3);
      admission.push_back(s.decode_admission_us / 1e3);
      server_ttft.push_back(s.ttft_us / 1e3);
      if (s.ttft_us > 0) tail_share.push_back(100.0 * s.transfer_tail_us / s.ttft_us);
      if (s.last_layer_transfer_us >= 0) last_layer.push_back(s.last_layer_transfer_us / 1e3);
      if (s.max_layer_transfer_us >= 0) max_layer.push_back(s.max_layer_transfer_us / 1e3);
      if (s.prefill_attempts > 1) ++retried;
      if (s.resumes > 0) {
        ++resumed;
        resumes += s.resumes;
        resume.push_back(s.resume_us / 1e3 / s.resumes);
      }
    }
  }
  const double d = duration_s > 0 ? duration_s : 1;
  nlohmann::json err = nlohmann::json::array();
  for (const auto& [pattern, e] : errors) {
    err.push_back({{"message", e.first}, {"pattern", pattern}, {"count", e.second}});
  }
  nlohmann::json j;
  j["requests"] = {{"completed", completed},     {"failed", failed},
                   {"cut_at_end", cut},          {"short_output", short_output},
                   {"prefill_retried", retried}, {"resumed", resumed},
                   {"resumes", resumes}};
  j["errors"] = err;
  j["throughput"] = {{"requests_per_s", completed / d},
                     {"output_tokens_per_s", out_tokens / d},
                     {"total_tokens_per_s", (in_tokens + out_tokens) / d}};
  // DistServe's goodput at this rate: the requests per second that met every SLO, and the
  // attainment (their share of the requests that ended) against its target.
  const SloAttainment a = MeasureSloAttainment(records, options.slo);
  const double attainment = a.Fraction(a.met_all);
  j["goodput"] = {{"requests_per_s", a.met_all / d},
                  {"fraction", attainment},
                  {"slo_attainment", attainment},
                  {"ttft_attainment", a.Fraction(a.met_ttft)},
                  {"tpot_attainment", a.Fraction(a.met_tpot)},
                  {"e2e_attainment", a.Fraction(a.met_e2e)},
                  {"requests_met", a.met_all},
                  {"requests_judged", a.requests},
                  {"attainment_target", options.slo.attainment},
                  {"meets_target", a.requests > 0 && attainment >= options.slo.attainment - 1e-12},
                  {"slo_ttft_ms", options.slo.ttft_ms},
                  {"slo_tpot_ms", options.slo.tpot_ms},
                  {"slo_e2e_ms", options.slo.e2e_ms}};
  j["latency_ms"] = {
      {"ttft", SummaryJson(Summarize(ttft))}, {"first_to_second_gap", SummaryJson(Summarize(gap))},
      {"tpot", SummaryJson(Summarize(tpot))}, {"itl", SummaryJson(Summarize(itl))},
      {"e2e", SummaryJson(Summarize(e2e))},   {"schedule_lag", SummaryJson(Summarize(lag))}};
  j["server_ms"] = {{"queue", SummaryJson(Summarize(queue))},
                    {"reserve", SummaryJson(Summarize(reserve))},
                    {"prefill_compute", SummaryJson(Summarize(prefill))},
                    {"transfer_tail", SummaryJson(Summarize(tail))},
                    {"decode_admission", SummaryJson(Summarize(admission))},
                    {"ttft", SummaryJson(Summarize(server_ttft))},
                    {"last_layer_transfer", SummaryJson(Summarize(last_layer))},
                    {"slowest_layer_transfer", SummaryJson(Summarize(max_layer))},
                    {"resume", SummaryJson(Summarize(resume))}};
  j["transfer_tail_pct_of_ttft"] = SummaryJson(Summarize(tail_share));
  j["prompt_tokens"] = SummaryJson(Summarize(prompt));
  j["output_tokens"] = SummaryJson(Summarize(output));
  j["prefix_cache"] = SummarizePrefixCache(records);
  if (nlohmann::json t = SummarizeByTurn(records); !t.empty()) j["by_turn"] = std::move(t);
  return j;
}

nlohmann::json BuildReport(const RunResult& result, const ReportOptions& options) {
  std::map<std::string, std::vector<const RequestRecord*>> by_class;
  for (const RequestRecord& r : result.records) {
    by_class[r.cls].push_back(&r);
    by_class["all"].push_back(&r);
  }
  nlohmann::json j;
  j["duration_s"] = result.DurationS();
  j["warmup_failures"] = result.warmup_failures;
  j["abandoned_turns"] = result.abandoned_turns;
  j["classes"] = nlohmann::json::object();
  by_class.try_emplace("all");
  for (const auto& [cls, recs] : by_class) {
    j["classes"][cls] = SummarizeClass(recs, result.DurationS(), options);
  }
  if (options.per_request) {
    nlohmann::json reqs = nlohmann::json::array();
    for (const RequestRecord& r : result.records) {
      nlohmann::json q{{"class", r.cls},
                       {"ok", r.ok()},
                       {"cut_at_end", r.cut_at_end},
                       {"send_s", (r.send_ns - result.start_ns) / 1e9},
                       {"prompt_tokens", r.prompt_tokens},
                       {"output_tokens", r.output_tokens()},
                       {"finish_reason", r.finish_reason}};
      if (!r.status.ok()) q["error"] = std::string(r.status.message());
      if (!r.cut_at_end) q["slo_met"] = MeetsSlo(r, options.slo);
      if (r.prefix_group >= 0) q["prefix_group"] = r.prefix_group;
      if (r.session >= 0) {
        q["session"] = r.session;
        q["turn"] = r.turn;
      }
      if (r.prefix_group >= 0 || r.session >= 0) q["new_tokens"] = r.new_tokens;
      if (r.cache.prefill_cached_tokens >= 0) {
        q["prefill_cached_tokens"] = r.cache.prefill_cached_tokens;
      }
      if (r.cache.decode_cached_tokens >= 0)
        q["decode_cached_tokens"] = r.cache.decode_cached_tokens;
      if (r.cache.kv_bytes_sent >= 0) q["kv_bytes_sent"] = r.cache.kv_bytes_sent;
      if (r.ok()) {
        q["ttft_ms"] = r.TtftMs();
        q["e2e_ms"] = r.E2eMs();
        if (r.HasTpot()) {
          q["tpot_ms"] = r.TpotMs();
          q["gap_ms"] = r.FirstToSecondGapMs();
        }
      }
      if (r.has_server_timings) {
        q["server_us"] = {{"queue", r.server.queue_us},
                          {"reserve", r.server.reserve_us},
                          {"prefill_compute", r.server.prefill_compute_us},
                          {"transfer_tail", r.server.transfer_tail_us},
                          {"decode_admission", r.server.decode_admission_us},
                          {"ttft", r.server.ttft_us}};
      }
      reqs.push_back(std::move(q));
    }
    j["requests"] = std::move(reqs);
  }
  return j;
}

std::string FormatTable(const nlohmann::json& report) {
  std::string out = absl::StrFormat("duration %.1f s\n", report.value("duration_s", 0.0));
  for (const auto& [cls, c] : report["classes"].items()) {
    if (cls == "all" && report["classes"].size() == 2) continue;  // same as the one class
    const auto& rq = c["requests"];
    absl::StrAppendFormat(
        &out,
        "\n[%s] completed %d  failed %d  cut at end %d  |  %.3f req/s  %.1f out tok/s  "
        "goodput %.3f req/s (%.0f%%)\n",
        cls, rq["completed"].get<int>(), rq["failed"].get<int>(), rq["cut_at_end"].get<int>(),
        c["throughput"]["requests_per_s"].get<double>(),
        c["throughput"]["output_tokens_per_s"].get<double>(),
        c["goodput"]["requests_per_s"].get<double>(), 100 * c["goodput"]["fraction"].get<double>());
    const auto& g = c["goodput"];
    if (g.value("slo_ttft_ms", 0.0) > 0 || g.value("slo_tpot_ms", 0.0) > 0 ||
        g.value("slo_e2e_ms", 0.0) > 0) {
      std::string limits;
      for (const auto& [key, name] :
           {std::pair{"slo_ttft_ms", "TTFT"}, std::pair{"slo_tpot_ms", "TPOT"},
            std::pair{"slo_e2e_ms", "E2E"}}) {
        if (g[key].get<double>() <= 0) continue;
        absl::StrAppendFormat(&limits, "%s%s <= %g ms", limits.empty() ? "" : ", ", name,
                              g[key].get<double>());
      }
      absl::StrAppendFormat(
          &out,
          "  SLO (%s): attainment %.1f%% of %d (target %.0f%%: %s)  TTFT alone %.1f%%  TPOT "
          "alone %.1f%%  goodput %.3f req/s\n",
          limits, 100 * g["slo_attainment"].get<double>(), g["requests_judged"].get<int>(),
          100 * g["attainment_target"].get<double>(),
          g["meets_target"].get<bool>() ? "met" : "missed",
          100 * g["ttft_attainment"].get<double>(), 100 * g["tpot_attainment"].get<double>(),
          g["requests_per_s"].get<double>());
    }
    absl::StrAppendFormat(&out, "  %-28s %10s %10s %10s %10s %6s\n", "ms", "p50", "p90", "p99",
                          "mean", "n");
    auto row = [&](const std::string& name, const nlohmann::json& s) {
      absl::StrAppendFormat(&out, "  %-28s %10.2f %10.2f %10.2f %10.2f %6d\n", name,
                            s["p50"].get<double>(), s["p90"].get<double>(), s["p99"].get<double>(),
                            s["mean"].get<double>(), s["count"].get<int>());
    };
    const auto& l = c["latency_ms"];
    row("TTFT", l["ttft"]);
    row("1st->2nd token gap", l["first_to_second_gap"]);
    row("TPOT", l["tpot"]);
    row("ITL", l["itl"]);
    row("end to end", l["e2e"]);
    const auto& s = c["server_ms"];
    row("server: queue", s["queue"]);
    row("server: reserve", s["reserve"]);
    row("server: prefill compute", s["prefill_compute"]);
    row("server: transfer tail", s["transfer_tail"]);
    row("server: decode admission", s["decode_admission"]);
    if (s["last_layer_transfer"]["count"].get<int>() > 0) {
      row("server: last layer transfer", s["last_layer_transfer"]);
      row("server: slowest layer transfer", s["slowest_layer_transfer"]);
    }
    row("transfer tail % of TTFT", c["transfer_tail_pct_of_ttft"]);
    if (c.contains("prefix_cache")) {
      out += FormatPrefixCache(c["prefix_cache"], c.value("by_turn", nlohmann::json::array()));
    }
    for (const auto& e : c["errors"]) {
      absl::StrAppendFormat(&out, "  error x%d: %s\n", e["count"].get<int>(),
                            e["message"].get<std::string>());
    }
  }
  return out;
}

}  // namespace duet::bench
