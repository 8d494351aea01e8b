// HttpFront under many connections, on 127.0.0.1: 1,000 concurrent streaming clients plus 200
// slow ones (100 sending their header a byte a second, 100 sending nothing) while /health is
// probed every 5 ms and must answer within 100 ms (p99; every probe within 1 s); the slow ones are
// cut off at the header deadline and every stream gets its whole answer. Also: the connection limit
// (503 naming it), the body deadline (408 naming it) and idle keep-alive connections being closed.
// And slow-client attacks: 200 streaming clients that never read, 200 sending a request byte a
// second and 100 silent ones, while a well-behaved client's completions must succeed, the
// streams are cut at the write deadline (slots and generations freed as for a disconnect), every
// refused connection is closed by the server, and its descriptors and threads stay bounded.
//
// The backend is a test one that streams tokens on a timer: a real model cannot produce 1,000
// concurrent streams within CI time on two cores, and what is under test is the front (its
// threads and sockets), not the model. The front's own disconnect and cancel paths are covered
// over a real colocated server by colocated_serve_test.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/model/byte_tokenizer.h"
#include "http/http_front.h"
#include "nlohmann/json.hpp"

namespace duet::http {
namespace {

using nlohmann::json;

constexpr int kStreams = 1000;
constexpr int kTrickle = 100;  // a header byte a second
constexpr int kIdle = 100;     // connected, silent
constexpr int kTokens = 20;
constexpr absl::Duration kTokenGap = absl::Milliseconds(100);
constexpr absl::Duration kHeaderTimeout = absl::Seconds(3);

// Streams kTokens byte-tokens ('a', 'b', ...), one every kTokenGap, then finishes.
class TimerBackend : public GenerationBackend {
 public:
  absl::Status GenerateTo(const v1::GenerateRequest& req, const GenerateSink& sink) override {
    for (int i = 0; i < kTokens; ++i) {
      if (sink.cancelled()) return absl::CancelledError("the client went away");
      absl::SleepFor(kTokenGap);
      v1::GenerateResponse r;
      r.set_has_token(true);
      r.set_token_id('a' + i % 26);
      r.set_index(i);
      if (i + 1 == kTokens) {
        r.set_finish_reason(v1::FINISH_REASON_MAX_TOKENS);
        r.set_prompt_tokens(req.token_ids().ids_size());
      }
      if (!sink.write(r)) return absl::CancelledError("the client went away");
    }
    finished.fetch_add(1);
    return absl::OkStatus();
  }
  v1::HealthResponse Health() override {
    v1::HealthResponse h;
    h.set_ready(true);
    return h;
  }
  std::atomic<int> finished{0};
};

constexpr size_t kLongPrompt = 1000;  // a prompt longer than this makes an endless generation

// Prompts longer than kLongPrompt bytes get an endless generation (a token every 50 ms until
// cancelled, at most 2,000); shorter ones get "abcd" at once and finish.
class AttackBackend : public GenerationBackend {
 public:
  absl::Status GenerateTo(const v1::GenerateRequest& req, const GenerateSink& sink) override {
    const bool endless = static_cast<size_t>(req.token_ids().ids_size()) > kLongPrompt;
    if (endless) endless_started.fetch_add(1);
    const int tokens = endless ? 2000 : 4;
    for (int i = 0; i < tokens; ++i) {
      if (endless) absl::SleepFor(absl::Milliseconds(50));
      v1::GenerateResponse r;
      r.set_has_token(true);
      r.set_token_id('a' + i % 26);
      r.set_index(i);
      if (i + 1 == tokens) {
        r.set_finish_reason(v1::FINISH_REASON_MAX_TOKENS);
        r.set_prompt_tokens(req.token_ids().ids_size());
      }
      if (sink.cancelled() || !sink.write(r)) {
        if (endless) endless_cancelled.fetch_add(1);
        return absl::CancelledError("the client went away");
      }
    }
    return absl::OkStatus();
  }
  v1::HealthResponse Health() override {
    v1::HealthResponse h;
    h.set_ready(true);
    return h;
  }
  std::atomic<int> endless_started{0};
  std::atomic<int> endless_cancelled{0};
};

std::string ExpectedText() {
  std::string s;
  for (int i = 0; i < kTokens; ++i) s += static_cast<char>('a' + i % 26);
  return s;
}

// A blocking connect to 127.0.0.1:port, then non-blocking; -1 on failure.
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

// Owns the client sockets of a test; closes them whatever happens.
struct Sockets {
  std::vector<int> fds;
  ~Sockets() {
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
  }
};

// GET /health on a fresh connection; the time to the whole answer, or InfiniteDuration when it
// fails or takes longer than `limit`.
absl::Duration ProbeHealth(int port, absl::Duration limit) {
  const absl::Time start = absl::Now();
  const int fd = Connect(port);
  if (fd < 0) return absl::InfiniteDuration();
  static constexpr char kReq[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  std::string in;
  bool ok = write(fd, kReq, sizeof(kReq) - 1) == static_cast<ssize_t>(sizeof(kReq) - 1);
  while (ok) {
    const absl::Duration left = limit - (absl::Now() - start);
    if (left <= absl::ZeroDuration()) {
      ok = false;
      break;
    }
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) <= 0) continue;
    char buf[4096];
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      in.append(buf, n);
    } else if (n == 0) {
      break;
    } else if (errno != EAGAIN) {
      ok = false;
    }
  }
  close(fd);
  if (!ok || !absl::StartsWith(in, "HTTP/1.1 200")) return absl::InfiniteDuration();
  return absl::Now() - start;
}

