// goodput_sim: predicts the goodput of colocated and xPyD placements with a discrete-event
// simulation (simulator.h) driven by per-phase cost models fitted to engine_bench runs, checks
// the prediction against scripts/bench_goodput.sh's measured sweep, then searches the xPyD
// splits of 2, 4, 8 units on machines whose compute:bandwidth ratio differs from this one's.
// A benchmark tool: it prints (and with --out writes) Markdown.
//
//   goodput_sim --engine_json_node bench/results/goodput/costs/engine-1thread.json
//               --engine_json_colocated bench/results/goodput/costs/engine-2threads.json
//               --raw_dir bench/results/goodput/raw [--units 2,4,8] [--compute_ratios 1,4,8,16]
//               [--input_len 32-64 --output_len 32 --slo_ttft_ms 300 --slo_tpot_ms 100]
//               [--out FILE.md]
//
// Cost models: a prefill pass is fixed + per token (the engine_bench prefill rows), a decode
// step fixed + per sequence + per cached K/V token (the decode rows at --engine_context; the
// K/V read per token is its bytes / the run's measured read bandwidth). The node fit (1 thread:
// one core, as each node of the measured 1P1D) drives the disaggregated units and every unit of
// the predictions; the colocated fit (2 threads) the measured colocated engine. What
// engine_bench does not see is calibrated per setup on the sweep's two lowest rates
// (Calibrate): a serving overhead per pass and per decoding sequence (the mean TPOT at both
// rates) and a first-token latency that occupies no unit (the rest of the mean TTFT at the
// lowest rate); the other rates are the check.
// A prediction at compute ratio r divides the compute-bound terms by r and keeps the memory-bound
// ones (ScaleTo): decode costs stay as measured, so the SLOs keep their meaning.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/goodput_sim/cost_model.h"
#include "bench/goodput_sim/goodput_search.h"
#include "bench/goodput_sim/simulator.h"
#include "common/base/status.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, engine_json_node, "",
          "engine_bench --json of one node's unit (--threads 1): prefill and decode rows");
ABSL_FLAG(std::string, engine_json_colocated, "",
          "engine_bench --json of the colocated engine (--threads 2)");
ABSL_FLAG(int, engine_context, 64, "the --context of both engine_bench runs");
ABSL_FLAG(std::string, raw_dir, "bench/results/goodput/raw",
          "bench_goodput.sh's reports (SETUP-rateR.json); empty: no calibration or check");
ABSL_FLAG(int, validation_seeds, 20, "simulated repeats (seeds) of each measured rate");
ABSL_FLAG(double, transfer_gbps, 14.0,
          "KV transfer GB/s (shm memcpy lane of transfer/README.md's transfer_bench table)");
ABSL_FLAG(std::string, units, "2,4,8", "units to place");
ABSL_FLAG(std::string, compute_ratios, "1,2,4,8,16,32",
          "compute:bandwidth of the predicted unit over this machine's core's");
ABSL_FLAG(std::string, input_len, "32-64", "prediction prompts, N or A-B (uniform)");
ABSL_FLAG(std::string, output_len, "32", "prediction output tokens, N or A-B");
ABSL_FLAG(double, slo_ttft_ms, 300, "TTFT target");
ABSL_FLAG(double, slo_tpot_ms, 100, "TPOT target");
ABSL_FLAG(double, slo_attainment, 0.9, "share of requests that must meet both");
ABSL_FLAG(double, sim_duration_s, 600, "simulated seconds of arrivals per goodput probe");
ABSL_FLAG(int, seed, 1, "workload seed of the goodput search");
ABSL_FLAG(std::string, out, "", "also write the Markdown report here");

namespace duet::goodput_sim {
namespace {

using nlohmann::json;

absl::StatusOr<json> ReadJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not JSON"));
  return j;
}

absl::StatusOr<LengthRange> ParseRange(const std::string& flag, const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, '-');
  LengthRange r;
  if (parts.size() == 1 && absl::SimpleAtoi(parts[0], &r.lo)) {
    r.hi = r.lo;
  } else if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &r.lo) ||
             !absl::SimpleAtoi(parts[1], &r.hi)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": not N or A-B: ", text));
  }
  if (r.lo < 1 || r.hi < r.lo) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": needs 1 <= A <= B: ", text));
  }
  return r;
}

