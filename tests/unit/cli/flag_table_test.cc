// The flag table (cli/flag_groups.h, cli/command_table.h) in this process: every duet flag in
// exactly one group, every command's groups and exceptions real, the help of each command
// listing exactly its flags, a foreign flag refused by name, the argument scan, and the flags
// `serve --loopback` hands its children parsing back to the same values.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/child_flags.h"
#include "cli/command_help.h"
#include "cli/command_line.h"
#include "cli/command_table.h"
#include "cli/flag_groups.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace duet::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Abseil's own flags (--flagfile is expanded by the scan; the others go to Abseil).
bool IsAbseils(absl::string_view name) {
  return name == "flagfile" || name == "fromenv" || name == "tryfromenv" || name == "undefok";
}

std::vector<std::string> FlagNames(const CommandSpec& spec) {
  std::vector<std::string> names;
  for (const absl::CommandLineFlag* f : spec.Flags()) names.emplace_back(f->Name());
  return names;
}

TEST(FlagTableTest, EveryFlagBelongsToExactlyOneGroup) {
  std::map<std::string, int> groups_of;
  for (const FlagGroupInfo& g : AllFlagGroups()) {
    EXPECT_FALSE(g.flags.empty()) << g.name;
    for (const absl::CommandLineFlag* f : g.flags) ++groups_of[std::string(f->Name())];
  }
  int flags = 0;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsAbseils(name)) continue;
    ++flags;
    EXPECT_EQ(groups_of[std::string(name)], 1)
        << "--" << name << " (" << flag->Filename() << ") is in that many groups";
  }
  EXPECT_EQ(flags, static_cast<int>(groups_of.size()));
  EXPECT_GT(flags, 90);
}

TEST(FlagTableTest, EveryCommandIdHasOneSpecAndItsGroupsAndExceptionsExist) {
  for (CommandId id : {CommandId::kGenerate, CommandId::kGenerateServer, CommandId::kCoordinator,
                       CommandId::kPrefill, CommandId::kDecode, CommandId::kServeLoopback,
                       CommandId::kServeColocated, CommandId::kBenchServe}) {
    EXPECT_EQ(std::count_if(AllCommandSpecs().begin(), AllCommandSpecs().end(),
                            [&](const CommandSpec& s) { return s.id == id; }),
              1);
  }
  std::set<FlagGroup> taken;
  for (const CommandSpec& s : AllCommandSpecs()) {
    EXPECT_FALSE(s.groups.empty()) << s.name;
    for (FlagGroup g : s.groups) {
      EXPECT_EQ(FlagGroupInfoOf(g).group, g) << s.name;
      taken.insert(g);
    }
    for (absl::string_view e : s.except) {
      const std::optional<FlagGroup> g = GroupOfFlag(e);
      ASSERT_TRUE(g.has_value()) << s.name << " excepts " << e << ", no flag";
      EXPECT_NE(std::find(s.groups.begin(), s.groups.end(), *g), s.groups.end())
          << s.name << " excepts " << e << " of a group it does not take";
    }
    if (!s.selector.empty()) {
      EXPECT_TRUE(s.Takes(s.selector)) << s.name;
    }
  }
  EXPECT_EQ(taken.size(), AllFlagGroups().size()) << "a group no command takes";
}

TEST(FlagTableTest, EachCommandsHelpListsExactlyItsFlags) {
  for (absl::string_view command : CommandNames()) {
    const std::string help = CommandHelp(command);
    EXPECT_THAT(help, Not(HasSubstr("No flags matched")));
    const std::vector<const CommandSpec*> specs = SpecsOfCommand(command);
    for (const auto& [name, flag] : absl::GetAllFlags()) {
      if (IsAbseils(name)) continue;
      const bool takes = std::any_of(specs.begin(), specs.end(),
                                     [&](const CommandSpec* s) { return s->Takes(name); });
      const std::string line = absl::StrCat("\n  --", DashedFlagName(name), " (default ");
      EXPECT_EQ(absl::StrContains(help, line), takes) << command << " --" << name;
    }
  }
}

TEST(FlagTableTest, DecodeRefusesTheRouterNamingItAndWhoTakesIt) {
  const absl::Status st =
      CheckFlagsTaken({&SpecOf(CommandId::kDecode)}, "decode", {{"--router", "router"}});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("--router applies to coordinator and serve --loopback"));
  EXPECT_THAT(st.message(), HasSubstr("not to decode"));
  EXPECT_TRUE(CheckFlagsTaken({&SpecOf(CommandId::kDecode)}, "decode",
                              {{"--max-running", "max_running"}, {"--model", "model"}})
                  .ok());
}

