// EtcdClient, LeaseKeeper and watches against the real etcd (Debian's 3.4.23 binary), started
// per test on 127.0.0.1 (tests/integration/etcd_process.h). Skipped only when no etcd binary
// is installed.

#include "cluster/etcd/etcd_client.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cluster/etcd/lease_keeper.h"
#include "tests/integration/etcd_fixture.h"
#include "tests/integration/etcd_process.h"

namespace duet::etcd {
namespace {

using duet::testing::EtcdProcess;

// A change the test made, as a watch must report it.
struct Change {
  EventType type;
  std::string key;
  std::string value;  // puts only
  int64_t revision;
};

std::string Describe(EventType type, const std::string& key, const std::string& value,
                     int64_t revision) {
  return absl::StrCat(revision, type == EventType::kPut ? " PUT " : " DELETE ", key,
                      type == EventType::kPut ? "=" + value : "");
}

std::vector<std::string> Describe(const std::vector<Change>& changes) {
  std::vector<std::string> out;
  for (const Change& c : changes) out.push_back(Describe(c.type, c.key, c.value, c.revision));
  return out;
}

std::vector<std::string> Describe(const std::vector<WatchEvent>& events) {
  std::vector<std::string> out;
  for (const WatchEvent& e : events) {
    out.push_back(
        Describe(e.type, e.kv.key, e.type == EventType::kPut ? e.kv.value : "", e.revision));
  }
  return out;
}

// What one watch delivered: its events, then at most one error.
class EventLog {
 public:
  WatchCallback Callback() {
    return [this](absl::StatusOr<WatchEvent> event) {
      absl::MutexLock lock(&mu_);
      EXPECT_FALSE(error_.has_value()) << "a call after the watch's error";
      if (event.ok()) {
        events_.push_back(*std::move(event));
      } else {
        error_ = event.status();
        error_at_ = absl::Now();
      }
    };
  }
  // Waits until an event at `revision` or later came (true), an error came or `timeout` passed.
  bool AwaitRevision(int64_t revision, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, revision]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return error_.has_value() || (!events_.empty() && events_.back().revision >= revision);
    };
    mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
    return !events_.empty() && events_.back().revision >= revision;
  }
  // The error, once one came within `timeout`.
  std::optional<absl::Status> AwaitError(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto failed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return error_.has_value(); };
    mu_.AwaitWithTimeout(absl::Condition(&failed), timeout);
    return error_;
  }
  std::vector<WatchEvent> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  absl::Time error_at() {
    absl::MutexLock lock(&mu_);
    return error_at_;
  }

 private:
  absl::Mutex mu_;
  std::vector<WatchEvent> events_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> error_ ABSL_GUARDED_BY(mu_);
  absl::Time error_at_ ABSL_GUARDED_BY(mu_);
};

class EtcdClientTest : public duet::testing::EtcdFixture {
 protected:
  // Makes the change and records it.
  void Put(const std::string& key, const std::string& value) {
    absl::StatusOr<int64_t> revision = client().Put(key, value);
    ASSERT_TRUE(revision.ok()) << revision.status();
    changes_.push_back({EventType::kPut, key, value, *revision});
  }
  void Delete(const std::string& key) {
    absl::StatusOr<DeleteResult> deleted = client().Delete(key);
    ASSERT_TRUE(deleted.ok()) << deleted.status();
    ASSERT_EQ(deleted->deleted, 1) << key;
    changes_.push_back({EventType::kDelete, key, "", deleted->revision});
  }
  // The recorded changes under `prefix` after `revision`.
  std::vector<Change> ChangesAfter(int64_t revision, const std::string& prefix) const {
    std::vector<Change> out;
    for (const Change& c : changes_) {
      if (c.revision > revision && c.key.rfind(prefix, 0) == 0) out.push_back(c);
    }
    return out;
  }

  std::vector<Change> changes_;
};

