#include "common/base/enum_names.h"

#include <optional>
#include <string>

#include "common/base/auto_option.h"
#include "gtest/gtest.h"

namespace duet {
namespace {

enum class Color { kRed, kGreen, kBlue, kUnnamed };

constexpr EnumNameEntry<Color> kColorNames[] = {{Color::kRed, "red"},
                                                {Color::kGreen, "green"},
                                                {Color::kBlue, "blue"},
                                                {Color::kRed, "crimson", kEnumAlias},
                                                {Color::kBlue, "navy", kEnumAlias}};

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(EnumNamesTest, ParsesCanonicalNamesAndAliases) {
  EXPECT_EQ(*ParseEnum(kColorNames, "red", "color"), Color::kRed);
  EXPECT_EQ(*ParseEnum(kColorNames, "green", "color"), Color::kGreen);
  EXPECT_EQ(*ParseEnum(kColorNames, "blue", "color"), Color::kBlue);
  EXPECT_EQ(*ParseEnum(kColorNames, "crimson", "color"), Color::kRed);
  EXPECT_EQ(*ParseEnum(kColorNames, "navy", "color"), Color::kBlue);
}

// The refusal lists the canonical names only, in table order; matching is exact.
TEST(EnumNamesTest, RefusesOthersListingCanonicalNames) {
  for (const char* bad : {"purple", "", "Red", "red ", "?"}) {
    absl::StatusOr<Color> c = ParseEnum(kColorNames, bad, "color");
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Msg(c.status()),
              std::string("unknown color '") + bad + "': valid values are red, green, blue");
  }
  EXPECT_EQ(Msg(ParseEnum(kColorNames, "tpu", "compute backend", "names").status()),
            "unknown compute backend 'tpu': valid names are red, green, blue");
}

TEST(EnumNamesTest, NamesAreCanonicalNeverAliases) {
  EXPECT_STREQ(EnumName(kColorNames, Color::kRed), "red");
  EXPECT_STREQ(EnumName(kColorNames, Color::kGreen), "green");
  EXPECT_STREQ(EnumName(kColorNames, Color::kBlue), "blue");
  EXPECT_STREQ(EnumName(kColorNames, Color::kUnnamed), "?");
  EXPECT_STREQ(EnumName(kColorNames, Color::kUnnamed, "unknown"), "unknown");
  static_assert(EnumName(kColorNames, Color::kBlue)[0] == 'b');
}

// Every canonical name parses back to its value.
TEST(EnumNamesTest, RoundTrips) {
  for (Color c : {Color::kRed, Color::kGreen, Color::kBlue}) {
    EXPECT_EQ(*ParseEnum(kColorNames, EnumName(kColorNames, c), "color"), c);
  }
}

// With ParseOrAuto and NameOrAuto, as the flags use them.
TEST(EnumNamesTest, ComposesWithAutoOption) {
  auto parse = [](absl::string_view name) { return ParseEnum(kColorNames, name, "color"); };
  auto name = [](Color c) { return EnumName(kColorNames, c); };
  EXPECT_EQ(*ParseOrAuto<Color>("auto", parse), std::nullopt);
  EXPECT_EQ(*ParseOrAuto<Color>("navy", parse), Color::kBlue);
  EXPECT_EQ(Msg(ParseOrAuto<Color>("teal", parse).status()),
            "unknown color 'teal': valid values are red, green, blue, or auto");
  EXPECT_EQ(NameOrAuto(std::optional<Color>(Color::kGreen), name), "green");
  EXPECT_EQ(NameOrAuto(std::optional<Color>(), name), "auto");
}

}  // namespace
}  // namespace duet
