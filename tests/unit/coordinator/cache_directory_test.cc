#include "coordinator/cache_directory.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace duet::coordinator {
namespace {

const NodeIncarnation kD{"decode-0", 1};
const NodeIncarnation kD2{"decode-0", 2};  // a later incarnation of the same node
const NodeIncarnation kOther{"decode-1", 1};
const NodeIncarnation kP{"prefill-0", 1};

bool Contains(absl::string_view haystack, const std::string& needle) {
  return haystack.find(needle) != absl::string_view::npos;
}

TEST(CacheDirectoryTest, LifeOfARequestAndUsage) {
  CacheDirectory dir;
  ASSERT_TRUE(dir.Reserve("r1", kD, {4, 5, 6}).ok());
  EXPECT_EQ(dir.StateOf("r1"), KvState::kReserved);
  EXPECT_EQ(dir.Usage(kD), (NodeUsage{.reserved_blocks = 3, .requests = 1}));
  EXPECT_EQ(dir.HolderOf(kD, 5), "r1");

  ASSERT_TRUE(dir.BeginWrite("r1", kP).ok());
  EXPECT_EQ(dir.StateOf("r1"), KvState::kWriting);
  EXPECT_EQ(dir.Find("r1")->writer, kP);
  EXPECT_EQ(dir.Usage(kD), (NodeUsage{.writing_blocks = 3, .requests = 1}));

  ASSERT_TRUE(dir.CompleteWrite("r1").ok());
  EXPECT_EQ(dir.StateOf("r1"), KvState::kOwned);
  EXPECT_EQ(dir.Usage(kD), (NodeUsage{.owned_blocks = 3, .requests = 1}));
  EXPECT_TRUE(dir.CheckConsistency().ok());

  auto released = dir.Release("r1");
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->state, KvState::kOwned);
  EXPECT_EQ(released->block_ids, (std::vector<kv::BlockId>{4, 5, 6}));
  EXPECT_EQ(dir.StateOf("r1"), KvState::kAbsent);
  EXPECT_TRUE(dir.empty());
  EXPECT_TRUE(dir.AllUsage().empty());
  EXPECT_EQ(dir.Usage(kD), NodeUsage{});
  EXPECT_FALSE(dir.HolderOf(kD, 5).has_value());
  EXPECT_TRUE(dir.CheckConsistency().ok());
}

enum class Op { kReserve, kBeginWrite, kCompleteWrite, kRelease };
const char* OpName(Op op) {
  switch (op) {
    case Op::kReserve:
      return "Reserve";
    case Op::kBeginWrite:
      return "BeginWrite";
    case Op::kCompleteWrite:
      return "CompleteWrite";
    case Op::kRelease:
      return "Release";
  }
  return "?";
}

// Puts "r1" into `state` the legal way.
void Drive(CacheDirectory& dir, KvState state) {
  if (state == KvState::kAbsent) return;
  ASSERT_TRUE(dir.Reserve("r1", kD, {1, 2}).ok());
  if (state == KvState::kReserved) return;
  ASSERT_TRUE(dir.BeginWrite("r1", kP).ok());
  if (state == KvState::kWriting) return;
  ASSERT_TRUE(dir.CompleteWrite("r1").ok());
}

absl::Status Apply(CacheDirectory& dir, Op op) {
  switch (op) {
    case Op::kReserve:
      return dir.Reserve("r1", kD, {7, 8});
    case Op::kBeginWrite:
      return dir.BeginWrite("r1", kP);
    case Op::kCompleteWrite:
      return dir.CompleteWrite("r1");
    case Op::kRelease:
      return dir.Release("r1").status();
  }
  return absl::InternalError("unreachable");
}

KvState Target(Op op) {
  switch (op) {
    case Op::kReserve:
      return KvState::kReserved;
    case Op::kBeginWrite:
      return KvState::kWriting;
    case Op::kCompleteWrite:
      return KvState::kOwned;
    case Op::kRelease:
      return KvState::kReleased;
  }
  return KvState::kAbsent;
}

bool Legal(KvState from, Op op) {
  switch (op) {
    case Op::kReserve:
      return from == KvState::kAbsent;
    case Op::kBeginWrite:
      return from == KvState::kReserved;
    case Op::kCompleteWrite:
      return from == KvState::kWriting;
    case Op::kRelease:
      return from != KvState::kAbsent;
  }
  return false;
}

TEST(CacheDirectoryTest, EveryTransitionIsCheckedAndIllegalOnesChangeNothing) {
  int illegal = 0;
  for (KvState from : {KvState::kAbsent, KvState::kReserved, KvState::kWriting, KvState::kOwned}) {
    for (Op op : {Op::kReserve, Op::kBeginWrite, Op::kCompleteWrite, Op::kRelease}) {
      SCOPED_TRACE(std::string(KvStateName(from)) + " + " + OpName(op));
      CacheDirectory dir;
      Drive(dir, from);
      const auto before_entry = dir.Find("r1");
      const NodeUsage before_usage = dir.Usage(kD);
      absl::Status s = Apply(dir, op);
      if (Legal(from, op)) {
        EXPECT_TRUE(s.ok()) << s;
        const KvState want = Target(op) == KvState::kReleased ? KvState::kAbsent : Target(op);
        EXPECT_EQ(dir.StateOf("r1"), want);
      } else {
        ++illegal;
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
        EXPECT_TRUE(Contains(s.message(), "request r1")) << s;
        EXPECT_TRUE(Contains(s.message(),
                             std::string(KvStateName(from)) + " -> " + KvStateName(Target(op))))
            << s;
        EXPECT_EQ(dir.StateOf("r1"), from);
        EXPECT_EQ(dir.Usage(kD), before_usage);
        EXPECT_EQ(dir.Find("r1").has_value(), before_entry.has_value());
        if (before_entry) {
          EXPECT_EQ(dir.Find("r1")->block_ids, before_entry->block_ids);
        }
      }
      EXPECT_TRUE(dir.CheckConsistency().ok()) << dir.CheckConsistency();
    }
  }
  EXPECT_EQ(illegal, 16 - 6);  // 6 legal pairs: Reserve, BeginWrite, CompleteWrite, 3 Releases
}

