#include "bench/serve_bench/workload.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

namespace duet::bench {
namespace {

TEST(LengthRangeTest, ParsesFixedAndRanges) {
  auto a = ParseLengthRange("128");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->min, 128);
  EXPECT_EQ(a->max, 128);
  auto b = ParseLengthRange("512-1024");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->min, 512);
  EXPECT_EQ(b->max, 1024);
  for (const char* bad : {"", "0", "-3", "10-5", "a", "1-2-3", "5-"}) {
    EXPECT_FALSE(ParseLengthRange(bad).ok()) << bad;
  }
}

TEST(PoissonArrivalsTest, SameSeedSameTimesAndTheRateIsRight) {
  PoissonArrivals a(4.0, 42), b(4.0, 42), c(4.0, 43);
  std::vector<double> ta, tb, tc;
  for (int i = 0; i < 20000; ++i) {
    ta.push_back(a.Next());
    tb.push_back(b.Next());
    tc.push_back(c.Next());
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
  for (size_t i = 1; i < ta.size(); ++i) ASSERT_GT(ta[i], ta[i - 1]);
  // 20000 arrivals at 4/s take ~5000 s (sd of the sum: sqrt(20000)/4 ~ 35 s).
  EXPECT_NEAR(ta.back(), 5000, 250);
  // Exponential gaps: the coefficient of variation is 1 (a fixed-rate schedule would give 0).
  std::vector<double> gaps = {ta[0]};
  for (size_t i = 1; i < ta.size(); ++i) gaps.push_back(ta[i] - ta[i - 1]);
  const double mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / gaps.size();
  double var = 0;
  for (double g : gaps) var += (g - mean) * (g - mean);
  var /= gaps.size();
  EXPECT_NEAR(std::sqrt(var) / mean, 1.0, 0.05);
}

TEST(RngTest, UniformIntStaysInRangeAndCoversIt) {
  Rng r(7);
  std::vector<int> hits(5, 0);
  for (int i = 0; i < 5000; ++i) {
    const int64_t x = r.UniformInt(10, 14);
    ASSERT_GE(x, 10);
    ASSERT_LE(x, 14);
    ++hits[x - 10];
  }
  for (int h : hits) EXPECT_GT(h, 800);
  EXPECT_EQ(r.UniformInt(3, 3), 3);
}

TEST(SyntheticSourceTest, ExactLengthsIdsInRangeAndRepeatable) {
  const SyntheticOptions o{
      .input = {5, 9}, .output = {3, 3}, .min_token_id = 20, .max_token_id = 30};
  SyntheticSource a(o, 1, "main"), b(o, 1, "main"), c(o, 2, "main");
  bool differs = false;
  for (int i = 0; i < 50; ++i) {
    const RequestSpec ra = a.Next(), rb = b.Next(), rc = c.Next();
    EXPECT_EQ(ra.token_ids, rb.token_ids);
    differs = differs || ra.token_ids != rc.token_ids;
    EXPECT_GE(ra.token_ids.size(), 5u);
    EXPECT_LE(ra.token_ids.size(), 9u);
    EXPECT_EQ(ra.max_tokens, 3);
    EXPECT_EQ(ra.cls, "main");
    for (int32_t id : ra.token_ids) {
      EXPECT_GE(id, 20);
      EXPECT_LE(id, 30);
    }
  }
  EXPECT_TRUE(differs);
}

class DatasetTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    path_ = (std::filesystem::temp_directory_path() /
             ("serve_bench_ds_" + std::to_string(getpid()) + ".jsonl"))
                .string();
    std::ofstream(path_) << text;
    return path_;
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::string path_;
};

TEST_F(DatasetTest, ReadsPromptsAndCyclesWithDefaultOutput) {
  auto e =
      LoadJsonlDataset(Write("{\"prompt\": \"hello\", \"max_tokens\": 4}\n\n"
                             "{\"prompt\": \"world\"}\n"));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->size(), 2u);
  DatasetSource src(*e, {7, 7}, 1, "main");
  const RequestSpec a = src.Next(), b = src.Next(), c = src.Next();
  EXPECT_EQ(a.text, "hello");
  EXPECT_EQ(a.max_tokens, 4);
  EXPECT_TRUE(a.token_ids.empty());
  EXPECT_EQ(b.text, "world");
  EXPECT_EQ(b.max_tokens, 7);
  EXPECT_EQ(c.text, "hello");
}

TEST_F(DatasetTest, RefusesMalformedLinesNamingTheLine) {
  for (const char* bad : {"{\"prompt\": \"a\"}\nnot json\n", "{\"text\": \"a\"}\n",
                          "{\"prompt\": \"a\", \"max_tokens\": -1}\n", "\n"}) {
    auto e = LoadJsonlDataset(Write(bad));
    EXPECT_FALSE(e.ok()) << bad;
  }
  auto e = LoadJsonlDataset(Write("{\"prompt\": \"a\"}\n[1]\n"));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("line 2"), std::string::npos) << e.status();
  EXPECT_FALSE(LoadJsonlDataset("/nonexistent/x.jsonl").ok());
}

}  // namespace
}  // namespace duet::bench