TEST(FlagTableTest, EachCommandRefusesEachFlagItDoesNotTake) {
  for (const CommandSpec& s : AllCommandSpecs()) {
    for (const auto& [name, flag] : absl::GetAllFlags()) {
      if (IsAbseils(name)) continue;
      const absl::Status st = CheckFlagsTaken({&s}, s.name, {{"--x-spelled", std::string(name)}});
      EXPECT_EQ(st.ok(), s.Takes(name)) << s.name << " --" << name;
      if (!st.ok()) {
        EXPECT_THAT(st.message(), HasSubstr("--x-spelled applies to "));
      }
    }
  }
}

TEST(FlagTableTest, ServeColocatedRefusesTheClustersFlagsAsSuch) {
  const std::vector<const CommandSpec*> serve = SpecsOfCommand("serve");
  for (const char* name : {"listen", "coordinator", "node_id", "address_file"}) {
    const absl::Status st = CheckFlagsTaken(serve, "serve", {{absl::StrCat("--", name), name}});
    EXPECT_THAT(st.message(), HasSubstr(absl::StrCat("--", name, " applies to the cluster")));
  }
  for (const char* name :
       {"transport", "kv_staging", "prefill", "decode", "ready_timeout_s", "no_restart", "router",
        "heartbeat_timeout_ms", "no_layer_pipelining", "kv_quarantine_bound"}) {
    EXPECT_TRUE(CheckFlagsTaken(serve, "serve", {{"--f", name}}).ok()) << name;
    const absl::Status st = CheckFlagsTaken({&SpecOf(CommandId::kServeColocated)},
                                            "serve --colocated", {{"--f", name}});
    EXPECT_THAT(st.message(), HasSubstr("--f applies to the cluster's processes")) << name;
  }
  // A flag of generate is not a flag of the cluster.
  const absl::Status st = CheckFlagsTaken(serve, "serve", {{"--prompt", "prompt"}});
  EXPECT_THAT(st.message(), HasSubstr("--prompt applies to generate, not to serve"));
}

TEST(ScanArgsTest, NamesInEitherSpellingValuesAsGiven) {
  auto s = ScanArgs({"--max-tokens=3", "--prompt", "--not-a-flag", "-kv-cache-bytes", "7",
                     "--nochat", "--json", "pos-itional", "--", "--top-k=2"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->args, (std::vector<std::string>{"--max_tokens=3", "--prompt", "--not-a-flag",
                                               "-kv_cache_bytes", "7", "--nochat", "--json",
                                               "pos-itional", "--", "--top-k=2"}));
  std::vector<std::string> names, spelled;
  for (const GivenFlag& f : s->flags) {
    names.push_back(f.name);
    spelled.push_back(f.spelled);
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"max_tokens", "prompt", "kv_cache_bytes", "chat", "json"}));
  EXPECT_EQ(spelled, (std::vector<std::string>{"--max-tokens", "--prompt", "-kv-cache-bytes",
                                               "--nochat", "--json"}));
  EXPECT_FALSE(s->help);
}

TEST(ScanArgsTest, HelpAndAbseilsOtherUsageFlags) {
  for (const char* h : {"--help", "-h", "--helpfull", "--helpshort"}) {
    auto s = ScanArgs({"--model=m", h});
    ASSERT_TRUE(s.ok()) << h;
    EXPECT_TRUE(s->help) << h;
  }
  for (const char* refused : {"--helpmatch=x", "--version", "--helppackage"}) {
    auto s = ScanArgs({refused});
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << refused;
  }
}

TEST(ScanArgsTest, FlagfilesAreExpandedInPlace) {
  const std::string path = ::testing::TempDir() + "/cli_flagfile";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("# a comment\n  --max-running=8  \n\n--router=load\n", f);
    std::fclose(f);
  }
  auto s = ScanArgs({"--model=m", "--flagfile", path, "--threads=2"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->args, (std::vector<std::string>{"--model=m", "--max_running=8", "--router=load",
                                               "--threads=2"}));
  ASSERT_EQ(s->flags.size(), 4u);
  EXPECT_EQ(s->flags[2].name, "router");
  // So a foreign flag in a flagfile is refused like any other.
  EXPECT_FALSE(CheckFlagsTaken({&SpecOf(CommandId::kDecode)}, "decode", s->flags).ok());
  EXPECT_FALSE(ScanArgs({"--flagfile=/nonexistent/flags"}).ok());
}