TEST_F(EtcdClientTest, PutGetPrefixDelete) {
  const std::string binary("b\0n\xff\n", 5);
  absl::StatusOr<int64_t> r1 = client().Put("a/1", binary);
  ASSERT_TRUE(r1.ok()) << r1.status();
  absl::StatusOr<int64_t> r2 = client().Put("a/2", "");
  absl::StatusOr<int64_t> r3 = client().Put("b/1", "other");
  ASSERT_TRUE(r2.ok() && r3.ok());
  EXPECT_EQ(*r2, *r1 + 1);

  absl::StatusOr<RangeResult> one = client().Get("a/1");
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->kvs.size(), 1u);
  EXPECT_EQ(one->kvs[0].value, binary);
  EXPECT_EQ(one->kvs[0].create_revision, *r1);
  EXPECT_EQ(one->kvs[0].mod_revision, *r1);
  EXPECT_EQ(one->kvs[0].version, 1);
  EXPECT_EQ(one->kvs[0].lease, 0);
  EXPECT_EQ(one->revision, *r3);

  absl::StatusOr<RangeResult> prefix = client().GetPrefix("a/");
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  ASSERT_EQ(prefix->kvs.size(), 2u);
  EXPECT_EQ(prefix->kvs[0].key, "a/1");
  EXPECT_EQ(prefix->kvs[1].key, "a/2");
  EXPECT_EQ(prefix->kvs[1].value, "");
  EXPECT_EQ(client().GetPrefix("")->kvs.size(), 3u);
  EXPECT_TRUE(client().Get("a/3")->kvs.empty());

  absl::StatusOr<DeleteResult> deleted = client().Delete("a/1");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->deleted, 1);
  EXPECT_EQ(deleted->revision, *r3 + 1);
  EXPECT_EQ(client().Delete("a/1")->deleted, 0);
  EXPECT_EQ(client().DeletePrefix("a/")->deleted, 1);
  EXPECT_EQ(client().GetPrefix("")->kvs.size(), 1u);
}

TEST_F(EtcdClientTest, ErrorsCarryEtcdsCodeAndFailoverPassesADeadMember) {
  // A put under a lease that does not exist: etcd's NotFound, with the HTTP status and code.
  const absl::Status no_lease = client().Put("k", "v", 12345).status();
  EXPECT_EQ(no_lease.code(), absl::StatusCode::kNotFound) << no_lease;
  ASSERT_TRUE(GetErrorCause(no_lease).has_value());
  EXPECT_EQ(GetErrorCause(no_lease)->endpoint, etcd_->client_url());
  EXPECT_EQ(GetErrorCause(no_lease)->http_status, 404);
  EXPECT_EQ(GetErrorCause(no_lease)->etcd_code, 5);
  EXPECT_EQ(client().RevokeLease(12345).code(), absl::StatusCode::kNotFound);

  // The first endpoint refuses (nothing listens on port 1): every call moves on to the live
  // member, and the watch too.
  absl::StatusOr<EtcdClient> two =
      EtcdClient::Create({.endpoints = {"http://127.0.0.1:1", etcd_->client_url()},
                          .call_deadline = absl::Seconds(2)});
  ASSERT_TRUE(two.ok());
  EXPECT_TRUE(two->Put("k", "v").ok());
  EventLog log;
  absl::StatusOr<std::unique_ptr<WatchHandle>> watch = two->Watch("k", 0, log.Callback());
  ASSERT_TRUE(watch.ok()) << watch.status();
  EXPECT_EQ((*watch)->endpoint(), etcd_->client_url());
  absl::StatusOr<int64_t> revision = two->Put("k", "w");
  ASSERT_TRUE(revision.ok());
  EXPECT_TRUE(log.AwaitRevision(*revision, absl::Seconds(5)));
}

