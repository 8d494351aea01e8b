// What the HTTP front knows of its routes apart from serving them: the path label its request
// metrics use, which routes an API key guards, and the body of GET /health.
//
//   counter.WithLabels({PathLabel(req.path), ...});      // "other" for an unknown path
//   if (NeedsApiKey(req.path) && !authorized) reply 401;
//   res->Reply(h.ready() ? 200 : 503, ..., Dump(HealthJson(backend->Health())));
#pragma once

#include <string>

#include "duet/v1/client.pb.h"
#include "nlohmann/json.hpp"

namespace duet::http {

// The path as a metric label: one of the front's routes, else "other".
std::string PathLabel(const std::string& path);

// Whether a route needs the API key: all but those load balancers and scrapers call (/health,
// /ping, /metrics, /metrics/targets, /version).
bool NeedsApiKey(const std::string& path);

// GET /health's body: "ok", "degraded" (some (prefill, decode) pairs fenced, not routed to) or
// "not_ready", the node counts and fenced pairs, and a coordinator's discovery and the nodes on
// etcd it refused.
nlohmann::json HealthJson(const v1::HealthResponse& h);

}  // namespace duet::http