template <typename T>
absl::StatusOr<std::vector<T>> ParseList(const std::string& flag, const std::string& text) {
  std::vector<T> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    T v;
    bool ok;
    if constexpr (std::is_same_v<T, int>) {
      ok = absl::SimpleAtoi(part, &v) && v > 0;
    } else {
      ok = absl::SimpleAtod(part, &v) && v > 0;
    }
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": not > 0: ", part));
    out.push_back(v);
  }
  return out;
}

// What an engine_bench run gives the model.
struct EngineFit {
  UnitCosts costs;
  double prefill_residual_ms = 0;
  double decode_residual_ms = 0;
  double weight_bytes = 0;
  double read_gbps = 0;
  double kv_bytes_per_token = 0;
};

absl::StatusOr<EngineFit> FitEngine(const std::string& path, int context) {
  DUET_ASSIGN_OR_RETURN(json j, ReadJson(path));
  if (!j.contains("rows") || !j.contains("read_bandwidth_gbps") || !j.contains("kv_capacity") ||
      j["kv_capacity"].empty() || !j.contains("weight_bytes")) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ": not an engine_bench --json (rows, read_bandwidth_gbps, "
                     "kv_capacity, weight_bytes)"));
  }
  if (j["rows"].empty() || j["kv_capacity"].size() != 1 || j["weight_bytes"].size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": needs one GEMM, KV dtype and weights dtype (one engine)"));
  }
  EngineFit fit;
  std::vector<double> px, py, dx, dy;
  try {
    const json& first = j["rows"][0];
    for (const json& row : j["rows"]) {
      for (const char* key : {"gemm", "kv_dtype", "weights_dtype", "cpu_isa"}) {
        if (row.value(key, "") != first.value(key, "")) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": rows differ in ", key, "; fit one engine variant per file"));
        }
      }
      const std::string phase = row.value("phase", "");
      if (phase == "prefill") {
        px.push_back(row.at("size").get<double>());
        py.push_back(row.at("ms").get<double>());
      } else if (phase == "decode") {
        dx.push_back(row.at("size").get<double>());
        dy.push_back(row.at("ms").get<double>());
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": row phase '", phase, "' is neither prefill nor decode"));
      }
    }
    fit.read_gbps = j["read_bandwidth_gbps"].get<double>();
    fit.weight_bytes = j["weight_bytes"].begin()->get<double>();
    fit.kv_bytes_per_token = j["kv_capacity"][0].at("bytes_per_token").get<double>();
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  if (!(fit.read_gbps > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": read_bandwidth_gbps must be > 0"));
  }
  absl::StatusOr<Line> prefill_fit = FitLine(px, py);
  if (!prefill_fit.ok()) return Annotate(prefill_fit.status(), path + ": prefill rows");
  absl::StatusOr<Line> decode_fit = FitLine(dx, dy);
  if (!decode_fit.ok()) return Annotate(decode_fit.status(), path + ": decode rows");
  const Line& prefill = *prefill_fit;
  const Line& decode = *decode_fit;
  fit.costs.prefill = {.fixed_ms = prefill.intercept, .per_token_ms = prefill.slope};
  fit.costs.decode.per_context_token_ms = fit.kv_bytes_per_token / (fit.read_gbps * 1e9) * 1e3;
  fit.costs.decode.fixed_ms = decode.intercept;
  // Each decode row's sequence holds `context` cached tokens (+1 being written).
  fit.costs.decode.per_seq_ms =
      decode.slope - (context + 1) * fit.costs.decode.per_context_token_ms;
  fit.prefill_residual_ms = prefill.max_abs_residual;
  fit.decode_residual_ms = decode.max_abs_residual;
  if (prefill.slope <= 0 || prefill.intercept < 0 || decode.intercept <= 0 ||
      fit.costs.decode.per_seq_ms < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the fit is not physical (prefill %.2f + %.3f/token ms, decode %.2f + %.3f/seq ms): "
        "rerun engine_bench on a quieter machine",
        path, prefill.intercept, prefill.slope, decode.intercept, fit.costs.decode.per_seq_ms));
  }
  return fit;
}

