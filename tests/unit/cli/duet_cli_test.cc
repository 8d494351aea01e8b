// The built `duet` binary's command line: `duet <command> --help` lists its own flags and no
// other command's; a flag of another command (or of another mode) is refused by name, exit 2;
// both spellings of a name parse. Nothing here loads a model or opens a socket.
#include <sys/wait.h>

#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#ifndef DUET_BIN
#error "DUET_BIN must point at the duet binary"
#endif

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

Result RunDuet(const std::vector<std::string>& args) {
  // A bound: an old duet would start serving instead of refusing a flag.
  std::string cmd = absl::StrCat("timeout 60 ", DUET_BIN);
  for (const std::string& a : args) absl::StrAppend(&cmd, " '", a, "'");
  absl::StrAppend(&cmd, " 2>&1 </dev/null");
  Result r;
  std::FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

struct HelpCase {
  std::vector<std::string> command;
  std::vector<std::string> own;      // flags it lists
  std::vector<std::string> foreign;  // flags of other commands it does not
};

void PrintTo(const HelpCase& c, std::ostream* os) { *os << absl::StrJoin(c.command, " "); }

class CommandHelpTest : public ::testing::TestWithParam<HelpCase> {};

TEST_P(CommandHelpTest, ListsItsOwnFlagsAndNoOtherCommands) {
  const HelpCase& c = GetParam();
  std::vector<std::string> args = c.command;
  args.push_back("--help");
  const Result r = RunDuet(args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat("usage: duet ", c.command[0])));
  EXPECT_THAT(r.output, Not(HasSubstr("No flags matched")));
  for (const std::string& f : c.own) {
    EXPECT_THAT(r.output, HasSubstr(absl::StrCat("\n  --", f, " (default "))) << f;
  }
  for (const std::string& f : c.foreign) {
    EXPECT_THAT(r.output, Not(HasSubstr(absl::StrCat("\n  --", f, " ")))) << f;
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryCommand, CommandHelpTest,
    ::testing::Values(
        HelpCase{{"generate"},
                 {"model", "prompt", "prompt-ids", "max-tokens", "seed", "device", "chat", "server",
                  "timeout-s"},
                 {"router", "transport", "http-port", "loopback", "request-rate", "listen"}},
        HelpCase{{"coordinator"},
                 {"model", "listen", "router", "heartbeat-timeout-ms", "http-port", "api-key"},
                 {"transport", "max-running", "device", "prompt", "loopback", "request-rate"}},
        HelpCase{{"prefill"},
                 {"model", "coordinator", "node-id", "transport", "max-batch-tokens",
                  "no-layer-pipelining", "metrics-port", "device"},
                 {"router", "max-running", "http-port", "prompt", "loopback", "request-rate"}},
        HelpCase{{"decode"},
                 {"model", "coordinator", "node-id", "transport", "max-running",
                  "kv-quarantine-bound", "metrics-port", "device"},
                 {"router", "max-batch-tokens", "http-port", "prompt", "loopback", "request-rate"}},
        HelpCase{{"serve"},
                 {"loopback", "colocated", "prefill", "decode", "port", "model", "transport",
                  "router", "http-port", "max-running", "max-batch-tokens", "metrics-port"},
                 {"listen", "coordinator", "node-id", "prompt", "request-rate", "server"}},
        HelpCase{
            {"bench", "serve"},
            {"server", "request-rate", "num-requests", "workload", "seed", "api-key", "timeout-s"},
            {"model", "router", "transport", "prompt", "listen", "http-port"}}),
    [](const ::testing::TestParamInfo<HelpCase>& info) {
      return absl::StrJoin(info.param.command, "_");
    });

TEST(DuetCliTest, DecodeRefusesTheRoutersFlagByName) {
  const Result r = RunDuet({"decode", "--router=load"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("duet decode: --router applies to coordinator"));
}

TEST(DuetCliTest, AForeignFlagIsRefusedInEitherSpelling) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"decode", "--max-batch-tokens=8"},
                                             {"prefill", "--max_running", "8"},
                                             {"coordinator", "--transport=tcp"},
                                             {"generate", "--http-port=1"},
                                             {"bench", "serve", "--model=m"},
                                             {"generate", "--server=h:1", "--chat"},
                                             {"serve", "--colocated", "--no-layer-pipelining"},
                                             {"serve", "--loopback", "--metrics-port=9"}}) {
    const Result r = RunDuet(args);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(args, " ") << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr(" applies to ")) << absl::StrJoin(args, " ");
  }
}

TEST(DuetCliTest, BothSpellingsParse) {
  // Parsed, then refused for the missing --model: no flag is unknown.
  for (const char* tokens : {"--max-tokens=3", "--max_tokens=3"}) {
    const Result r = RunDuet({"generate", tokens, "--prompt-ids", "1,2"});
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_THAT(r.output, HasSubstr("--model is required"));
  }
}

TEST(DuetCliTest, ModesExcludeEachOtherAndServeNeedsOne) {
  Result r = RunDuet({"serve", "--loopback", "--colocated"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--loopback and --colocated exclude each other"));
  r = RunDuet({"serve", "--model=m"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("give --loopback"));
}

// An option value outside its enum is refused where the flags are read, naming the flag, before
// any model loads or process starts.
TEST(DuetCliTest, ABadOptionValueIsRefusedNamingTheFlag) {
  Result r = RunDuet({"generate", "--model=/nonexistent", "--prompt-ids=1", "--device=tpu"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--device: unknown compute backend 'tpu'"));
  r = RunDuet({"serve", "--loopback", "--model=/nonexistent", "--kv-dtype=int4"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--kv-dtype: unknown kv_dtype 'int4'"));
  r = RunDuet({"serve", "--colocated", "--model=/nonexistent", "--weights-dtype=int3"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--weights-dtype: unknown weights_dtype 'int3'"));
  r = RunDuet({"decode", "--model=/nonexistent", "--transfer-write-mode=telepathy"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--transfer-write-mode: unknown write_mode 'telepathy'"));
  r = RunDuet({"prefill", "--model=/nonexistent", "--transport=carrier-pigeon"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--transport: unknown transport 'carrier-pigeon'"));
  r = RunDuet({"serve", "--loopback", "--model=/nonexistent", "--transport=inproc"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--transport=inproc connects nodes inside one process only"));
  r = RunDuet({"coordinator", "--model=/nonexistent", "--router=fastest"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--router: unknown router 'fastest'"));
}

TEST(DuetCliTest, AnUnknownFlagIsStillAnError) {
  const Result r = RunDuet({"decode", "--no-such-flag=1"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("no_such_flag"));
}

}  // namespace