// The text of a de-chunked stream of completion events, and whether it ended with [DONE].
bool StreamText(const std::string& raw, std::string* text) {
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos || !absl::StartsWith(raw, "HTTP/1.1 200")) return false;
  std::string body;
  size_t pos = head_end + 4;
  while (pos < raw.size()) {
    const size_t eol = raw.find("\r\n", pos);
    if (eol == std::string::npos) return false;
    const size_t len = std::stoul(raw.substr(pos, eol - pos), nullptr, 16);
    if (len == 0) break;
    body += raw.substr(eol + 2, len);
    pos = eol + 2 + len + 2;
  }
  bool done = false;
  pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) return false;
    const std::string data = body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    *text += json::parse(data)["choices"][0].value("text", "");
  }
  return done;
}

// Joins a test's helper thread however the test leaves (a failed ASSERT included), after
// clearing its run flag.
struct JoinOnExit {
  std::thread* t;
  std::atomic<bool>* run;  // may be null
  ~JoinOnExit() {
    if (run != nullptr) run->store(false);
    if (t->joinable()) t->join();
  }
};

class HttpFrontLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetMinLogLevel(LogLevel::kWarning);
    // Two descriptors per connection (client and server side) in this one process.
    rlimit r{};
    getrlimit(RLIMIT_NOFILE, &r);
    const rlim_t want = 8192;
    if (r.rlim_cur < want) {
      r.rlim_cur = std::min(want, r.rlim_max);
      setrlimit(RLIMIT_NOFILE, &r);
      getrlimit(RLIMIT_NOFILE, &r);
    }
    if (r.rlim_cur < 3000) GTEST_SKIP() << "RLIMIT_NOFILE is " << r.rlim_cur << "; need 3000";
    tokenizer_ = *model::ByteTokenizer::Create(320);
  }
  void StartFront(HttpFrontOptions o, GenerationBackend* backend = nullptr,
                  int64_t context_length = 64) {
    o.host = "127.0.0.1";
    o.port = 0;
    o.context_length = context_length;
    auto f =
        HttpFront::Start(o, backend != nullptr ? backend : &backend_, tokenizer_.get(), &registry_);
    ASSERT_TRUE(f.ok()) << f.status();
    front_ = *std::move(f);
  }

  TimerBackend backend_;
  AttackBackend attack_backend_;
  std::unique_ptr<model::ByteTokenizer> tokenizer_;
  metrics::Registry registry_;
  std::unique_ptr<HttpFront> front_;
};

