// How `duet <command>` reads its command line (Abseil flags underneath):
//   * a flag's name in either spelling: --max-running or --max_running (help and docs: dashes);
//   * --flagfile=FILE[,FILE] expanded in place (one flag a line, '#' comments), so that its
//     flags are checked like the others;
//   * --help (-h, --helpshort, --helpfull) prints the command's usage and exactly its flags;
//   * a flag the command does not take (of another command, or of another mode of it) is refused
//     by name, exit 2 -- never parsed and ignored;
//   * the mode (generate --server, serve --loopback / --colocated) is picked by its selector.
//
//   ParsedCommandLine p = ParseCommandLineFor("decode", {"--model=m", "--router=load"});
//   // p.line == nullopt, p.exit_code == 2, stderr: "duet decode: --router applies to ..."
//   ParsedCommandLine q = ParseCommandLineFor("serve", {"--loopback", "--model=m"});
//   // q.line->spec->id == CommandId::kServeLoopback, q.line->given == {"loopback", "model"}
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cli/command_table.h"

namespace duet::cli {

struct GivenFlag {
  std::string spelled;  // its name as given: "--kv-staging", "-router", "--nochat"
  std::string name;     // the flag's name: "kv_staging"
};

struct ScannedArgs {
  std::vector<std::string> args;  // for Abseil: names with underscores, --flagfile expanded
  std::vector<GivenFlag> flags;   // the flags given, in order (and those --fromenv names)
  bool help = false;
};

// Reads `args` (what follows the command) the way Abseil's parser will: "--name=value",
// "--name value" (not for a bool), "--noname" (a bool), "--" ends the flags. INVALID_ARGUMENT
// for an unreadable --flagfile or one of Abseil's help variants duet does not implement.
absl::StatusOr<ScannedArgs> ScanArgs(const std::vector<std::string>& args);

// OK when one of `specs` takes each of `flags`; else INVALID_ARGUMENT naming the first other
// flag as it was given and the commands that take it: "--router applies to coordinator and
// serve --loopback, not to decode". `who` names the command or mode refusing it.
absl::Status CheckFlagsTaken(const std::vector<const CommandSpec*>& specs, absl::string_view who,
                             const std::vector<GivenFlag>& flags);

// The mode of `command` that the parsed flags select (its selector set, else the spec that has
// none); INVALID_ARGUMENT when two are set or none is and the command has no default.
absl::StatusOr<const CommandSpec*> SelectSpec(absl::string_view command);

struct CommandLine {
  const CommandSpec* spec = nullptr;
  std::vector<std::string> given;  // the flags given (Abseil names), in order, each once
};

struct ParsedCommandLine {
  std::optional<CommandLine> line;  // nullopt: exit with exit_code (help printed, or refused)
  int exit_code = 0;
};

// Everything above for `duet <command> args...`, then Abseil's parse (which exits 1 on a value
// it cannot read or an unknown flag). `command` must be one of CommandNames().
ParsedCommandLine ParseCommandLineFor(absl::string_view command,
                                      const std::vector<std::string>& args);

}  // namespace duet::cli
