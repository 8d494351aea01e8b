#include "common/metrics/http_exporter.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"

namespace duet::metrics {

absl::StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(const Registry* registry,
                                                                        const std::string& host,
                                                                        int port) {
  std::unique_ptr<MetricsExporter> e(new MetricsExporter());
  e->server_ = std::make_unique<httplib::Server>();
  e->server_->new_task_queue = [] { return new httplib::ThreadPool(2); };
  e->server_->Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->Render(), kPrometheusContentType);
  });
  if (port == 0) {
    e->port_ = e->server_->bind_to_any_port(host);
  } else {
    e->port_ = e->server_->bind_to_port(host, port) ? port : -1;
  }
  if (e->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot bind ", host, ":", port));
  }
  httplib::Server* s = e->server_.get();
  e->thread_ = std::thread([s] { s->listen_after_bind(); });
  // Stop() only interrupts a server that is already listening.
  while (!s->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return e;
}

MetricsExporter::~MetricsExporter() { Stop(); }

void MetricsExporter::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace duet::metrics