// One measured run of the sweep.
struct MeasuredRun {
  std::string setup;
  double rate = 0;
  WorkloadSpec workload;
  Slo slo;
  double target = 0.9;
  double attainment = 0;
  double tpot_mean_ms = 0;
  double ttft_mean_ms = 0;
  bool meets = false;
};

absl::StatusOr<std::vector<MeasuredRun>> ReadSweep(const std::string& dir) {
  std::vector<MeasuredRun> runs;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t at = name.find("-rate");
    if (at == std::string::npos || entry.path().extension() != ".json") continue;
    DUET_ASSIGN_OR_RETURN(json j, ReadJson(entry.path().string()));
    MeasuredRun r;
    r.setup = name.substr(0, at);
    if (r.setup != "colocated" && r.setup != "disagg") {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": setup '", r.setup, "' is neither colocated nor disagg"));
    }
    try {
      const json& config = j.at("config");
      const json& all = j.at("classes").at("all");
      const json& g = all.at("goodput");
      if (config.at("workload").get<std::string>() != "random" ||
          config.at("background_concurrency").get<int>() != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": only the random workload without background load is modelled"));
      }
      r.rate = config.at("request_rate").get<double>();
      r.workload.rate_per_s = r.rate;
      r.workload.duration_s = config.at("duration_s").get<double>();
      DUET_ASSIGN_OR_RETURN(r.workload.input,
                            ParseRange("input_len", config.at("input_len").get<std::string>()));
      DUET_ASSIGN_OR_RETURN(r.workload.output,
                            ParseRange("output_len", config.at("output_len").get<std::string>()));
      r.slo = {.ttft_ms = g.at("slo_ttft_ms").get<double>(),
               .tpot_ms = g.at("slo_tpot_ms").get<double>()};
      if (g.at("slo_e2e_ms").get<double>() != 0) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": an e2e SLO is not modelled"));
      }
      r.target = g.at("attainment_target").get<double>();
      r.attainment = g.at("slo_attainment").get<double>();
      r.meets = g.at("meets_target").get<bool>();
      r.tpot_mean_ms = all.at("latency_ms").at("tpot").at("mean").get<double>();
      r.ttft_mean_ms = all.at("latency_ms").at("ttft").at("mean").get<double>();
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": missing field: ", e.what()));
    }
    runs.push_back(r);
  }
  if (ec) return absl::NotFoundError(absl::StrCat("reading ", dir, ": ", ec.message()));
  if (runs.empty()) return absl::NotFoundError(absl::StrCat(dir, ": no SETUP-rateR.json"));
  std::sort(runs.begin(), runs.end(), [](const MeasuredRun& a, const MeasuredRun& b) {
    return a.setup != b.setup ? a.setup < b.setup : a.rate < b.rate;
  });
  return runs;
}

struct SimStats {
  double attainment = 0;
  double tpot_mean_ms = 0;
  double ttft_mean_ms = 0;
};

// The run's workload simulated with `seeds` seeds; means over all.
absl::StatusOr<SimStats> SimulateRun(const Simulator& sim, const MeasuredRun& run, int seeds) {
  SimStats s;
  double n = 0;
  for (int seed = 1; seed <= seeds; ++seed) {
    WorkloadSpec w = run.workload;
    w.seed = seed;
    DUET_ASSIGN_OR_RETURN(std::vector<Request> reqs, MakePoissonWorkload(w));
    DUET_ASSIGN_OR_RETURN(std::vector<Outcome> out, sim(reqs));
    s.attainment += Judge(out, run.slo).both * reqs.size();
    for (const Outcome& o : out) {
      s.tpot_mean_ms += o.tpot_ms;
      s.ttft_mean_ms += o.ttft_ms;
    }
    n += out.size();
  }
  if (n == 0) return absl::InvalidArgumentError("the simulated runs had no requests");
  s.attainment /= n;
  s.tpot_mean_ms /= n;
  s.ttft_mean_ms /= n;
  return s;
}

