// Shared by the HttpFront load tests (http_front_load_test, http_front_slow_client_test): test
// backends that stream on a timer (TimerBackend) or run endless generations for long prompts
// (AttackBackend), raw client sockets on 127.0.0.1, and the fixture that starts a front over
// them with a byte tokenizer.
//
//   class MyTest : public HttpFrontLoadTest {};
//   TEST_F(MyTest, X) { StartFront({.max_concurrent_streams = 4}); int fd =
//   Connect(front_->port()); }
#pragma once

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
#include "common/tokenizer/byte_tokenizer.h"
#include "http/http_front.h"
#include "nlohmann/json.hpp"

namespace duet::http::testing {

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

inline std::string ExpectedText() {
  std::string s;
  for (int i = 0; i < kTokens; ++i) s += static_cast<char>('a' + i % 26);
  return s;
}

// A blocking connect to 127.0.0.1:port, then non-blocking; -1 on failure.
inline int Connect(int port) {
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
inline absl::Duration ProbeHealth(int port, absl::Duration limit) {
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
inline bool StreamText(const std::string& raw, std::string* text) {
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

// Reads from fd until the peer closes or `limit` passes; what arrived.
inline std::string ReadAll(int fd, absl::Duration limit, bool* closed) {
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

}  // namespace duet::http::testing
