#include "tests/integration/lb_client.h"

#include <httplib.h>
#include <signal.h>

#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace duet::testing {
namespace {

std::unique_ptr<httplib::Client> MakeClient(int port, const ClientTls* tls,
                                            absl::Duration read_timeout) {
  // OpenSSL writes to the socket with write(2): a peer that closed it (a refused handshake)
  // would kill the test with SIGPIPE instead of failing the request.
  static const bool sigpipe_ignored = [] { return signal(SIGPIPE, SIG_IGN) != SIG_ERR; }();
  (void)sigpipe_ignored;
  std::unique_ptr<httplib::Client> client;
  if (tls == nullptr) {
    client = std::make_unique<httplib::Client>(absl::StrCat("http://127.0.0.1:", port));
  } else {
    client = std::make_unique<httplib::Client>(absl::StrCat("https://127.0.0.1:", port),
                                               tls->cert_file, tls->key_file);
    client->set_ca_cert_path(tls->ca_file);
    client->enable_server_certificate_verification(true);
  }
  client->set_connection_timeout(5);
  client->set_read_timeout(std::max<int64_t>(1, absl::ToInt64Seconds(read_timeout)));
  return client;
}

}  // namespace

std::pair<int, std::string> PostJson(int port, const std::string& path, const nlohmann::json& body,
                                     const ClientTls* tls, absl::Duration timeout) {
  std::unique_ptr<httplib::Client> client = MakeClient(port, tls, timeout);
  httplib::Result res = client->Post(path, body.dump(), "application/json");
  if (!res) return {0, httplib::to_string(res.error())};
  return {res->status, res->body};
}

Stream PostStream(int port, const std::string& path, const std::string& body, const ClientTls* tls,
                  absl::Duration timeout, std::atomic<bool>* first_event) {
  Stream s;
  std::unique_ptr<httplib::Client> client = MakeClient(port, tls, timeout);
  const absl::Time start = absl::Now();
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const absl::Duration at = absl::Now() - start;
    const size_t before = s.all.size();
    s.all.append(data, n);
    // Events that ended in this read (an event straddling reads counts once, where it starts).
    for (size_t pos = s.all.find("data: ", before > 5 ? before - 5 : 0); pos != std::string::npos;
         pos = s.all.find("data: ", pos + 1)) {
      s.event_times.push_back(at);
      if (first_event != nullptr) first_event->store(true);
    }
    return absl::Now() - start < timeout;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool complete = client->send(req, res, error);
  s.status = res.status > 0 ? res.status : 0;
  if (!complete) s.all += absl::StrCat("\n[client: ", httplib::to_string(error), "]");
  s.done = complete && absl::StrContains(s.all, "data: [DONE]");
  return s;
}

std::string ScrapeMetrics(int port, const ClientTls* tls) {
  std::unique_ptr<httplib::Client> client = MakeClient(port, tls, absl::Seconds(5));
  client->set_connection_timeout(2);
  httplib::Result res = client->Get("/metrics");
  return res && res->status == 200 ? res->body : "";
}

double SumSamples(const std::string& metrics, const std::string& name,
                  const std::vector<std::string>& label_parts) {
  double total = 0;
  bool found = false;
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (!absl::ConsumePrefix(&line, name) || line.empty() || (line[0] != '{' && line[0] != ' ')) {
      continue;
    }
    const size_t space = line.rfind(' ');
    const absl::string_view labels = line.substr(0, space);
    bool all = true;
    for (const std::string& part : label_parts) all = all && absl::StrContains(labels, part);
    double v = 0;
    if (!all || !absl::SimpleAtod(line.substr(space + 1), &v)) continue;
    total += v;
    found = true;
  }
  return found ? total : -1;
}

double HttpRequests(int port, const std::string& path, int code, const ClientTls* tls) {
  const std::string metrics = ScrapeMetrics(port, tls);
  if (metrics.empty()) return -1;
  const double served =
      SumSamples(metrics, "duet_http_requests_total",
                 {absl::StrCat("path=\"", path, "\""), absl::StrCat("code=\"", code, "\"")});
  return served < 0 ? 0 : served;
}

}  // namespace duet::testing
