// The `outcome` label of a request counter from the request's final status: "ok",
// "cancelled", or the status code in lower case ("resource_exhausted", "unavailable", ...).
// One spelling for every process (coordinator, prefill node, colocated server).
//
//   requests.WithLabels({metrics::OutcomeLabel(status)}).Increment();
#pragma once

#include <string>

#include "absl/status/status.h"

namespace duet::metrics {

std::string OutcomeLabel(const absl::Status& status);

}  // namespace duet::metrics
