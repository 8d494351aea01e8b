#include "http/routes.h"

#include <utility>
#include <vector>

namespace duet::http {

std::string PathLabel(const std::string& path) {
  for (const char* p : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/ping",
                        "/metrics", "/metrics/targets", "/tokenize", "/detokenize", "/version"}) {
    if (path == p) return p;
  }
  return "other";
}

bool NeedsApiKey(const std::string& path) {
  for (const char* open : {"/health", "/ping", "/metrics", "/metrics/targets", "/version"}) {
    if (path == open) return false;
  }
  return true;
}

nlohmann::json HealthJson(const v1::HealthResponse& h) {
  using nlohmann::json;
  json j = {
      {"status", !h.ready()                  ? "not_ready"
                 : h.fenced_pairs_size() > 0 ? "degraded"
                                             : "ok"},
      {"prefill_nodes", h.prefill_nodes()},
      {"decode_nodes", h.decode_nodes()},
      {"running_requests", h.running_requests()},
      {"fenced_pairs", std::vector<std::string>(h.fenced_pairs().begin(), h.fenced_pairs().end())}};
  // A coordinator's: how it finds its nodes, and those on etcd it refused (with the reason).
  if (!h.discovery().empty()) {
    j["discovery"] = h.discovery();
    json refused = json::array();
    for (const v1::RefusedNode& r : h.refused_nodes()) {
      refused.push_back({{"node_id", r.node_id()}, {"epoch", r.epoch()}, {"reason", r.reason()}});
    }
    j["refused_nodes"] = std::move(refused);
  }
  return j;
}

}  // namespace duet::http
