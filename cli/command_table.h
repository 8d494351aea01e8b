// The commands of `duet` and the flag groups (flag_groups.h) each takes. A command with modes
// (`generate` / `generate --server`, `serve --loopback` / `serve --colocated`) has a spec per
// mode, picked by its selector flag; a flag no spec of the command takes is refused by name, and
// so is a flag of another mode of it.
//
//   const CommandSpec& s = SpecOf(CommandId::kDecode);
//   s.Takes("max_running");  // true
//   s.Takes("router");       // false: only the coordinator and serve --loopback take it
//   SpecsOfCommand("serve");  // serve --loopback, serve --colocated
#pragma once

#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/strings/string_view.h"
#include "cli/flag_groups.h"

namespace duet::cli {

enum class CommandId {
  kGenerate,
  kGenerateServer,
  kCoordinator,
  kPrefill,
  kDecode,
  kServeLoopback,
  kServeColocated,
  kBenchServe,
};

struct CommandSpec {
  CommandId id;
  absl::string_view command;     // "serve": what follows `duet`
  absl::string_view name;        // "serve --loopback": how messages and help name this mode
  absl::string_view selector;    // the flag that picks this mode ("loopback"); empty: the default
  absl::string_view mode_note;   // help's note on a flag only this mode takes: "with --loopback"
  absl::string_view subcommand;  // the one positional argument it needs ("serve"); empty: none
  absl::string_view usage;       // "duet decode --coordinator HOST:PORT --model DIR [flags]"
  absl::string_view summary;     // one line
  bool cluster_process = false;  // coordinator, prefill, decode, serve --loopback
  std::vector<FlagGroup> groups;
  std::vector<absl::string_view> except;  // flags of those groups this mode does not take

  // Whether this mode takes the flag named `flag` (as Abseil names it: "max_running").
  bool Takes(absl::string_view flag) const;
  // Its flags, group by group.
  std::vector<const absl::CommandLineFlag*> Flags() const;
};

// Every spec, commands in the order `duet --help` lists them.
const std::vector<CommandSpec>& AllCommandSpecs();
const CommandSpec& SpecOf(CommandId id);
// The specs (modes) of `command`; empty for a name that is no command.
std::vector<const CommandSpec*> SpecsOfCommand(absl::string_view command);
// "generate", "coordinator", "prefill", "decode", "serve", "bench".
std::vector<absl::string_view> CommandNames();

}  // namespace duet::cli
