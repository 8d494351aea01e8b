// Goodput (DistServe's measure) of a simulated placement: the highest Poisson request rate at
// which a target share of the requests meets both the TTFT and the TPOT target; and the
// placement search over every xPyD split of N units against N colocated units.
//
//   GoodputSearch g{.workload = {.duration_s = 600, .input = {32, 64}, .output = {32, 32}},
//                   .slo = {.ttft_ms = 300, .tpot_ms = 100}};
//   DUET_ASSIGN_OR_RETURN(double rate, FindGoodput(
//       [&](const auto& reqs) { return SimulateColocated({.costs = c}, reqs); }, g));
//   DUET_ASSIGN_OR_RETURN(auto splits, SearchPlacements(4, {.costs = c},
//       {.prefill_costs = c, .decode_costs = c, .transfer = t}, g));
#pragma once

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/goodput_sim/cost_model.h"
#include "bench/goodput_sim/simulator.h"

namespace duet::goodput_sim {

using Simulator =
    std::function<absl::StatusOr<std::vector<Outcome>>(const std::vector<Request>& requests)>;

struct GoodputSearch {
  WorkloadSpec workload;  // its rate_per_s is what the search varies
  Slo slo;
  double attainment_target = 0.9;
  double max_rate_per_s = 1e5;         // a placement still meeting the target here is an error
  double relative_resolution = 0.005;  // bisection stops at (fail - pass) / pass below this
};

// The attainment of the workload at `rate_per_s`.
absl::StatusOr<Attainment> AttainmentAt(const Simulator& simulate, const GoodputSearch& search,
                                        double rate_per_s);

// The highest rate (within the resolution) whose attainment reaches the target; 0 when none
// does down to the rate that brings 50 requests in workload.duration_s. Assumes attainment falls
// with the rate (the same seed at every rate).
absl::StatusOr<double> FindGoodput(const Simulator& simulate, const GoodputSearch& search);

struct Placement {
  int prefill_units = 0;  // 0: colocated on all units
  int decode_units = 0;
  double goodput = 0;  // req/s of the whole placement
};

// Colocated on `units` units, then every xPyD with x + y = units, x and y >= 1: `colocated` and
// `disagg` with their unit counts set so.
absl::StatusOr<std::vector<Placement>> SearchPlacements(int units, ColocatedSpec colocated,
                                                        DisaggSpec disagg,
                                                        const GoodputSearch& search);

}  // namespace duet::goodput_sim
