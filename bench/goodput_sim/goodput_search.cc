#include "bench/goodput_sim/goodput_search.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace duet::goodput_sim {

absl::StatusOr<Attainment> AttainmentAt(const Simulator& simulate, const GoodputSearch& search,
                                        double rate_per_s) {
  WorkloadSpec w = search.workload;
  w.rate_per_s = rate_per_s;
  DUET_ASSIGN_OR_RETURN(std::vector<Request> requests, MakePoissonWorkload(w));
  DUET_ASSIGN_OR_RETURN(std::vector<Outcome> outcomes, simulate(requests));
  return Judge(outcomes, search.slo);
}

absl::StatusOr<double> FindGoodput(const Simulator& simulate, const GoodputSearch& search) {
  if (!(search.relative_resolution > 0) || !(search.max_rate_per_s > 1e-3)) {
    return absl::InvalidArgumentError(
        absl::StrCat("goodput search needs relative_resolution > 0 and max_rate_per_s > 1e-3, got ",
                     search.relative_resolution, ", ", search.max_rate_per_s));
  }
  auto meets = [&](double rate) -> absl::StatusOr<bool> {
    DUET_ASSIGN_OR_RETURN(Attainment a, AttainmentAt(simulate, search, rate));
    return a.both >= search.attainment_target;
  };
  double pass = 0, fail = 0;
  DUET_ASSIGN_OR_RETURN(bool ok, meets(1.0));
  if (ok) {
    pass = 1.0;
    for (double r = 2.0;; r *= 2) {
      if (r > search.max_rate_per_s) {
        return absl::OutOfRangeError(
            absl::StrCat("attainment still meets the target at ", search.max_rate_per_s, " req/s"));
      }
      DUET_ASSIGN_OR_RETURN(ok, meets(r));
      if (!ok) {
        fail = r;
        break;
      }
      pass = r;
    }
  } else {
    fail = 1.0;
    // Below about 50 requests in the simulated time an attainment means little.
    const double floor = 50 / search.workload.duration_s;
    for (double r = 0.5;; r /= 2) {
      if (r < floor) return 0.0;
      DUET_ASSIGN_OR_RETURN(ok, meets(r));
      if (ok) {
        pass = r;
        break;
      }
      fail = r;
    }
  }
  while ((fail - pass) / pass > search.relative_resolution) {
    const double mid = 0.5 * (pass + fail);
    DUET_ASSIGN_OR_RETURN(ok, meets(mid));
    (ok ? pass : fail) = mid;
  }
  return pass;
}

absl::StatusOr<std::vector<Placement>> SearchPlacements(int units, ColocatedSpec colocated,
                                                        DisaggSpec disagg,
                                                        const GoodputSearch& search) {
  if (units < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement search needs >= 2 units, got ", units));
  }
  std::vector<Placement> out;
  colocated.units = units;
  Placement c;
  DUET_ASSIGN_OR_RETURN(
      c.goodput,
      FindGoodput([&](const std::vector<Request>& r) { return SimulateColocated(colocated, r); },
                  search));
  out.push_back(c);
  for (int x = 1; x < units; ++x) {
    disagg.prefill_units = x;
    disagg.decode_units = units - x;
    Placement p{.prefill_units = x, .decode_units = units - x};
    DUET_ASSIGN_OR_RETURN(
        p.goodput,
        FindGoodput([&](const std::vector<Request>& r) { return SimulateDisagg(disagg, r); },
                    search));
    out.push_back(p);
  }
  return out;
}

}  // namespace duet::goodput_sim
