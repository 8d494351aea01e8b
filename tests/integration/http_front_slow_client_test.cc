// HttpFront under slow-client attacks, on 127.0.0.1: 200 streaming clients that never read, 200
// sending a request byte a second and 100 silent ones, while a well-behaved client's completions
// must succeed, the streams are cut at the write deadline (slots and generations freed as for a
// disconnect), every refused connection is closed by the server, and its descriptors and threads
// stay bounded. The backend is AttackBackend (http_load_util.h): what is under test is the front.
#include <dirent.h>

#include <string>
#include <thread>
#include <vector>

#include "tests/integration/http_load_util.h"

namespace duet::http::testing {
namespace {

class HttpFrontSlowClientTest : public HttpFrontLoadTest {};

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

TEST_F(HttpFrontSlowClientTest, RefusalsCloseTheConnectionWhileTheClientKeepsSending) {
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

TEST_F(HttpFrontSlowClientTest, NonPositiveWriteTimeoutIsRefusedByName) {
  for (absl::Duration d : {absl::ZeroDuration(), absl::Seconds(-1)}) {
    HttpFrontOptions o{.host = "127.0.0.1", .write_timeout = d};
    auto f = HttpFront::Start(o, &backend_, tokenizer_.get(), &registry_);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(f.status().message().find("--http-write-timeout-s"), std::string::npos) << f.status();
  }
  // The body and connection limits likewise (they were raised to 1 without a word).
  HttpFrontOptions no_body{.host = "127.0.0.1", .max_body_bytes = 0};
  auto f = HttpFront::Start(no_body, &backend_, tokenizer_.get(), &registry_);
  EXPECT_TRUE(absl::IsInvalidArgument(f.status())) << f.status();
  EXPECT_NE(f.status().message().find("--max-body-bytes"), std::string::npos) << f.status();
  HttpFrontOptions no_connections{.host = "127.0.0.1", .max_connections = 0};
  f = HttpFront::Start(no_connections, &backend_, tokenizer_.get(), &registry_);
  EXPECT_TRUE(absl::IsInvalidArgument(f.status())) << f.status();
  EXPECT_NE(f.status().message().find("--http-max-connections"), std::string::npos) << f.status();
}

// 200 streaming clients that never read (each stream's first event echoes a 384 KiB prompt, more
// than the kernel's buffers hold), 200 sending a request byte a second (before and after their
// 408), 100 silent ones, all kept open by the attacker for the whole attack; meanwhile a
// well-behaved client sends completions one after another, retrying a 429 after 200 ms.
TEST_F(HttpFrontSlowClientTest, NeverReadingAndTricklingClientsAreCutOffWhileCompletionsSucceed) {
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
      // The good client's socket may be open: counted as the server's (within the slack). The
      // attackers' count is read after the scan, which sockets they open meanwhile would
      // otherwise join as the server's (dozens when the machine is busy).
      const int all = CountProcEntries("fd");
      const int fds = all - base_fds - client_fds.load();
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
}  // namespace duet::http::testing