TEST_F(HttpFrontLoadTest, ThousandStreamsAndSlowClientsWhileHealthAnswers) {
  StartFront({.max_concurrent_streams = kStreams + 10,
              .max_connections = kStreams + kTrickle + kIdle + 100,
              .header_timeout = kHeaderTimeout,
              .idle_timeout = kHeaderTimeout});
  const int port = front_->port();

  // ---- /health, every 5 ms, from start to end.
  std::atomic<bool> probing{true};
  std::vector<absl::Duration> probes;
  std::vector<absl::Time> probe_at;
  const absl::Time t0 = absl::Now();
  std::thread prober([&] {
    while (probing.load()) {
      probe_at.push_back(absl::Now());
      probes.push_back(ProbeHealth(port, absl::Seconds(1)));
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  JoinOnExit join_prober{&prober, &probing};

  // ---- 200 slow clients.
  Sockets slow;
  std::vector<absl::Time> slow_opened;
  for (int i = 0; i < kTrickle + kIdle; ++i) {
    slow.fds.push_back(Connect(port));
    ASSERT_GE(slow.fds.back(), 0) << "connect " << i;
    slow_opened.push_back(absl::Now());
  }
  std::vector<absl::Time> slow_closed(slow.fds.size(), absl::InfiniteFuture());
  std::vector<std::string> slow_in(slow.fds.size());
  std::thread trickler([&] {
    static constexpr char kHeader[] =
        "GET /health HTTP/1.1\r\nHost: x\r\nUser-Agent: a-very-slow-client\r\n\r\n";
    const absl::Time end = absl::Now() + kHeaderTimeout + absl::Seconds(10);
    size_t sent = 0;
    absl::Time next_byte = absl::Now();
    while (absl::Now() < end) {
      if (absl::Now() >= next_byte && sent < sizeof(kHeader) - 1) {
        for (int i = 0; i < kTrickle; ++i) {
          if (slow_closed[i] == absl::InfiniteFuture())
            (void)!write(slow.fds[i], &kHeader[sent], 1);
        }
        ++sent;
        next_byte += absl::Seconds(1);
      }
      std::vector<pollfd> p;
      std::vector<size_t> which;
      for (size_t i = 0; i < slow.fds.size(); ++i) {
        if (slow_closed[i] != absl::InfiniteFuture()) continue;
        p.push_back({slow.fds[i], POLLIN, 0});
        which.push_back(i);
      }
      if (p.empty()) break;
      if (poll(p.data(), p.size(), 100) <= 0) continue;
      for (size_t k = 0; k < p.size(); ++k) {
        if (p[k].revents == 0) continue;
        const size_t i = which[k];
        char buf[4096];
        const ssize_t n = read(slow.fds[i], buf, sizeof(buf));
        if (n > 0) {
          slow_in[i].append(buf, n);
        } else if (n == 0 || errno != EAGAIN) {
          slow_closed[i] = absl::Now();
        }
      }
    }
  });
  JoinOnExit join_trickler{&trickler, nullptr};

  // ---- 1,000 streaming clients.
  Sockets streams;
  const std::string body = R"({"prompt": "Hi", "stream": true, "max_tokens": 20})";
  const std::string req = absl::StrCat(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
      "Content-Type: application/json\r\nContent-Length: ",
      body.size(), "\r\n\r\n", body);
  for (int i = 0; i < kStreams; ++i) {
    streams.fds.push_back(Connect(port));
    ASSERT_GE(streams.fds.back(), 0) << "connect " << i;
    ASSERT_EQ(write(streams.fds.back(), req.data(), req.size()), static_cast<ssize_t>(req.size()));
  }
  std::vector<std::string> in(kStreams);
  int open = kStreams;
  {
    // epoll, not poll: a thousand descriptors scanned per wake-up would load the two cores the
    // server under test shares with this client.
    const int ep = epoll_create1(0);
    ASSERT_GE(ep, 0);
    struct CloseEp {
      int fd;
      ~CloseEp() { close(fd); }
    } close_ep{ep};
    for (int i = 0; i < kStreams; ++i) {
      epoll_event e{};
      e.events = EPOLLIN;
      e.data.u32 = static_cast<uint32_t>(i);
      ASSERT_EQ(epoll_ctl(ep, EPOLL_CTL_ADD, streams.fds[i], &e), 0);
    }
    const absl::Time streams_deadline = absl::Now() + absl::Seconds(60);
    epoll_event ready[256];
    while (open > 0 && absl::Now() < streams_deadline) {
      const int n = epoll_wait(ep, ready, 256, 100);
      for (int k = 0; k < n; ++k) {
        const int i = static_cast<int>(ready[k].data.u32);
        char buf[16384];
        const ssize_t got = read(streams.fds[i], buf, sizeof(buf));
        if (got > 0) {
          in[i].append(buf, got);
        } else if (got == 0 || errno != EAGAIN) {
          epoll_ctl(ep, EPOLL_CTL_DEL, streams.fds[i], nullptr);
          --open;
        }
      }
    }
  }
  const absl::Time load_over = absl::Now();
  trickler.join();
  probing.store(false);
  prober.join();

  // ---- Every stream got its whole answer.
  EXPECT_EQ(open, 0) << open << " streams still open after 60 s";
  int complete = 0;
  for (int i = 0; i < kStreams; ++i) {
    std::string text;
    if (StreamText(in[i], &text) && text == ExpectedText()) {
      ++complete;
    } else if (complete + 5 > i) {  // a few examples, not a thousand
      ADD_FAILURE() << "stream " << i << " incomplete: " << in[i].substr(0, 300);
    }
  }
  EXPECT_EQ(complete, kStreams);
  EXPECT_EQ(backend_.finished.load(), kStreams);

  // ---- The slow clients were cut off at the header deadline, the tricklers with a 408.
  for (size_t i = 0; i < slow.fds.size(); ++i) {
    const absl::Duration held = slow_closed[i] - slow_opened[i];
    EXPECT_GE(held, kHeaderTimeout - absl::Milliseconds(100)) << "slow client " << i;
    EXPECT_LE(held, kHeaderTimeout + absl::Seconds(2))
        << "slow client " << i << " held " << absl::FormatDuration(held);
    if (static_cast<int>(i) < kTrickle) {
      EXPECT_TRUE(absl::StartsWith(slow_in[i], "HTTP/1.1 408")) << slow_in[i];
      EXPECT_NE(slow_in[i].find("header_timeout"), std::string::npos) << slow_in[i];
    }
  }

  // ---- /health answered within 100 ms throughout (the figures: while the streams ran).
  ASSERT_GT(probes.size(), 20u);
  std::vector<absl::Duration> sorted;
  for (size_t i = 0; i < probes.size(); ++i) {
    if (probe_at[i] < load_over) sorted.push_back(probes[i]);
  }
  ASSERT_FALSE(sorted.empty());
  std::sort(sorted.begin(), sorted.end());
  const absl::Duration p50 = sorted[sorted.size() / 2];
  const absl::Duration p99 = sorted[sorted.size() * 99 / 100];
  const absl::Duration max = sorted.back();
  std::printf(
      "/health under %d streams + %d slow connections: %zu probes in %.1f s, p50 %.2f ms, "
      "p99 %.2f ms, max %.2f ms\n",
      kStreams, kTrickle + kIdle, sorted.size(), absl::ToDoubleSeconds(load_over - t0),
      absl::ToDoubleMilliseconds(p50), absl::ToDoubleMilliseconds(p99),
      absl::ToDoubleMilliseconds(max));
  // The bound is on the p99 and, for every probe, a second: on a shared two-core machine the
  // scheduler alone can now and then hold one probe's thread past 100 ms, while a front that
  // stalls (workers held by slow clients, a full accept queue) misses probes by seconds.
  EXPECT_LT(p99, absl::Milliseconds(100)) << "p50 " << p50 << ", max " << max;
  for (size_t i = 0; i < probes.size(); ++i) {
    EXPECT_LT(probes[i], absl::Seconds(1))
        << "/health probe at +" << absl::FormatDuration(probe_at[i] - t0);
  }
}

// Reads from fd until the peer closes or `limit` passes; what arrived.
std::string ReadAll(int fd, absl::Duration limit, bool* closed) {
  std::string in;
  const absl::Time end = absl::Now() + limit;
  *closed = false;
  while (absl::Now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      in.append(buf, n);
    } else if (n == 0 || errno != EAGAIN) {
      *closed = true;
      break;
    }
  }
  return in;
}

TEST_F(HttpFrontLoadTest, ConnectionLimitAnswers503NamingIt) {
  StartFront({.max_connections = 3, .header_timeout = absl::Seconds(5)});
  Sockets held;
  for (int i = 0; i < 3; ++i) held.fds.push_back(Connect(front_->port()));
  // The server counts a connection once it has accepted it.
  absl::SleepFor(absl::Milliseconds(200));
  const int extra = Connect(front_->port());
  held.fds.push_back(extra);
  bool closed = false;
  const std::string in = ReadAll(extra, absl::Seconds(3), &closed);
  EXPECT_TRUE(absl::StartsWith(in, "HTTP/1.1 503")) << in;
  EXPECT_NE(in.find("Retry-After: 1"), std::string::npos) << in;
  EXPECT_NE(in.find("limit of 3 open connections"), std::string::npos) << in;
  EXPECT_TRUE(closed);
  // Generation limit and connection limit are separate: closing one lets another in.
  close(held.fds[0]);
  held.fds[0] = -1;
  absl::SleepFor(absl::Milliseconds(200));
  const int again = Connect(front_->port());
  held.fds.push_back(again);
  static constexpr char kReq[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(write(again, kReq, sizeof(kReq) - 1), static_cast<ssize_t>(sizeof(kReq) - 1));
  EXPECT_TRUE(absl::StartsWith(ReadAll(again, absl::Seconds(3), &closed), "HTTP/1.1 200"));
}

TEST_F(HttpFrontLoadTest, BodyDeadlineAnswers408NamingIt) {
  StartFront({.body_timeout = absl::Milliseconds(500)});
  Sockets s;
  s.fds.push_back(Connect(front_->port()));
  static constexpr char kHead[] =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"";
  ASSERT_EQ(write(s.fds[0], kHead, sizeof(kHead) - 1), static_cast<ssize_t>(sizeof(kHead) - 1));
  const absl::Time start = absl::Now();
  bool closed = false;
  const std::string in = ReadAll(s.fds[0], absl::Seconds(5), &closed);
  EXPECT_TRUE(absl::StartsWith(in, "HTTP/1.1 408")) << in;
  EXPECT_NE(in.find("body_timeout"), std::string::npos) << in;
  EXPECT_NE(in.find("within 0.5 s"), std::string::npos) << in;
  EXPECT_TRUE(closed);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST_F(HttpFrontLoadTest, IdleKeptAliveConnectionIsClosed) {
  StartFront({.idle_timeout = absl::Milliseconds(500)});
  Sockets s;
  s.fds.push_back(Connect(front_->port()));
  static constexpr char kReq[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";  // keep-alive
  for (int i = 0; i < 2; ++i) {  // the connection serves a second request
    ASSERT_EQ(write(s.fds[0], kReq, sizeof(kReq) - 1), static_cast<ssize_t>(sizeof(kReq) - 1));
    bool closed = false;
    const std::string in = ReadAll(s.fds[0], absl::Milliseconds(300), &closed);
    EXPECT_TRUE(absl::StartsWith(in, "HTTP/1.1 200")) << in;
    EXPECT_NE(in.find("Connection: keep-alive"), std::string::npos) << in;
    EXPECT_FALSE(closed);
  }
  const absl::Time start = absl::Now();
  bool closed = false;
  ReadAll(s.fds[0], absl::Seconds(5), &closed);
  EXPECT_TRUE(closed);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// ---- Slow-client attacks.

// Entries of a /proc/self directory ("fd": open descriptors, "task": threads), not counting the
// descriptor that reads it.
int CountProcEntries(const char* dir) {
  DIR* d = opendir(absl::StrCat("/proc/self/", dir).c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return absl::string_view(dir) == "fd" ? n - 1 : n;
}

// Writes all of `s` to the non-blocking fd within `limit`.
bool SendAll(int fd, const std::string& s, absl::Duration limit) {
  const absl::Time end = absl::Now() + limit;
  size_t sent = 0;
  while (sent < s.size() && absl::Now() < end) {
    const ssize_t n = send(fd, s.data() + sent, s.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 50);
    } else {
      return false;
    }
  }
  return sent == s.size();
}

std::string Post(const std::string& body, bool keep_alive) {
  return absl::StrCat(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\n", keep_alive ? "" : "Connection: close\r\n",
      "Content-Type: application/json\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
}

// One completion on a fresh connection, read to its end within `limit`: the status (0: none).
int Complete(int port, const std::string& body, absl::Duration limit, std::string* in) {
  const int fd = Connect(port);
  if (fd < 0) return 0;
  int status = 0;
  if (SendAll(fd, Post(body, /*keep_alive=*/false), limit)) {
    bool closed = false;
    *in = ReadAll(fd, limit, &closed);
    if (closed) sscanf(in->c_str(), "HTTP/1.1 %d", &status);
  }
  close(fd);
  return status;
}

// Whether the peer has closed its socket: a byte sent to it is answered with a reset, and a
// second send fails. (Reading cannot tell: a lingering close shuts the server's side for
// writing long before it closes the socket.)
bool PeerClosed(int fd) {
  char b = ' ';
  if (send(fd, &b, 1, MSG_NOSIGNAL) < 0) return errno != EAGAIN;
  return false;
}

TEST_F(HttpFrontLoadTest, RefusalsCloseTheConnectionWhileTheClientKeepsSending) {
  AttackBackend& backend = attack_backend_;
  StartFront({.max_concurrent_streams = 1, .write_timeout = absl::Seconds(2)}, &backend,
             /*context_length=*/1 << 20);
  const int port = front_->port();
  Sockets s;
  struct Case {
    std::string body;
    std::string status;
    std::string code;
  };
  // A malformed request while the slot is free; then, once one endless generation holds the
  // only slot (not streamed: nothing is written to its client until it ends, so no write
  // deadline cuts it), a request beyond the limit.
  for (const Case& c : {Case{R"({"prompt": )", "HTTP/1.1 400", "invalid_json"},
                        Case{R"({"prompt": "Hi"})", "HTTP/1.1 429", "too_many_requests"}}) {
    if (c.code == "too_many_requests") {
      s.fds.push_back(Connect(port));
      const std::string hold = absl::StrCat(R"({"prompt": ")", std::string(2 * kLongPrompt, 'h'),
                                            R"(", "max_tokens": 2000})");
      ASSERT_TRUE(SendAll(s.fds.back(), Post(hold, /*keep_alive=*/true), absl::Seconds(5)));
      const absl::Time started = absl::Now() + absl::Seconds(5);
      while (backend.endless_started.load() == 0 && absl::Now() < started) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      ASSERT_EQ(backend.endless_started.load(), 1);
    }
    SCOPED_TRACE(c.status);
    const int fd = Connect(port);
    s.fds.push_back(fd);
    ASSERT_TRUE(SendAll(fd, Post(c.body, /*keep_alive=*/true), absl::Seconds(5)));
    std::string in;
    const absl::Time end = absl::Now() + absl::Seconds(5);
    while (in.find(c.code) == std::string::npos && absl::Now() < end) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n <= 0) break;
      in.append(buf, n);
    }
    const absl::Time answered = absl::Now();
    EXPECT_TRUE(absl::StartsWith(in, c.status)) << in;
    EXPECT_NE(in.find(c.code), std::string::npos) << in;
    EXPECT_NE(in.find("Connection: close"), std::string::npos) << in;
    // The client keeps sending (a byte every 100 ms): the server closes its socket anyway,
    // within its 2 s lingering close.
    bool closed = false;
    while (!closed && absl::Now() < answered + absl::Seconds(5)) {
      closed = PeerClosed(fd);
      absl::SleepFor(absl::Milliseconds(100));
    }
    EXPECT_TRUE(closed) << "the server kept a refused connection for 5 s";
    EXPECT_LT(absl::Now() - answered, absl::Seconds(3.5));
  }
}

TEST_F(HttpFrontLoadTest, NonPositiveWriteTimeoutIsRefusedByName) {
  for (absl::Duration d : {absl::ZeroDuration(), absl::Seconds(-1)}) {
    HttpFrontOptions o{.host = "127.0.0.1", .write_timeout = d};
    auto f = HttpFront::Start(o, &backend_, tokenizer_.get(), &registry_);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(f.status().message().find("--http_write_timeout_s"), std::string::npos) << f.status();
  }
}

// 200 streaming clients that never read (each stream's first event echoes a 384 KiB prompt, more
// than the kernel's buffers hold), 200 sending a request byte a second (before and after their
// 408), 100 silent ones, all kept open by the attacker for the whole attack; meanwhile a
// well-behaved client sends completions one after another, retrying a 429 after 200 ms.
TEST_F(HttpFrontLoadTest, NeverReadingAndTricklingClientsAreCutOffWhileCompletionsSucceed) {
  constexpr int kNeverRead = 200;
  constexpr int kTricklers = 200;
  constexpr int kSilent = 100;
  constexpr int kSlots = 64;  // max_concurrent_streams' default
  constexpr absl::Duration kWriteTimeout = absl::Seconds(2);
  constexpr absl::Duration kShortHeaderTimeout = absl::Seconds(2);
  constexpr absl::Duration kLinger = absl::Seconds(2);  // the server's lingering close
  constexpr absl::Duration kAttack = absl::Seconds(14);
  // Descriptors the server may hold once every deadline has passed (the good client's one, the
  // listener's and the event loop's are in the baseline), and threads beyond the baseline: a
  // generation thread per slot, plus this test's three helper threads and a few exiting.
  constexpr int kServerFdSlack = 8;
  constexpr int kThreadSlack = 8;
  AttackBackend& backend = attack_backend_;
  StartFront({.max_concurrent_streams = kSlots,
              .max_connections = 1000,
              .header_timeout = kShortHeaderTimeout,
              .write_timeout = kWriteTimeout},
             &backend, /*context_length=*/1 << 20);
  const int port = front_->port();
  const int base_fds = CountProcEntries("fd");
  const int base_threads = CountProcEntries("task");
  ASSERT_GT(base_fds, 0);
  ASSERT_GT(base_threads, 0);

  // ---- Descriptors and threads, every 50 ms from here on.
  std::atomic<int> client_fds{0};  // the attackers' sockets open in this process
  std::atomic<bool> sampling{true};
  int max_server_fds = 0, max_threads = 0;
  std::vector<std::pair<absl::Time, int>> server_fds;  // (when, the server's descriptors)
  std::thread sampler([&] {
    while (sampling.load()) {
      // The good client's socket may be open: counted as the server's (within the slack).
      const int clients = client_fds.load();
      const int fds = CountProcEntries("fd") - base_fds - clients;
      const int threads = CountProcEntries("task");
      server_fds.emplace_back(absl::Now(), fds);
      max_server_fds = std::max(max_server_fds, fds);
      max_threads = std::max(max_threads, threads);
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  JoinOnExit join_sampler{&sampler, &sampling};

  // ---- The attack's sockets, open until the test ends.
  Sockets never_read, tricklers, silent;
  for (int i = 0; i < kTricklers; ++i) {
    tricklers.fds.push_back(Connect(port));
    ASSERT_GE(tricklers.fds.back(), 0);
    client_fds.fetch_add(1);
  }
  for (int i = 0; i < kSilent; ++i) {
    silent.fds.push_back(Connect(port));
    ASSERT_GE(silent.fds.back(), 0);
    client_fds.fetch_add(1);
  }

  // ---- The tricklers: a byte a second of a completion request, before and after their 408;
  // their answers (and the silent ones') are read.
  std::vector<std::string> trickle_in(kTricklers + kSilent);
  std::atomic<bool> trickling{true};
  std::thread trickler([&] {
    const std::string req = Post(R"({"prompt": "Hi"})", /*keep_alive=*/true);
    size_t sent = 0;
    absl::Time next_byte = absl::Now();
    while (trickling.load()) {
      if (absl::Now() >= next_byte) {
        for (int fd : tricklers.fds) (void)!send(fd, &req[sent % req.size()], 1, MSG_NOSIGNAL);
        ++sent;
        next_byte += absl::Seconds(1);
      }
      std::vector<pollfd> p;
      for (int fd : tricklers.fds) p.push_back({fd, POLLIN, 0});
      for (int fd : silent.fds) p.push_back({fd, POLLIN, 0});
      if (poll(p.data(), p.size(), 100) <= 0) continue;
      for (size_t k = 0; k < p.size(); ++k) {
        if ((p[k].revents & POLLIN) == 0) continue;
        char buf[4096];
        const ssize_t n = read(p[k].fd, buf, sizeof(buf));
        if (n > 0) trickle_in[k].append(buf, n);
      }
    }
  });
  JoinOnExit join_trickler{&trickler, &trickling};

  // ---- The never-reading streams.
  const std::string attack =
      absl::StrCat(R"({"prompt": ")", std::string(384 << 10, 'x'),
                   R"(", "stream": true, "echo": true, "max_tokens": 2000})");
  const std::string attack_req = Post(attack, /*keep_alive=*/true);
  for (int i = 0; i < kNeverRead; ++i) {
    never_read.fds.push_back(Connect(port));
    ASSERT_GE(never_read.fds.back(), 0);
    client_fds.fetch_add(1);
    ASSERT_TRUE(SendAll(never_read.fds.back(), attack_req, absl::Seconds(10))) << i;
  }
  const absl::Time t0 = absl::Now();  // every attacking request sent
  const absl::Time attack_end = t0 + kAttack;

  // ---- The well-behaved client.
  struct Result {
    absl::Duration at;  // since t0, when the answer ended
    int status;
  };
  std::vector<Result> good;
  std::string bad_answer;
  while (absl::Now() < attack_end) {
    std::string in;
    const int status =
        Complete(port, R"({"prompt": "Hi", "max_tokens": 4})", absl::Seconds(5), &in);
    good.push_back({absl::Now() - t0, status});
    if (status == 200 && in.find(R"("text":"abcd")") == std::string::npos) bad_answer = in;
    absl::SleepFor(absl::Milliseconds(status == 200 ? 50 : 200));  // a client's pace, or backoff
  }
  trickling.store(false);
  trickler.join();
  const int cut = backend.endless_started.load();

  // ---- Every stream admitted was cut at the write deadline, its generation cancelled as a
  // disconnect's, and every slot is free again.
  EXPECT_EQ(cut, kSlots) << "the never-reading streams should have taken every slot at first";
  EXPECT_EQ(backend.endless_cancelled.load(), cut);
  const absl::Time metrics_end = absl::Now() + absl::Seconds(5);
  std::string metrics;
  while (absl::Now() < metrics_end) {
    metrics = registry_.Render();
    if (metrics.find("duet_http_active_generations 0") != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_NE(metrics.find("duet_http_active_generations 0"), std::string::npos);
  EXPECT_NE(metrics.find(absl::StrCat("duet_http_client_disconnects_total ", cut)),
            std::string::npos);

  // ---- The good client: refused (429) only until the deadline cut the streams, then served.
  absl::Duration last_refusal = absl::ZeroDuration();
  int served = 0;
  for (const Result& r : good) {
    if (r.status == 200) {
      ++served;
    } else {
      last_refusal = r.at;
      EXPECT_EQ(r.status, 429) << "at +" << r.at;
    }
  }
  EXPECT_TRUE(bad_answer.empty()) << bad_answer;
  EXPECT_GE(served, 20);
  EXPECT_LT(last_refusal, kWriteTimeout + absl::Seconds(3))
      << "slots still held by clients that never read";

  // ---- Every attacking connection got its answer, then the server closed its socket while the
  // attacker still held its end (and the tricklers kept sending): the server holds at most
  // kServerFdSlack descriptors from header_timeout + the lingering close + 2 s on.
  for (int i = 0; i < kTricklers + kSilent; ++i) {
    EXPECT_TRUE(absl::StartsWith(trickle_in[i], "HTTP/1.1 408")) << i << ": " << trickle_in[i];
    EXPECT_NE(trickle_in[i].find("Connection: close"), std::string::npos) << trickle_in[i];
  }
  sampling.store(false);
  sampler.join();
  const absl::Duration settled =
      std::max(kShortHeaderTimeout, kWriteTimeout) + kLinger + absl::Seconds(2);
  int late_max = 0;
  for (const auto& [at, fds] : server_fds) {
    if (at >= t0 + settled) late_max = std::max(late_max, fds);
  }
  EXPECT_LE(late_max, kServerFdSlack)
      << "the server still held sockets of clients it had answered or cut off";
  EXPECT_LE(max_server_fds, kNeverRead + kTricklers + kSilent + kServerFdSlack);
  EXPECT_LE(max_threads, base_threads + kSlots + kThreadSlack);
  std::printf(
      "slow-client attack (%d never reading, %d trickling, %d silent; %d slots): %d streams cut, "
      "good client %d served, last 429 at +%.2f s; server descriptors max %d, after +%.0f s max "
      "%d; threads baseline %d, max %d\n",
      kNeverRead, kTricklers, kSilent, kSlots, cut, served, absl::ToDoubleSeconds(last_refusal),
      max_server_fds, absl::ToDoubleSeconds(settled), late_max, base_threads, max_threads);
}

}  // namespace
}  // namespace duet::http
