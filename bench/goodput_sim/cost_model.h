// Per-phase cost models of one compute unit, the inputs of the goodput simulator
// (simulator.h): how long a prefill pass, a decode step, a mixed (colocated) step and a KV
// transfer take. Each is linear in what it processes, as measured by bench/engine_bench and
// fitted by FitLine. Every cost splits into a memory-bound part (weights and K/V read from
// memory) and a compute-bound part (per-token arithmetic), so that ScaleTo can model another
// machine by a compute and a bandwidth factor applied separately.
//
//   UnitCosts c{.prefill = {.fixed_ms = 30, .per_token_ms = 1.2},
//               .decode = {.fixed_ms = 32, .per_seq_ms = 1.5, .per_context_token_ms = 0.003}};
//   double ms = StepMs(c, /*prefill_tokens=*/48, /*decodes=*/3, /*context_tokens=*/210);
//   UnitCosts h = ScaleTo(c, {.compute = 16, .bandwidth = 1});
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace duet::goodput_sim {

// One prefill pass over `tokens` prompt tokens: fixed_ms (reading the weights once: memory)
// + per_token_ms * tokens (the arithmetic: compute).
struct PrefillCost {
  double fixed_ms = 0;
  double per_token_ms = 0;
};

// One decode step over `batch` sequences holding `context_tokens` cached tokens in all:
// fixed_ms (the weights: memory) + per_seq_ms * batch (each row's arithmetic: compute)
// + per_context_token_ms * context_tokens (reading the K/V: memory).
struct DecodeCost {
  double fixed_ms = 0;
  double per_seq_ms = 0;
  double per_context_token_ms = 0;
};

// Moving a prompt's K/V to a decode unit: fixed_ms + bytes / bytes_per_s, where bytes is
// kv_bytes_per_token times the prompt rounded up to whole blocks of block_tokens.
struct TransferCost {
  double fixed_ms = 0;
  double bytes_per_s = 1e12;
  double kv_bytes_per_token = 0;
  int block_tokens = 16;
};

// What one unit (a core here, an accelerator elsewhere) costs per pass. The overheads are the
// serving work that engine_bench does not see, calibrated from lightly loaded serving runs:
// step_overhead_ms around every pass (scheduling), seq_overhead_ms for every decoding sequence
// of a step (its token sampled, streamed and relayed).
struct UnitCosts {
  PrefillCost prefill;
  DecodeCost decode;
  double step_overhead_ms = 0;
  double seq_overhead_ms = 0;
};

// Speed of another machine's unit relative to the one the costs were measured on.
struct MachineScale {
  double compute = 1;    // arithmetic throughput
  double bandwidth = 1;  // memory read bandwidth
};

double PrefillMs(const UnitCosts& c, int64_t tokens);
double DecodeMs(const UnitCosts& c, int batch, int64_t context_tokens);
// A pass of `prefill_tokens` prompt tokens and `decodes` decoding sequences (context_tokens
// cached among them): the weights are read once (the larger fixed part of the two phases),
// every token's arithmetic and every K/V read are paid, plus the serving overheads. A pass with
// neither costs 0.
double StepMs(const UnitCosts& c, int64_t prefill_tokens, int decodes, int64_t context_tokens);
double TransferMs(const TransferCost& t, int64_t prompt_tokens);

// The memory-bound terms divided by scale.bandwidth, the compute-bound ones by scale.compute;
// the serving overheads (host work) are kept. Fails naming a factor that is not positive.
absl::StatusOr<UnitCosts> ScaleTo(const UnitCosts& c, const MachineScale& scale);

// Least-squares line y = intercept + slope * x through at least two points with distinct x.
struct Line {
  double intercept = 0;
  double slope = 0;
  double max_abs_residual = 0;  // over the points
};
absl::StatusOr<Line> FitLine(const std::vector<double>& xs, const std::vector<double>& ys);

}  // namespace duet::goodput_sim