TEST(CacheDirectoryTest, ReserveValidatesBlocks) {
  CacheDirectory dir;
  EXPECT_EQ(dir.Reserve("r1", kD, {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dir.Reserve("r1", kD, {3, 3}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(dir.Reserve("r1", kD, {1, 2, 3}).ok());
  absl::Status twice = dir.Reserve("r2", kD, {9, 3});
  EXPECT_EQ(twice.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(Contains(twice.message(), "block 3")) << twice;
  EXPECT_TRUE(Contains(twice.message(), "held by request r1")) << twice;
  EXPECT_FALSE(dir.Find("r2").has_value());
  EXPECT_FALSE(dir.HolderOf(kD, 9).has_value());
  // The same block id on another node or another incarnation is another block.
  EXPECT_TRUE(dir.Reserve("r3", kOther, {3}).ok());
  EXPECT_TRUE(dir.Reserve("r4", kD2, {3}).ok());
  EXPECT_TRUE(dir.CheckConsistency().ok());
  // Released blocks can be handed out again.
  ASSERT_TRUE(dir.Release("r1").ok());
  EXPECT_TRUE(dir.Reserve("r2", kD, {9, 3}).ok());
}

TEST(CacheDirectoryTest, DropNodeRemovesThatIncarnationOnlyAndLeavesNothingBehind) {
  CacheDirectory dir;
  ASSERT_TRUE(dir.Reserve("a-reserved", kD, {1}).ok());
  ASSERT_TRUE(dir.Reserve("b-writing", kD, {2, 3}).ok());
  ASSERT_TRUE(dir.BeginWrite("b-writing", kP).ok());
  ASSERT_TRUE(dir.Reserve("c-owned", kD, {4}).ok());
  ASSERT_TRUE(dir.BeginWrite("c-owned", kP).ok());
  ASSERT_TRUE(dir.CompleteWrite("c-owned").ok());
  ASSERT_TRUE(dir.Reserve("new-epoch", kD2, {1}).ok());
  ASSERT_TRUE(dir.Reserve("other-node", kOther, {1}).ok());

  auto affected = dir.DropNode(kD);
  ASSERT_EQ(affected.size(), 3u);
  EXPECT_EQ(affected[0], (AffectedRequest{"a-reserved", AffectedRequest::Role::kHolder,
                                          KvState::kReserved, kD}));
  EXPECT_EQ(affected[1],
            (AffectedRequest{"b-writing", AffectedRequest::Role::kHolder, KvState::kWriting, kD}));
  EXPECT_EQ(affected[2],
            (AffectedRequest{"c-owned", AffectedRequest::Role::kHolder, KvState::kOwned, kD}));
  for (const char* r : {"a-reserved", "b-writing", "c-owned"}) {
    EXPECT_EQ(dir.StateOf(r), KvState::kAbsent) << r;
  }
  for (kv::BlockId b : {1, 2, 3, 4}) EXPECT_FALSE(dir.HolderOf(kD, b).has_value()) << b;
  EXPECT_EQ(dir.Usage(kD), NodeUsage{});
  EXPECT_EQ(dir.size(), 2u);
  EXPECT_EQ(dir.HolderOf(kD2, 1), "new-epoch");
  EXPECT_EQ(dir.HolderOf(kOther, 1), "other-node");
  auto usage = dir.AllUsage();
  ASSERT_EQ(usage.size(), 2u);
  EXPECT_EQ(usage[0].first, kD2);
  EXPECT_EQ(usage[1].first, kOther);
  EXPECT_TRUE(dir.CheckConsistency().ok()) << dir.CheckConsistency();
  // The dropped writer index is gone too: dropping the prefill node reports nothing.
  EXPECT_TRUE(dir.DropNode(kP).empty());
  EXPECT_TRUE(dir.DropNode(kD).empty());
}

TEST(CacheDirectoryTest, DropPrefillNodeReportsWhatItWasWritingAndKeepsTheBlocks) {
  CacheDirectory dir;
  ASSERT_TRUE(dir.Reserve("r1", kD, {1}).ok());
  ASSERT_TRUE(dir.BeginWrite("r1", kP).ok());
  ASSERT_TRUE(dir.Reserve("r2", kOther, {1}).ok());
  ASSERT_TRUE(dir.BeginWrite("r2", kP).ok());
  ASSERT_TRUE(dir.CompleteWrite("r2").ok());  // done writing: not affected
  auto affected = dir.DropNode(kP);
  ASSERT_EQ(affected.size(), 1u);
  EXPECT_EQ(affected[0],
            (AffectedRequest{"r1", AffectedRequest::Role::kWriter, KvState::kWriting, kD}));
  EXPECT_EQ(dir.StateOf("r1"), KvState::kWriting);  // D still holds it until released
  ASSERT_TRUE(dir.Release("r1").ok());
  EXPECT_TRUE(dir.DropNode(kP).empty());
  EXPECT_TRUE(dir.CheckConsistency().ok());
}

}  // namespace
}  // namespace duet::coordinator
