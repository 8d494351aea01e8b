// NodeStatusLog: cursors read independently, a cursor that fell behind the window (or a Reset)
// gets a snapshot, a waiting or lagging subscriber never holds up the writer, and memory stays
// within the window.
#include "cluster/node_status_log.h"

#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace duet::cluster {
namespace {

kv::BlockHash H(uint64_t i) { return kv::BlockHash{.low = i, .high = 0}; }
kv::KvCacheEvent Stored(uint64_t i) {
  return {.kind = kv::KvCacheEvent::Kind::kStored, .hash = H(i)};
}
kv::KvCacheEvent Removed(uint64_t i) {
  return {.kind = kv::KvCacheEvent::Kind::kRemoved, .hash = H(i)};
}
absl::Time Soon() { return absl::Now() + absl::Milliseconds(50); }

TEST(NodeStatusLogTest, EachCursorStartsFromASnapshotAndReadsAtItsOwnPace) {
  NodeStatusLog log({}, {.next_seq = 5, .hashes = {H(1)}});
  NodeStatusLog::Cursor fast = log.Subscribe();
  NodeStatusLog::Cursor slow = log.Subscribe();
  for (NodeStatusLog::Cursor* c : {&fast, &slow}) {
    absl::StatusOr<StatusLogRead> r = c->Next(Soon());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->snapshot.has_value());
    EXPECT_EQ(r->snapshot->next_seq, 5u);
    EXPECT_EQ(r->snapshot->hashes, std::vector<kv::BlockHash>{H(1)});
  }
  ASSERT_TRUE(log.Append({.first_seq = 5, .events = {Stored(2), Stored(3)}}));
  absl::StatusOr<StatusLogRead> r = fast.Next(Soon());
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->snapshot.has_value());
  EXPECT_EQ(r->batch.first_seq, 5u);
  EXPECT_EQ(r->batch.events, (std::vector<kv::KvCacheEvent>{Stored(2), Stored(3)}));
  ASSERT_TRUE(log.Append({.first_seq = 7, .events = {Removed(1)}}));
  r = fast.Next(Soon());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->batch.first_seq, 7u);
  EXPECT_EQ(r->batch.events, std::vector<kv::KvCacheEvent>{Removed(1)});
  // Nothing new: an empty batch at the deadline, numbered where the cursor stands.
  r = fast.Next(Soon());
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->snapshot.has_value());
  EXPECT_TRUE(r->batch.events.empty());
  EXPECT_EQ(r->batch.first_seq, 8u);
  // The slow cursor still gets every event from where it stood.
  r = slow.Next(Soon());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->batch.first_seq, 5u);
  EXPECT_EQ(r->batch.events, (std::vector<kv::KvCacheEvent>{Stored(2), Stored(3), Removed(1)}));
  // A new subscriber's snapshot is the cache as of the newest event.
  NodeStatusLog::Cursor late = log.Subscribe();
  r = late.Next(Soon());
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->snapshot.has_value());
  EXPECT_EQ(r->snapshot->next_seq, 8u);
  EXPECT_EQ(r->snapshot->hashes, (std::vector<kv::BlockHash>{H(2), H(3)}));
}

TEST(NodeStatusLogTest, ACursorBehindTheWindowGetsASnapshot) {
  NodeStatusLog log({.window = 4}, {.next_seq = 0, .hashes = {}});
  NodeStatusLog::Cursor c = log.Subscribe();
  ASSERT_TRUE(c.Next(Soon())->snapshot.has_value());
  ASSERT_TRUE(log.Append({.first_seq = 0, .events = {Stored(1), Stored(2), Stored(3)}}));
  ASSERT_TRUE(log.Append({.first_seq = 3, .events = {Removed(2), Stored(4), Stored(5)}}));
  // Events 0 and 1 left the window: the cursor at 0 cannot continue.
  absl::StatusOr<StatusLogRead> r = c.Next(Soon());
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->snapshot.has_value());
  EXPECT_EQ(r->snapshot->next_seq, 6u);
  EXPECT_EQ(r->snapshot->hashes, (std::vector<kv::BlockHash>{H(1), H(3), H(4), H(5)}));
  // From there it continues with events.
  ASSERT_TRUE(log.Append({.first_seq = 6, .events = {Stored(6)}}));
  r = c.Next(Soon());
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->snapshot.has_value());
  EXPECT_EQ(r->batch.first_seq, 6u);
}

