// HttpFront under many connections, on 127.0.0.1: 1,000 concurrent streaming clients plus 200
// slow ones (100 sending their header a byte a second, 100 sending nothing) while /health is
// probed every 5 ms and must answer within 100 ms (p99; every probe within 1 s); the slow ones are
// cut off at the header deadline and every stream gets its whole answer. Also: the connection limit
// (503 naming it), the body deadline (408 naming it) and idle keep-alive connections being closed.
// Slow-client attacks on the write path are in http_front_slow_client_test.
//
// The backend is a test one that streams tokens on a timer: a real model cannot produce 1,000
// concurrent streams within CI time on two cores, and what is under test is the front (its
// threads and sockets), not the model. The front's own disconnect and cancel paths are covered
// over a real colocated server by colocated_serve_test.
#include "tests/integration/http_load_util.h"

namespace duet::http::testing {
namespace {

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

}  // namespace
}  // namespace duet::http::testing