// Puts back, when it goes, the values the named flags had when it came (absl::FlagSaver does
// that for every flag, logging each).
class ScopedFlagValues {
 public:
  explicit ScopedFlagValues(const std::vector<std::string>& names) {
    for (const std::string& n : names) {
      saved_.emplace_back(absl::FindCommandLineFlag(n),
                          absl::FindCommandLineFlag(n)->CurrentValue());
    }
  }
  ~ScopedFlagValues() {
    std::string error;
    for (auto& [flag, value] : saved_) flag->ParseFrom(value, &error);
  }

 private:
  std::vector<std::pair<absl::CommandLineFlag*, std::string>> saved_;
};

// A value other than the default for a flag of any type.
std::string OtherValue(const absl::CommandLineFlag& f) {
  if (f.IsOfType<bool>()) return f.DefaultValue() == "true" ? "false" : "true";
  if (f.IsOfType<std::string>()) return "value with spaces, = and --dashes";
  if (f.IsOfType<absl::Duration>()) return "1.5s";
  if (f.IsOfType<double>()) return "0.375";
  // The CORS flags' JSON lists.
  if (absl::StartsWith(f.DefaultValue(), "[")) return R"(["https://a.example","with, = spaces"])";
  return f.DefaultValue() == "7" ? "8" : "7";
}

// serve --loopback takes every flag its children take but those it gives each child itself.
TEST(ChildFlagsTest, ServeLoopbackTakesEveryFlagOfItsChildrenButTheirOwn) {
  const CommandSpec& serve = SpecOf(CommandId::kServeLoopback);
  // Its children find each other by address: membership on etcd is not theirs.
  const std::set<std::string> own = {"listen",         "address_file",     "coordinator",
                                     "node_id",        "metrics_port",     "etcd_endpoints",
                                     "etcd_prefix",    "etcd_lease_ttl_s", "etcd_ca_file",
                                     "etcd_cert_file", "etcd_key_file"};
  for (CommandId child : {CommandId::kCoordinator, CommandId::kPrefill, CommandId::kDecode}) {
    for (const std::string& name : FlagNames(SpecOf(child))) {
      EXPECT_EQ(serve.Takes(name), !own.contains(name)) << name;
    }
  }
}

TEST(ChildFlagsTest, ForwardedFlagsParseBackToTheSameValues) {
  const CommandSpec& serve = SpecOf(CommandId::kServeLoopback);
  for (CommandId id : {CommandId::kCoordinator, CommandId::kPrefill, CommandId::kDecode}) {
    const CommandSpec& child = SpecOf(id);
    std::vector<std::string> given;
    std::map<std::string, std::string> expected;
    std::vector<std::string> argv;
    {
      ScopedFlagValues saver(FlagNames(serve));  // back to their defaults at the scope's end
      for (const std::string& name : FlagNames(serve)) {
        absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
        std::string error;
        ASSERT_TRUE(f->ParseFrom(OtherValue(*f), &error)) << name << ": " << error;
        given.push_back(name);
        if (child.Takes(name)) expected[name] = f->CurrentValue();
      }
      argv = ForwardedFlags(child, given);
    }
    EXPECT_EQ(argv.size(), expected.size()) << child.name;
    ScopedFlagValues saver(FlagNames(serve));
    auto scanned = ScanArgs(argv);
    ASSERT_TRUE(scanned.ok()) << scanned.status();
    EXPECT_TRUE(CheckFlagsTaken({&child}, child.name, scanned->flags).ok()) << child.name;
    ASSERT_EQ(scanned->flags.size(), argv.size());
    for (size_t i = 0; i < argv.size(); ++i) {
      const std::string& name = scanned->flags[i].name;
      absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
      ASSERT_NE(f, nullptr);
      EXPECT_EQ(f->CurrentValue(), f->DefaultValue()) << name << " is not back to its default";
      const std::string& arg = scanned->args[i];
      std::string error;
      ASSERT_TRUE(f->ParseFrom(arg.substr(arg.find('=') + 1), &error)) << arg << ": " << error;
      EXPECT_EQ(f->CurrentValue(), expected[name]) << child.name << ": " << arg;
    }
  }
}

}  // namespace
}  // namespace duet::cli
