// MetricsExporter: serves a Registry at GET /metrics (Prometheus text format) on its own small
// HTTP server thread. Nodes start one when --metrics_port is not 0; it binds 127.0.0.1 unless
// told otherwise.
//
//   DUET_ASSIGN_OR_RETURN(auto exporter, MetricsExporter::Start(&registry, "127.0.0.1", 0));
//   int port = exporter->port();   // curl http://127.0.0.1:PORT/metrics
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics/metrics.h"

namespace httplib {
class Server;
}

namespace duet::metrics {

// The content type of the text exposition format.
inline constexpr char kPrometheusContentType[] = "text/plain; version=0.0.4; charset=utf-8";

class MetricsExporter {
 public:
  // port 0 picks a free port. The registry must outlive the exporter.
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(const Registry* registry,
                                                                const std::string& host, int port);
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  int port() const { return port_; }
  void Stop();

 private:
  MetricsExporter() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace duet::metrics
