// HttpServer (the event-driven HTTP/1.1 layer under the OpenAI front) on 127.0.0.1, through raw
// sockets: pipelined requests answered in order, Expect: 100-continue, HEAD, malformed and
// oversized headers answered with errors that name their cause, chunked responses with the
// idle ping, and a responder seeing its client go away.
#include "http/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace duet::http {
namespace {

// A connected client socket, closed on destruction.
class Client {
 public:
  explicit Client(int port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Client() {
    if (fd_ >= 0) close(fd_);
  }
  bool connected() const { return connected_; }
  bool Send(const std::string& s) {
    size_t sent = 0;
    while (sent < s.size()) {
      const ssize_t n = send(fd_, s.data() + sent, s.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads until `until` appears in what arrived, the server closes, or `limit` passes.
  std::string Read(absl::Duration limit, const std::string& until = "") {
    const absl::Time end = absl::Now() + limit;
    while (absl::Now() < end && (until.empty() || in_.find(until) == std::string::npos)) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      char buf[4096];
      const ssize_t n = read(fd_, buf, sizeof(buf));
      if (n <= 0) {
        closed_ = true;
        break;
      }
      in_.append(buf, n);
    }
    return in_;
  }
  bool closed() const { return closed_; }
  void Close() {
    close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
  bool connected_ = false;
  bool closed_ = false;
  std::string in_;
};

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(HttpServerOptions o, HttpHandler handler) {
    o.host = "127.0.0.1";
    o.port = 0;
    auto s = HttpServer::Start(o, std::move(handler));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }
  // Echoes "METHOD PATH BODY".
  static void Echo(HttpRequest req, std::shared_ptr<HttpResponder> res) {
    res->Reply(200, {{"X-Test", "1"}}, "text/plain",
               absl::StrCat(req.method, " ", req.path, " ", req.body));
  }
  void TearDown() override {
    if (server_) server_->Stop();
    for (std::thread& t : threads_) t.join();
  }

  std::unique_ptr<HttpServer> server_;
  std::vector<std::thread> threads_;
};

TEST_F(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  Start({}, Echo);
  Client c(server_->port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(
      c.Send("GET /a?x=1 HTTP/1.1\r\nHost: x\r\n\r\n"
             "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"));
  const std::string in = c.Read(absl::Seconds(5));
  const size_t a = in.find("GET /a ");
  const size_t b = in.find("POST /b hi");
  ASSERT_NE(a, std::string::npos) << in;
  ASSERT_NE(b, std::string::npos) << in;
  EXPECT_LT(a, b);
  EXPECT_NE(in.find("Connection: keep-alive"), std::string::npos) << in;
  EXPECT_NE(in.find("Connection: close"), std::string::npos) << in;
  EXPECT_TRUE(c.closed());
}

TEST_F(HttpServerTest, ExpectContinueThenTheBody) {
  Start({}, Echo);
  Client c(server_->port());
  ASSERT_TRUE(
      c.Send("POST /v HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
  EXPECT_TRUE(absl::StartsWith(c.Read(absl::Seconds(5), "\r\n\r\n"), "HTTP/1.1 100 Continue"));
  ASSERT_TRUE(c.Send("hello"));
  EXPECT_NE(c.Read(absl::Seconds(5), "POST /v hello").find("POST /v hello"), std::string::npos);
}

TEST_F(HttpServerTest, HeadAnswersTheHeadAlone) {
  Start({}, Echo);
  Client c(server_->port());
  ASSERT_TRUE(c.Send("HEAD /h HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  const std::string in = c.Read(absl::Seconds(5));
  EXPECT_TRUE(absl::StartsWith(in, "HTTP/1.1 200")) << in;
  EXPECT_NE(in.find("Content-Length: 8"), std::string::npos) << in;  // "HEAD /h "
  EXPECT_TRUE(absl::EndsWith(in, "\r\n\r\n")) << in;
}

TEST_F(HttpServerTest, MalformedAndOversizedHeadersNameTheirCause) {
  Start({.max_header_bytes = 512}, Echo);
  {
    Client c(server_->port());
    ASSERT_TRUE(c.Send("GARBAGE\r\n\r\n"));
    const std::string in = c.Read(absl::Seconds(5));
    EXPECT_TRUE(absl::StartsWith(in, "HTTP/1.1 400")) << in;
    EXPECT_NE(in.find("malformed HTTP request"), std::string::npos) << in;
    EXPECT_TRUE(c.closed());
  }
  {
    Client c(server_->port());
    ASSERT_TRUE(
        c.Send(absl::StrCat("GET / HTTP/1.1\r\nX-Big: ", std::string(1000, 'a'), "\r\n\r\n")));
    const std::string in = c.Read(absl::Seconds(5));
    EXPECT_TRUE(absl::StartsWith(in, "HTTP/1.1 431")) << in;
    EXPECT_NE(in.find("limit 512 bytes"), std::string::npos) << in;
  }
}

// The client sends all of an oversized body before it reads: it still gets the 413 (the server
// drops the rest of the body before it closes, rather than resetting the connection).
TEST_F(HttpServerTest, OversizedBodySentWholeStillGetsItsAnswer) {
  Start({.max_body_bytes = 1 << 20}, Echo);
  Client c(server_->port());
  const std::string body(4 << 20, 'b');
  EXPECT_TRUE(c.Send(absl::StrCat("POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: ", body.size(),
                                  "\r\n\r\n", body)))
      << "the server reset the connection while the body was being sent";
  const std::string in = c.Read(absl::Seconds(5));
  EXPECT_TRUE(absl::StartsWith(in, "HTTP/1.1 413")) << in.substr(0, 200);
  EXPECT_NE(in.find("limit 1048576 bytes"), std::string::npos) << in.substr(0, 300);
}

TEST_F(HttpServerTest, ChunkedResponseWithIdlePing) {
  Start({.chunk_ping_interval = absl::Milliseconds(200)},
        [this](HttpRequest, std::shared_ptr<HttpResponder> res) {
          res->StartChunked(200, {}, "text/event-stream", ": ping\n\n");
          threads_.emplace_back([res] {
            absl::SleepFor(absl::Milliseconds(700));
            EXPECT_TRUE(res->WriteChunk("data: x\n\n"));
            res->EndChunked();
          });
        });
  Client c(server_->port());
  ASSERT_TRUE(c.Send("GET /s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  const std::string in = c.Read(absl::Seconds(5));
  EXPECT_NE(in.find("Transfer-Encoding: chunked"), std::string::npos) << in;
  EXPECT_NE(in.find("8\r\n: ping\n\n\r\n"), std::string::npos) << in;
  EXPECT_NE(in.find("9\r\ndata: x\n\n\r\n0\r\n\r\n"), std::string::npos) << in;
  EXPECT_TRUE(c.closed());
}

TEST_F(HttpServerTest, ResponderSeesItsClientGo) {
  std::atomic<bool> saw_gone{false};
  Start({}, [&](HttpRequest, std::shared_ptr<HttpResponder> res) {
    threads_.emplace_back([res, &saw_gone] {
      const absl::Time end = absl::Now() + absl::Seconds(5);
      while (!res->gone() && absl::Now() < end) absl::SleepFor(absl::Milliseconds(5));
      saw_gone = res->gone();
      res->Reply(200, {}, "text/plain", "late");  // dropped
    });
  });
  {
    Client c(server_->port());
    ASSERT_TRUE(c.Send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"));
    absl::SleepFor(absl::Milliseconds(100));
  }  // closed
  const absl::Time end = absl::Now() + absl::Seconds(5);
  while (!saw_gone.load() && absl::Now() < end) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(saw_gone.load());
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  const absl::Time closed = absl::Now() + absl::Seconds(5);
  while (server_->connections() > 0 && absl::Now() < closed) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(server_->connections(), 0);
}

// A client that never reads: a streamed response is cut off once max_pending_bytes are queued,
// a whole one once the socket has taken none of it for write_timeout.
TEST_F(HttpServerTest, ClientThatDoesNotReadIsCutOff) {
  std::atomic<bool> refused{false};
  Start({.write_timeout = absl::Milliseconds(500), .max_pending_bytes = 1 << 20},
        [&](HttpRequest req, std::shared_ptr<HttpResponder> res) {
          if (req.path == "/whole") {
            return res->Reply(200, {}, "text/plain", std::string(64 << 20, 'w'));
          }
          res->StartChunked(200, {}, "text/plain", "");
          threads_.emplace_back([res, &refused] {
            const std::string chunk(64 << 10, 's');
            const absl::Time end = absl::Now() + absl::Seconds(10);
            while (absl::Now() < end && res->WriteChunk(chunk))
              absl::SleepFor(absl::Milliseconds(1));
            refused = res->gone();
          });
        });
  Client streamed(server_->port());
  ASSERT_TRUE(streamed.Send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"));
  Client whole(server_->port());
  ASSERT_TRUE(whole.Send("GET /whole HTTP/1.1\r\nHost: x\r\n\r\n"));
  const absl::Time end = absl::Now() + absl::Seconds(8);
  while ((server_->connections() > 0 || !refused.load()) && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(refused.load()) << "the stream was never refused";
  EXPECT_EQ(server_->connections(), 0) << "a connection that does not read is still open";
}

}  // namespace
}  // namespace duet::http
