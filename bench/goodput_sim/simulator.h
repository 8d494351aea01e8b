// A discrete-event simulation of a request stream through a colocated engine or an xPyD
// disaggregated cluster, from per-phase cost models (cost_model.h): what each request's TTFT
// and TPOT would be, and so the SLO attainment and goodput of a placement, without the machine.
//
// Colocated (as colocated/colocated_scheduler.h): each unit runs steps that hold one token of
// every running decode and then prompt chunks, oldest first, under a token budget; a prompt's
// first token comes out of the step that holds its last chunk. Disaggregated (as
// prefill_node/ and decode_node/): a prefill unit runs FCFS passes of prompt chunks under the
// budget and emits each first token; the prompt's K/V then takes TransferMs to reach the decode
// unit chosen on arrival, which admits it into its continuous batch at its next step. Requests
// go to the unit with the least outstanding work. Everything is deterministic given the
// request list.
//
//   DUET_ASSIGN_OR_RETURN(auto reqs, MakePoissonWorkload({.rate_per_s = 4, .duration_s = 60,
//       .input = {32, 64}, .output = {32, 32}, .seed = 1}));
//   DUET_ASSIGN_OR_RETURN(auto out, SimulateDisagg({.prefill_units = 1, .decode_units = 1,
//       .prefill_costs = c, .decode_costs = c, .transfer = t}, reqs));
//   Attainment a = Judge(out, {.ttft_ms = 300, .tpot_ms = 100});
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/goodput_sim/cost_model.h"

namespace duet::goodput_sim {

struct Request {
  double arrival_ms = 0;
  int prompt_tokens = 1;
  int output_tokens = 1;  // the first one included
};

struct LengthRange {
  int lo = 1;  // inclusive, drawn uniformly
  int hi = 1;
};

// Poisson arrivals at rate_per_s over duration_s. The same seed gives the same unit-rate draws
// at every rate (arrivals scale as 1 / rate), so a rate sweep varies only the rate.
struct WorkloadSpec {
  double rate_per_s = 1;
  double duration_s = 60;
  LengthRange input;
  LengthRange output;
  uint64_t seed = 1;
};
absl::StatusOr<std::vector<Request>> MakePoissonWorkload(const WorkloadSpec& spec);

// Per request, in the order given.
struct Outcome {
  double ttft_ms = 0;
  double tpot_ms = 0;  // (last token - first token) / (output tokens - 1); 0 for one token
};

struct SchedulerLimits {
  int64_t max_batch_tokens = 2048;  // tokens of one pass (decodes + prompt chunks)
  int max_running = 64;             // sequences decoding (or being prefilled, colocated) at once
};

struct ColocatedSpec {
  int units = 1;
  UnitCosts costs;
  SchedulerLimits limits;
  double first_token_latency_ms = 0;  // added to every TTFT: hops that occupy no unit
};
absl::StatusOr<std::vector<Outcome>> SimulateColocated(const ColocatedSpec& spec,
                                                       const std::vector<Request>& requests);

struct DisaggSpec {
  int prefill_units = 1;
  int decode_units = 1;
  UnitCosts prefill_costs;
  UnitCosts decode_costs;
  TransferCost transfer;
  SchedulerLimits limits;
  double first_token_latency_ms = 0;  // added to every TTFT: hops that occupy no unit
};
absl::StatusOr<std::vector<Outcome>> SimulateDisagg(const DisaggSpec& spec,
                                                    const std::vector<Request>& requests);

struct Slo {
  double ttft_ms = 0;
  double tpot_ms = 0;
};
// Shares of the requests meeting both targets, and each alone (1 when there are none).
struct Attainment {
  double both = 1;
  double ttft = 1;
  double tpot = 1;
};
Attainment Judge(const std::vector<Outcome>& outcomes, const Slo& slo);

}  // namespace duet::goodput_sim