// The measured setups, as simulated: the disaggregated one's units are `node`.
struct Setups {
  ColocatedSpec colocated;
  DisaggSpec disagg;
};

Simulator MeasuredSimulator(const std::string& setup, const Setups& s) {
  if (setup == "colocated") {
    return
        [spec = s.colocated](const std::vector<Request>& r) { return SimulateColocated(spec, r); };
  }
  return [spec = s.disagg](const std::vector<Request>& r) { return SimulateDisagg(spec, r); };
}

double& FirstTokenLatencyOf(const std::string& setup, Setups& s) {
  return setup == "colocated" ? s.colocated.first_token_latency_ms
                              : s.disagg.first_token_latency_ms;
}

void SetCosts(const std::string& setup, const UnitCosts& c, Setups& s) {
  if (setup == "colocated") {
    s.colocated.costs = c;
  } else {
    s.disagg.prefill_costs = s.disagg.decode_costs = c;
  }
}

// The serving overheads at which the simulated means match the measured ones at the two lowest
// rates: step_overhead_ms the TPOT at `low`, and with it seq_overhead_ms the TPOT at `high` (the
// larger batches of the higher rate tell the per-sequence part from the per-step part); then the
// first-token latency the rest of the TTFT at `low`. An overhead the engine alone already
// exceeds is 0.
absl::StatusOr<Setups> Calibrate(const std::string& setup, Setups s, const MeasuredRun& low,
                                 const MeasuredRun& high, int seeds) {
  auto stats_of = [&](const UnitCosts& c, const MeasuredRun& run) -> absl::StatusOr<SimStats> {
    Setups t = s;
    SetCosts(setup, c, t);
    return SimulateRun(MeasuredSimulator(setup, t), run, seeds);
  };
  // step_overhead_ms by bisection over [0, the measured TPOT] (the TPOT rises with it).
  auto fit_step_for = [&](UnitCosts c, double seq) -> absl::StatusOr<UnitCosts> {
    c.seq_overhead_ms = seq;
    c.step_overhead_ms = 0;
    DUET_ASSIGN_OR_RETURN(SimStats at_zero, stats_of(c, low));
    if (at_zero.tpot_mean_ms >= low.tpot_mean_ms) return c;
    double lo = 0, hi = low.tpot_mean_ms;
    for (int i = 0; i < 30; ++i) {
      c.step_overhead_ms = 0.5 * (lo + hi);
      DUET_ASSIGN_OR_RETURN(SimStats st, stats_of(c, low));
      (st.tpot_mean_ms < low.tpot_mean_ms ? lo : hi) = c.step_overhead_ms;
    }
    c.step_overhead_ms = 0.5 * (lo + hi);
    return c;
  };
  DUET_ASSIGN_OR_RETURN(
      UnitCosts costs,
      fit_step_for(setup == "colocated" ? s.colocated.costs : s.disagg.prefill_costs, 0));
  DUET_ASSIGN_OR_RETURN(SimStats high_at_zero, stats_of(costs, high));
  if (high_at_zero.tpot_mean_ms < high.tpot_mean_ms) {
    double lo = 0, hi = high.tpot_mean_ms / 4;
    for (int i = 0; i < 30; ++i) {
      const double mid = 0.5 * (lo + hi);
      DUET_ASSIGN_OR_RETURN(costs, fit_step_for(costs, mid));
      DUET_ASSIGN_OR_RETURN(SimStats st, stats_of(costs, high));
      (st.tpot_mean_ms < high.tpot_mean_ms ? lo : hi) = mid;
    }
  }
  SetCosts(setup, costs, s);
  double& latency = FirstTokenLatencyOf(setup, s);
  latency = 0;
  DUET_ASSIGN_OR_RETURN(SimStats st, SimulateRun(MeasuredSimulator(setup, s), low, seeds));
  latency = std::max(0.0, low.ttft_mean_ms - st.ttft_mean_ms);
  return s;
}

