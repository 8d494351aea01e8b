#include "tests/integration/http_exchange.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"

namespace duet::testing {

Reply ExchangeRaw(int port, const std::string& request) {
  Reply r;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return r;
  }
  (void)!write(fd, request.data(), request.size());
  std::string all;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) all.append(buf, n);
  close(fd);
  const size_t end = all.find("\r\n\r\n");
  if (end == std::string::npos) return r;
  r.head = all.substr(0, end);
  std::string raw = all.substr(end + 4);
  sscanf(r.head.c_str(), "HTTP/1.%*d %d", &r.status);
  if (r.head.find("Transfer-Encoding: chunked") != std::string::npos) {
    size_t pos = 0;
    while (pos < raw.size()) {
      const size_t eol = raw.find("\r\n", pos);
      if (eol == std::string::npos) break;
      const size_t len = std::stoul(raw.substr(pos, eol - pos), nullptr, 16);
      if (len == 0) break;
      r.body += raw.substr(eol + 2, len);
      pos = eol + 2 + len + 2;
    }
  } else {
    r.body = raw;
  }
  return r;
}

Reply Exchange(int port, const std::string& method, const std::string& path,
               const std::string& body, const std::string& extra_headers) {
  return ExchangeRaw(
      port, absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: x\r\n",
                         "Connection: close\r\nContent-Type: application/json\r\n", extra_headers,
                         "Content-Length: ", body.size(), "\r\n\r\n", body));
}

}  // namespace duet::testing
