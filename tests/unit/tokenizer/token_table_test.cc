// TokenTable and TokenIndex: texts come back byte for byte, the first id of a duplicated text
// wins, lookups by text need no copy, a moved table keeps its indexes working, and the bytes
// held stay near the texts' own size.
#include "common/tokenizer/token_table.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace duet::model {
namespace {

TEST(TokenTableTest, TextsRoundTripIncludingEmptyAndBinary) {
  std::vector<std::string> texts = {"hello", "", std::string("a\0b", 3), "\xE2\x96\x81world",
                                    "hello"};
  const std::vector<std::string> copy = texts;
  auto table = TokenTable::Create(std::move(texts));
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->size(), 5);
  for (int32_t id = 0; id < 5; ++id) EXPECT_EQ(table->Text(id), copy[id]) << id;
}

TEST(TokenTableTest, IndexFindsTheFirstIdOfADuplicate) {
  auto table = TokenTable::Create({"a", "bc", "a", "", "bc", "d"});
  ASSERT_TRUE(table.ok());
  TokenIndex index(&*table);
  std::vector<bool> added;
  for (int32_t id = 0; id < table->size(); ++id) added.push_back(index.Add(id));
  EXPECT_EQ(added, (std::vector<bool>{true, true, false, true, false, true}));
  EXPECT_EQ(index.size(), 4u);
  EXPECT_EQ(index.Find("a"), 0);
  EXPECT_EQ(index.Find("bc"), 1);
  EXPECT_EQ(index.Find(""), 3);
  EXPECT_EQ(index.Find("d"), 5);
  EXPECT_EQ(index.Find("b"), -1);
  EXPECT_EQ(index.Find("bcd"), -1);
  // A substring of a longer buffer is looked up as it is.
  const std::string text = "xbcx";
  EXPECT_EQ(index.Find(std::string_view(text).substr(1, 2)), 1);
}

TEST(TokenTableTest, IndexOverASubsetKnowsOnlyItsIds) {
  auto table = TokenTable::Create({"<s>", "x", "</s>"});
  ASSERT_TRUE(table.ok());
  TokenIndex controls(&*table);
  controls.Add(0);
  controls.Add(2);
  EXPECT_EQ(controls.Find("</s>"), 2);
  EXPECT_EQ(controls.Find("x"), -1);
}

TEST(TokenTableTest, AMovedTableKeepsItsIndexes) {
  auto made = TokenTable::Create({"alpha", "beta", "gamma"});
  ASSERT_TRUE(made.ok());
  TokenTable table = std::move(*made);
  TokenIndex index(&table);
  for (int32_t id = 0; id < table.size(); ++id) index.Add(id);
  TokenTable moved = std::move(table);
  EXPECT_EQ(index.Find("gamma"), 2);
  EXPECT_EQ(moved.Text(1), "beta");
}

TEST(TokenTableTest, ALargeVocabularyHoldsFewBytesBeyondItsTexts) {
  // 50,000 texts of 4-12 bytes, as a BPE vocabulary's.
  std::vector<std::string> texts;
  size_t chars = 0;
  for (int i = 0; i < 50000; ++i) {
    texts.push_back(absl::StrCat("t", i, std::string(i % 7, 'x')));
    chars += texts.back().size();
  }
  auto table = TokenTable::Create(std::move(texts));
  ASSERT_TRUE(table.ok());
  TokenIndex index(&*table);
  index.Reserve(table->size());
  for (int32_t id = 0; id < table->size(); ++id) ASSERT_TRUE(index.Add(id)) << id;
  for (int32_t id = 0; id < table->size(); id += 997) {
    EXPECT_EQ(index.Find(absl::StrCat("t", id, std::string(id % 7, 'x'))), id);
  }
  // Texts, 4 bytes of offset a token, and at most 2 x 5 bytes of index slot a token.
  EXPECT_LE(table->bytes(), chars + 4 * 50000 + 64);
  EXPECT_LE(index.bytes(), 2 * 5 * 50000u);
}

}  // namespace
}  // namespace duet::model