std::string Pct(double x) { return absl::StrFormat("%.1f", 100 * x); }

std::string Name(const Placement& p) {
  return p.prefill_units == 0 ? "colocated"
                              : absl::StrCat(p.prefill_units, "P", p.decode_units, "D");
}

absl::Status Run() {
  std::ostringstream md;
  const int context = absl::GetFlag(FLAGS_engine_context);
  if (context < 0) return absl::InvalidArgumentError("--engine_context must be >= 0");
  if (absl::GetFlag(FLAGS_engine_json_node).empty() ||
      absl::GetFlag(FLAGS_engine_json_colocated).empty()) {
    return absl::InvalidArgumentError("--engine_json_node and --engine_json_colocated are needed");
  }
  DUET_ASSIGN_OR_RETURN(EngineFit node, FitEngine(absl::GetFlag(FLAGS_engine_json_node), context));
  DUET_ASSIGN_OR_RETURN(EngineFit coloc,
                        FitEngine(absl::GetFlag(FLAGS_engine_json_colocated), context));
  if (!(absl::GetFlag(FLAGS_transfer_gbps) > 0)) {
    return absl::InvalidArgumentError("--transfer_gbps must be > 0");
  }
  Setups setups;
  setups.colocated.costs = coloc.costs;
  setups.disagg.prefill_costs = setups.disagg.decode_costs = node.costs;
  setups.disagg.transfer.bytes_per_s = absl::GetFlag(FLAGS_transfer_gbps) * 1e9;
  setups.disagg.transfer.kv_bytes_per_token = node.kv_bytes_per_token;
  const int seeds = absl::GetFlag(FLAGS_validation_seeds);
  if (seeds < 1) return absl::InvalidArgumentError("--validation_seeds must be >= 1");

  std::vector<MeasuredRun> runs;
  std::map<std::string, std::pair<double, double>> calibration_rates;
  if (!absl::GetFlag(FLAGS_raw_dir).empty()) {
    DUET_ASSIGN_OR_RETURN(runs, ReadSweep(absl::GetFlag(FLAGS_raw_dir)));
    for (const std::string setup : {"colocated", "disagg"}) {
      std::vector<const MeasuredRun*> of_setup;
      for (const MeasuredRun& r : runs) {
        if (r.setup == setup) of_setup.push_back(&r);
      }
      if (of_setup.size() < 2) {
        return absl::NotFoundError(absl::StrCat("calibration needs two ", setup,
                                                " rates in --raw_dir, found ", of_setup.size()));
      }
      DUET_ASSIGN_OR_RETURN(setups, Calibrate(setup, setups, *of_setup[0], *of_setup[1], seeds));
      calibration_rates[setup] = {of_setup[0]->rate, of_setup[1]->rate};
    }
  }

  md << "## Cost models\n\n"
     << "| unit | prefill pass (ms) | decode step (ms) | serving overhead (ms): per pass, per "
        "decoding sequence; first-token latency | max residual prefill / decode (ms) "
        "|\n|---|---|---|---|---|\n";
  for (const auto& [name, fit, costs, latency] :
       {std::tuple{"node (1 thread)", &node, &setups.disagg.prefill_costs,
                   setups.disagg.first_token_latency_ms},
        std::tuple{"colocated (2 threads)", &coloc, &setups.colocated.costs,
                   setups.colocated.first_token_latency_ms}}) {
    md << absl::StrFormat(
        "| %s | %.1f + %.3f x tokens | %.1f + %.3f x batch + %.5f x cached tokens | %.2f, %.3f; "
        "%.1f | %.1f / %.1f |\n",
        name, costs->prefill.fixed_ms, costs->prefill.per_token_ms, costs->decode.fixed_ms,
        costs->decode.per_seq_ms, costs->decode.per_context_token_ms, costs->step_overhead_ms,
        costs->seq_overhead_ms, latency, fit->prefill_residual_ms, fit->decode_residual_ms);
  }
  // This machine's unit: arithmetic rate from the prefill slope (2 FLOP per weight per token,
  // f32 weights: 4 bytes each), bandwidth from the decode step's fixed part (the weights read).
  const double params = node.weight_bytes / 4;
  const double flops = 2 * params / (node.costs.prefill.per_token_ms * 1e-3);
  const double bytes_per_s = node.weight_bytes / (node.costs.decode.fixed_ms * 1e-3);
  md << absl::StrFormat(
      "\nOne node unit: %.0f GFLOP/s (2 x %.0fM weights / prefill ms per token), %.1f GB/s "
      "(weight bytes / decode step's fixed ms; the read probe: %.1f GB/s): %.1f FLOP/byte; "
      "reading the weights once costs as much as %.1f tokens of arithmetic (f32 weights).\n",
      flops / 1e9, params / 1e6, bytes_per_s / 1e9, node.read_gbps, flops / bytes_per_s,
      node.costs.decode.fixed_ms / node.costs.prefill.per_token_ms);

  if (!runs.empty()) {
    md << "\n## Check against the measured sweep\n\n"
       << "Simulated: each rate's workload and SLOs as measured, " << seeds
       << " seeds each (means); (c): a rate the serving overheads were calibrated on.\n\n"
       << "| setup | rate (req/s) | attainment measured / simulated (%) | TTFT mean measured / "
          "simulated (ms) | TPOT mean measured / simulated (ms) |\n|---|---|---|---|---|\n";
    std::map<std::string, std::pair<double, double>> grid_goodput;  // measured, simulated
    double abs_err = 0, held_out_err = 0;
    int n = 0, held_out = 0;
    for (const MeasuredRun& run : runs) {
      DUET_ASSIGN_OR_RETURN(SimStats s,
                            SimulateRun(MeasuredSimulator(run.setup, setups), run, seeds));
      const auto& calibrated = calibration_rates[run.setup];
      const bool calibration = run.rate == calibrated.first || run.rate == calibrated.second;
      md << absl::StrFormat("| %s | %g%s | %s / %s | %.0f / %.0f | %.1f / %.1f |\n", run.setup,
                            run.rate, calibration ? " (c)" : "", Pct(run.attainment),
                            Pct(s.attainment), run.ttft_mean_ms, s.ttft_mean_ms, run.tpot_mean_ms,
                            s.tpot_mean_ms);
      const double err = std::fabs(run.attainment - s.attainment);
      abs_err += err;
      ++n;
      if (!calibration) {
        held_out_err += err;
        ++held_out;
      }
      auto& [measured, simulated] = grid_goodput[run.setup];
      // Goodput on the grid: the highest rate meeting the target (as bench_goodput.sh reports).
      if (run.meets) measured = std::max(measured, run.rate);
      if (s.attainment >= run.target) simulated = std::max(simulated, run.rate);
    }
    md << absl::StrFormat(
        "\nMean absolute error of the attainment: %.1f points over all %d runs, %.1f over the %d "
        "not calibrated on.\n",
        100 * abs_err / n, n, held_out > 0 ? 100 * held_out_err / held_out : 0.0, held_out);
    for (const auto& [setup, g] : grid_goodput) {
      const MeasuredRun& any = *std::find_if(
          runs.begin(), runs.end(), [&](const MeasuredRun& r) { return r.setup == setup; });
      GoodputSearch search{
          .workload = any.workload, .slo = any.slo, .attainment_target = any.target};
      search.workload.duration_s = absl::GetFlag(FLAGS_sim_duration_s);
      search.workload.seed = absl::GetFlag(FLAGS_seed);
      DUET_ASSIGN_OR_RETURN(double fine, FindGoodput(MeasuredSimulator(setup, setups), search));
      md << absl::StrFormat(
          "%s goodput on the measured rates: measured %g, simulated %g req/s; simulated without "
          "the grid (%g s of arrivals): %.2f req/s.\n",
          setup, g.first, g.second, search.workload.duration_s, fine);
    }
  }

  DUET_ASSIGN_OR_RETURN(std::vector<int> unit_counts,
                        ParseList<int>("units", absl::GetFlag(FLAGS_units)));
  DUET_ASSIGN_OR_RETURN(std::vector<double> ratios,
                        ParseList<double>("compute_ratios", absl::GetFlag(FLAGS_compute_ratios)));
  GoodputSearch search{.slo = {.ttft_ms = absl::GetFlag(FLAGS_slo_ttft_ms),
                               .tpot_ms = absl::GetFlag(FLAGS_slo_tpot_ms)},
                       .attainment_target = absl::GetFlag(FLAGS_slo_attainment)};
  search.workload.duration_s = absl::GetFlag(FLAGS_sim_duration_s);
  search.workload.seed = absl::GetFlag(FLAGS_seed);
  DUET_ASSIGN_OR_RETURN(search.workload.input,
                        ParseRange("input_len", absl::GetFlag(FLAGS_input_len)));
  DUET_ASSIGN_OR_RETURN(search.workload.output,
                        ParseRange("output_len", absl::GetFlag(FLAGS_output_len)));
  md << absl::StrFormat(
      "\n## Placements\n\nWorkload: Poisson, prompts %s, outputs %s tokens; SLO TTFT <= %g ms, "
      "TPOT <= %g ms for >= %g %% of requests. Units are node units (this machine's core at "
      "compute ratio 1); colocated on N units is N one-unit engines. Goodput per unit in req/s.\n\n"
      "| compute ratio | units | colocated per unit | best xPyD | its per unit | best / colocated "
      "| every split (per unit) |\n|---|---|---|---|---|---|---|\n",
      absl::GetFlag(FLAGS_input_len), absl::GetFlag(FLAGS_output_len), search.slo.ttft_ms,
      search.slo.tpot_ms, 100 * search.attainment_target);
  for (double ratio : ratios) {
    DUET_ASSIGN_OR_RETURN(UnitCosts unit,
                          ScaleTo(setups.disagg.prefill_costs, {.compute = ratio, .bandwidth = 1}));
    ColocatedSpec colocated = setups.colocated;
    colocated.costs = unit;
    DisaggSpec disagg = setups.disagg;
    disagg.prefill_costs = disagg.decode_costs = unit;
    for (int units : unit_counts) {
      DUET_ASSIGN_OR_RETURN(std::vector<Placement> placements,
                            SearchPlacements(units, colocated, disagg, search));
      const Placement& colocated = placements[0];
      const Placement* best = &placements[1];
      std::vector<std::string> all;
      for (size_t i = 1; i < placements.size(); ++i) {
        if (placements[i].goodput > best->goodput) best = &placements[i];
        all.push_back(
            absl::StrFormat("%s %.2f", Name(placements[i]), placements[i].goodput / units));
      }
      md << absl::StrFormat(
          "| %g | %d | %.2f | %s | %.2f | %s | %s |\n", ratio, units, colocated.goodput / units,
          best->goodput > 0 ? Name(*best) : "none", best->goodput / units,
          colocated.goodput > 0 ? absl::StrFormat("%.2fx", best->goodput / colocated.goodput)
                                : "n/a",
          absl::StrJoin(all, ", "));
    }
  }
  const std::string text = md.str();
  std::fputs(text.c_str(), stdout);
  if (!absl::GetFlag(FLAGS_out).empty()) {
    std::ofstream out(absl::GetFlag(FLAGS_out));
    out << text;
    if (!out) return absl::InternalError(absl::StrCat("writing ", absl::GetFlag(FLAGS_out)));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace duet::goodput_sim

int main(int argc, char** argv) {
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr, "goodput_sim: unexpected argument %s\n", rest[1]);
    return 2;
  }
  absl::Status status = duet::goodput_sim::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "goodput_sim: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
