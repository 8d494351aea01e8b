#include "tests/integration/lb_client.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace duet::testing {

std::pair<int, std::string> PostJson(int port, const std::string& path, const nlohmann::json& body,
                                     absl::Duration timeout) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(absl::ToInt64Seconds(timeout));
  httplib::Result res = client.Post(path, body.dump(), "application/json");
  if (!res) return {0, httplib::to_string(res.error())};
  return {res->status, res->body};
}

Stream PostStream(int port, const std::string& path, const std::string& body,
                  absl::Duration timeout, std::atomic<bool>* first_event) {
  Stream s;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return s;
  timeval tv{.tv_sec = 1, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return s;
  }
  const std::string req = absl::StrCat(
      "POST ", path, " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n",
      "Content-Type: application/json\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return s;
  }
  char buf[65536];
  while (absl::Now() < deadline) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      break;  // reset
    }
    const absl::Duration at = absl::Now() - start;
    const size_t before = s.all.size();
    s.all.append(buf, n);
    // Events that ended in this read (an event straddling reads counts once, where it starts).
    for (size_t pos = s.all.find("data: ", before > 5 ? before - 5 : 0); pos != std::string::npos;
         pos = s.all.find("data: ", pos + 1)) {
      s.event_times.push_back(at);
      if (first_event != nullptr) first_event->store(true);
    }
  }
  close(fd);
  s.done = absl::StrContains(s.all, "data: [DONE]");
  return s;
}

std::string ScrapeMetrics(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2);
  client.set_read_timeout(5);
  httplib::Result res = client.Get("/metrics");
  return res && res->status == 200 ? res->body : "";
}

double HttpRequests(int port, const std::string& path, int code) {
  const std::string metrics = ScrapeMetrics(port);
  if (metrics.empty()) return -1;
  double total = 0;
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (!absl::StartsWith(line, "duet_http_requests_total{") ||
        !absl::StrContains(line, absl::StrCat("path=\"", path, "\"")) ||
        !absl::StrContains(line, absl::StrCat("code=\"", code, "\""))) {
      continue;
    }
    double v = 0;
    if (!absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) return -1;
    total += v;
  }
  return total;
}

}  // namespace duet::testing