TEST(NodeStatusLogTest, ABatchThatDoesNotContinueIsRefusedAndAResetResyncsEveryCursor) {
  NodeStatusLog log({}, {.next_seq = 10, .hashes = {H(1)}});
  NodeStatusLog::Cursor c = log.Subscribe();
  ASSERT_TRUE(c.Next(Soon())->snapshot.has_value());
  EXPECT_FALSE(log.Append({.first_seq = 12, .events = {Stored(2)}}));  // 10 and 11 were lost
  EXPECT_FALSE(log.Append({.first_seq = 12, .events = {}}));  // an empty drain past the log too
  EXPECT_EQ(log.next_seq(), 10u);
  log.Reset({.next_seq = 13, .hashes = {H(2), H(7)}});
  absl::StatusOr<StatusLogRead> r = c.Next(Soon());
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->snapshot.has_value());
  EXPECT_EQ(r->snapshot->next_seq, 13u);
  EXPECT_EQ(r->snapshot->hashes, (std::vector<kv::BlockHash>{H(2), H(7)}));
  EXPECT_TRUE(log.Append({.first_seq = 13, .events = {}}));
  // A Reset at the very number the cursor stands at (the same numbering, other content)
  // resyncs it all the same.
  log.Reset({.next_seq = 13, .hashes = {H(9)}});
  r = c.Next(Soon());
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->snapshot.has_value());
  EXPECT_EQ(r->snapshot->next_seq, 13u);
  EXPECT_EQ(r->snapshot->hashes, std::vector<kv::BlockHash>{H(9)});
}

// A subscriber waiting for events (or never reading) takes nothing from the writer: appends go
// through while it waits, and it is woken by them rather than by its deadline.
TEST(NodeStatusLogTest, AWaitingOrLaggingSubscriberDoesNotHoldUpTheWriter) {
  NodeStatusLog log({.window = 64}, {.next_seq = 0, .hashes = {}});
  NodeStatusLog::Cursor idle = log.Subscribe();  // reads once, then never again
  ASSERT_TRUE(idle.Next(Soon())->snapshot.has_value());
  NodeStatusLog::Cursor waiting = log.Subscribe();
  ASSERT_TRUE(waiting.Next(Soon())->snapshot.has_value());
  absl::StatusOr<StatusLogRead> woken;
  absl::Time woken_at;
  std::thread reader([&] {
    woken = waiting.Next(absl::Now() + absl::Seconds(20));
    woken_at = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(100));  // the reader waits in Next
  const absl::Time start = absl::Now();
  uint64_t seq = 0;
  for (int i = 0; i < 20000; ++i, ++seq) {
    ASSERT_TRUE(log.Append({.first_seq = seq, .events = {Stored(seq % 100)}}));
  }
  const absl::Duration writing = absl::Now() - start;
  reader.join();
  EXPECT_LT(writing, absl::Seconds(2));
  ASSERT_TRUE(woken.ok()) << woken.status();
  EXPECT_LT(woken_at - start, absl::Seconds(2));  // woken by the events, not its deadline
  // The idle subscriber fell out of the window: a snapshot, not 20000 events.
  absl::StatusOr<StatusLogRead> r = idle.Next(Soon());
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->snapshot.has_value());
  EXPECT_EQ(r->snapshot->next_seq, seq);
  EXPECT_EQ(r->snapshot->hashes.size(), 100u);
}

TEST(NodeStatusLogTest, MemoryStaysWithinTheWindow) {
  NodeStatusLog log({.window = 16, .max_batch = 8}, {.next_seq = 0, .hashes = {}});
  uint64_t seq = 0;
  for (int round = 0; round < 1000; ++round) {
    std::vector<kv::KvCacheEvent> events;
    for (uint64_t h = 0; h < 10; ++h) events.push_back(round % 2 == 0 ? Stored(h) : Removed(h));
    ASSERT_TRUE(log.Append({.first_seq = seq, .events = events}));
    seq += events.size();
    EXPECT_LE(log.retained(), 16u);
  }
  EXPECT_EQ(log.retained(), 16u);
  EXPECT_EQ(log.cached_blocks(), 0u);  // the last round removed all ten
  EXPECT_EQ(log.next_seq(), seq);
  // A reader within the window gets at most max_batch events per read.
  NodeStatusLog::Cursor c = log.Subscribe();
  ASSERT_TRUE(c.Next(Soon())->snapshot.has_value());
  ASSERT_TRUE(
      log.Append({.first_seq = seq, .events = std::vector<kv::KvCacheEvent>(12, Stored(1))}));
  EXPECT_EQ(c.Next(Soon())->batch.events.size(), 8u);
  EXPECT_EQ(c.Next(Soon())->batch.events.size(), 4u);
}

TEST(NodeStatusLogTest, CloseWakesAndFailsReaders) {
  NodeStatusLog log({}, {.next_seq = 0, .hashes = {}});
  NodeStatusLog::Cursor c = log.Subscribe();
  ASSERT_TRUE(c.Next(Soon()).ok());
  absl::StatusOr<StatusLogRead> r;
  std::thread reader([&] { r = c.Next(absl::Now() + absl::Seconds(20)); });
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time closed = absl::Now();
  log.Close();
  reader.join();
  EXPECT_LT(absl::Now() - closed, absl::Seconds(2));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace duet::cluster