TEST_F(EtcdClientTest, ALeaseExpiresUnlessALeaseKeeperKeepsIt) {
  absl::StatusOr<Lease> dropped = client().GrantLease(absl::Seconds(1));
  absl::StatusOr<Lease> kept = client().GrantLease(absl::Seconds(2));
  ASSERT_TRUE(dropped.ok() && kept.ok()) << dropped.status() << kept.status();
  ASSERT_TRUE(client().Put("lease/dropped", "x", dropped->id).ok());
  ASSERT_TRUE(client().Put("lease/kept", "y", kept->id).ok());
  EXPECT_EQ(client().Get("lease/kept")->kvs.at(0).lease, kept->id);
  absl::Mutex mu;
  std::optional<absl::Status> lost;
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> keeper =
      LeaseKeeper::Start(client(), *kept, [&](absl::Status why) {
        absl::MutexLock lock(&mu);
        lost = why;
      });
  ASSERT_TRUE(keeper.ok()) << keeper.status();
  const absl::Time kept_since = absl::Now();

  // The unkept key goes once its lease's TTL has passed (etcd checks every 500 ms).
  const absl::Time deadline = absl::Now() + absl::Seconds(8);
  while (!client().Get("lease/dropped")->kvs.empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(client().Get("lease/dropped")->kvs.empty());
  // Gone means NotFound, decided from the keepalive's missing TTL.
  const absl::StatusOr<absl::Duration> renewed = client().KeepAliveOnce(dropped->id);
  EXPECT_EQ(renewed.status().code(), absl::StatusCode::kNotFound) << renewed.status();
  EXPECT_EQ(LeaseKeeper::Start(client(), *dropped, [](absl::Status) {}).status().code(),
            absl::StatusCode::kNotFound);

  // The kept one outlives two of its TTLs.
  absl::SleepFor(kept_since + absl::Seconds(4) - absl::Now());
  EXPECT_EQ(client().Get("lease/kept")->kvs.size(), 1u);
  EXPECT_GT(*client().KeepAliveOnce(kept->id), absl::ZeroDuration());
  {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(lost.has_value()) << *lost;
  }
  // Destroying the keeper revokes the lease: the key goes at once.
  keeper->reset();
  EXPECT_TRUE(client().Get("lease/kept")->kvs.empty());
  EXPECT_EQ(client().KeepAliveOnce(kept->id).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(EtcdClientTest, AWatchFromTheListsRevisionPlusOneSeesEveryChangeOnceInOrder) {
  Put("w/a", "1");
  Put("w/b", "2");
  Put("w/c", "3");
  absl::StatusOr<RangeResult> list = client().GetPrefix("w/");
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->kvs.size(), 3u);
  // Changes between the list and the watch's start, and one outside the prefix.
  Put("w/a", "10");
  Delete("w/b");
  Put("x/outside", "no");
  EventLog log;
  absl::StatusOr<std::unique_ptr<WatchHandle>> watch =
      client().Watch("w/", list->revision + 1, log.Callback());
  ASSERT_TRUE(watch.ok()) << watch.status();
  Put("w/d", "4");
  Delete("w/a");
  Put("w/c", "30");
  Put("w/e", "");
  // One revision, two events.
  absl::StatusOr<DeleteResult> all = client().DeletePrefix("w/");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->deleted, 3);
  for (const char* key : {"w/c", "w/d", "w/e"}) {
    changes_.push_back({EventType::kDelete, key, "", all->revision});
  }
  Put("w/f", "5");

  const std::vector<Change> expected = ChangesAfter(list->revision, "w/");
  ASSERT_TRUE(log.AwaitRevision(expected.back().revision, absl::Seconds(5)));
  absl::SleepFor(absl::Milliseconds(300));  // time for a duplicate to show
  EXPECT_EQ(Describe(log.events()), Describe(expected));

  // The list plus the events is the store now.
  std::map<std::string, std::string> state;
  for (const KeyValue& kv : list->kvs) state[kv.key] = kv.value;
  for (const WatchEvent& e : log.events()) {
    if (e.type == EventType::kPut) {
      state[e.kv.key] = e.kv.value;
    } else {
      state.erase(e.kv.key);
    }
  }
  std::map<std::string, std::string> now;
  absl::StatusOr<RangeResult> current = client().GetPrefix("w/");
  ASSERT_TRUE(current.ok()) << current.status();
  for (const KeyValue& kv : current->kvs) now[kv.key] = kv.value;
  EXPECT_EQ(state, now);
  EXPECT_FALSE(log.AwaitError(absl::ZeroDuration()).has_value());
}

TEST_F(EtcdClientTest, AWatchFromCompactedHistoryFailsWithTheCompactRevision) {
  Put("c/a", "1");
  Put("c/a", "2");
  Put("c/a", "3");
  const int64_t compacted = changes_.back().revision;
  ASSERT_TRUE(client().Compact(compacted).ok());
  EventLog log;
  absl::StatusOr<std::unique_ptr<WatchHandle>> watch =
      client().Watch("c/", compacted - 1, log.Callback());
  ASSERT_TRUE(watch.ok()) << watch.status();
  std::optional<absl::Status> error = log.AwaitError(absl::Seconds(5));
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), absl::StatusCode::kOutOfRange) << *error;
  ASSERT_TRUE(GetErrorCause(*error).has_value());
  EXPECT_EQ(GetErrorCause(*error)->compact_revision, compacted);
  EXPECT_TRUE(log.events().empty());
}

TEST_F(EtcdClientTest, AHungEtcdFailsTheWatchByItsProbeButAQuietOneLivesOn) {
  EventLog log;
  absl::StatusOr<std::unique_ptr<WatchHandle>> watch =
      client().Watch("h/", 0, log.Callback(),
                     WatchOptions{.probe_interval = absl::Milliseconds(200),
                                  .probe_timeout = absl::Milliseconds(800)});
  ASSERT_TRUE(watch.ok()) << watch.status();
  // Quiet but alive: nothing to read for many probe timeouts, and no error.
  EXPECT_FALSE(log.AwaitError(absl::Milliseconds(2500)).has_value());

  etcd_->Signal(SIGSTOP);
  const absl::Time stopped = absl::Now();
  std::optional<absl::Status> error = log.AwaitError(absl::Seconds(5));
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), absl::StatusCode::kDeadlineExceeded) << *error;
  EXPECT_LT(log.error_at() - stopped, absl::Seconds(2));
  const absl::Time get_start = absl::Now();
  const absl::Status get = client().WithCallDeadline(absl::Milliseconds(300)).Get("h/x").status();
  EXPECT_EQ(get.code(), absl::StatusCode::kDeadlineExceeded) << get;
  EXPECT_LT(absl::Now() - get_start, absl::Seconds(1));
  etcd_->Signal(SIGCONT);
  EXPECT_TRUE(client().Get("h/x").ok());
}

TEST_F(EtcdClientTest, KilledEtcdFailsTheWatchKeepsTheLeaseAndARewatchAfterRestartLosesNothing) {
  absl::StatusOr<Lease> lease = client().GrantLease(absl::Seconds(2));
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::Mutex mu;
  std::optional<absl::Status> lost;
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> keeper =
      LeaseKeeper::Start(client(), *lease, [&](absl::Status why) {
        absl::MutexLock lock(&mu);
        lost = why;
      });
  ASSERT_TRUE(keeper.ok()) << keeper.status();

  ASSERT_TRUE(client().Put("leased/k", "v", lease->id).ok());
  Put("m/a", "0");
  absl::StatusOr<RangeResult> list = client().GetPrefix("m/");
  ASSERT_TRUE(list.ok());
  EventLog first;
  absl::StatusOr<std::unique_ptr<WatchHandle>> watch =
      client().Watch("m/", list->revision + 1, first.Callback());
  ASSERT_TRUE(watch.ok()) << watch.status();
  for (int i = 0; i < 30; ++i) {
    Put(absl::StrCat("m/", i % 4), absl::StrCat(i));
    if (i % 7 == 6) Delete(absl::StrCat("m/", i % 4));
  }
  etcd_->Kill();  // right after the last put: the watch may not have delivered it yet
  const absl::Time killed = absl::Now();

  // A broken stream is an error at once, not after a probe's timeout (2 s).
  std::optional<absl::Status> error = first.AwaitError(absl::Seconds(3));
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), absl::StatusCode::kUnavailable) << *error;
  EXPECT_LT(first.error_at() - killed, absl::Seconds(2));
  EXPECT_EQ(client().Put("m/x", "y").status().code(), absl::StatusCode::kUnavailable);
  // The keeper cannot renew: past the TTL (2 s after the last renewal) the lease is unconfirmed,
  // not lost (etcd is away, nobody saw it expire).
  const absl::Time unconfirmed_by = absl::Now() + absl::Seconds(4);
  while (!(*keeper)->unconfirmed() && absl::Now() < unconfirmed_by) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE((*keeper)->unconfirmed());
  EXPECT_LT(absl::Now() - killed, absl::Seconds(3));
  EXPECT_FALSE((*keeper)->lost());
  watch->reset();

  ASSERT_TRUE(etcd_->Restart().ok());
  // etcd extends every lease on recovery: the keeper renews the same lease again, and its key
  // outlives two more TTLs.
  const absl::Time confirmed_by = absl::Now() + absl::Seconds(3);
  while ((*keeper)->unconfirmed() && absl::Now() < confirmed_by) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_FALSE((*keeper)->unconfirmed());
  absl::SleepFor(absl::Seconds(4));
  {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(lost.has_value()) << *lost;
  }
  absl::StatusOr<RangeResult> leased = client().Get("leased/k");
  ASSERT_TRUE(leased.ok()) << leased.status();
  EXPECT_EQ(leased->kvs.size(), 1u);
  const std::vector<WatchEvent> before = first.events();
  const int64_t last_seen = before.empty() ? list->revision : before.back().revision;
  EventLog second;
  absl::StatusOr<std::unique_ptr<WatchHandle>> rewatch =
      client().Watch("m/", last_seen + 1, second.Callback());
  ASSERT_TRUE(rewatch.ok()) << rewatch.status();
  // A consumer that had got only half of the events when its watch broke resumes from there:
  // the restarted etcd replays the rest from its persisted history.
  ASSERT_GE(before.size(), 2u);
  const std::vector<WatchEvent> half(before.begin(), before.begin() + before.size() / 2);
  EventLog third;
  absl::StatusOr<std::unique_ptr<WatchHandle>> from_half =
      client().Watch("m/", half.back().revision + 1, third.Callback());
  ASSERT_TRUE(from_half.ok()) << from_half.status();
  Put("m/after", "1");
  Delete("m/after");
  const std::vector<Change> expected = ChangesAfter(list->revision, "m/");
  ASSERT_TRUE(second.AwaitRevision(expected.back().revision, absl::Seconds(5)));
  ASSERT_TRUE(third.AwaitRevision(expected.back().revision, absl::Seconds(5)));
  absl::SleepFor(absl::Milliseconds(300));  // time for a duplicate to show
  std::vector<WatchEvent> all = before;
  for (const WatchEvent& e : second.events()) all.push_back(e);
  EXPECT_EQ(Describe(all), Describe(expected))
      << before.size() << " events before the kill, " << second.events().size() << " after";
  std::vector<WatchEvent> resumed = half;
  for (const WatchEvent& e : third.events()) resumed.push_back(e);
  EXPECT_EQ(Describe(resumed), Describe(expected));
}

}  // namespace
}  // namespace duet::etcd
