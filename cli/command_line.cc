#include "cli/command_line.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/command_help.h"

namespace duet::cli {
namespace {

constexpr absl::string_view kHelpNames[] = {"help", "h", "helpshort", "helpfull"};
// Abseil's other usage flags would print or check every flag of the binary, not the command's.
constexpr absl::string_view kRefusedUsageNames[] = {"helppackage", "helpon", "helpmatch", "version",
                                                    "only_check_args"};
constexpr int kMaxFlagfileDepth = 8;

bool In(absl::string_view name, const auto& names) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

std::string Underscored(absl::string_view name) {
  std::string s(name);
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

// The lines of a flagfile as Abseil reads them: one argument a line, whitespace trimmed, blank
// lines and '#' comments skipped; anything else must be a flag.
absl::StatusOr<std::vector<std::string>> ReadFlagfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--flagfile: cannot read ", path));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    const absl::string_view l = absl::StripAsciiWhitespace(line);
    if (l.empty() || l[0] == '#') continue;
    if (l[0] != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("--flagfile ", path, ": '", l, "' is not a flag (one flag a line)"));
    }
    lines.emplace_back(l);
  }
  return lines;
}

class Scanner {
 public:
  absl::Status Scan(const std::vector<std::string>& in, int depth) {
    for (size_t i = 0; i < in.size(); ++i) {
      const std::string& arg = in[i];
      if (after_flags_ || arg.size() < 2 || arg[0] != '-') {
        out_.args.push_back(arg);
        continue;
      }
      const size_t dashes = arg[1] == '-' ? 2 : 1;
      if (arg.size() == dashes) {  // "--": the rest is positional
        after_flags_ = true;
        out_.args.push_back(arg);
        continue;
      }
      const size_t eq = arg.find('=');
      bool has_value = eq != std::string::npos;
      const std::string spelled = arg.substr(0, eq);
      const std::string name = Underscored(absl::string_view(spelled).substr(dashes));
      std::string value = has_value ? arg.substr(eq + 1) : "";
      if (In(name, kHelpNames)) {
        if (has_value) return absl::InvalidArgumentError(spelled + " takes no value");
        out_.help = true;
        continue;
      }
      if (In(name, kRefusedUsageNames)) {
        return absl::InvalidArgumentError(
            absl::StrCat(spelled, " is not implemented by duet; --help lists the command's flags"));
      }
      // A list-valued flag of Abseil's own: its value is here or in the next argument.
      const bool abseil_list =
          name == "flagfile" || name == "fromenv" || name == "tryfromenv" || name == "undefok";
      if (abseil_list && !has_value) {
        if (i + 1 == in.size()) return absl::InvalidArgumentError(spelled + " needs a value");
        value = in[++i];
        has_value = true;
      }
      if (name == "flagfile") {
        if (depth >= kMaxFlagfileDepth) {
          return absl::InvalidArgumentError("--flagfile: nested too deep (a loop?)");
        }
        for (absl::string_view path : absl::StrSplit(value, ',', absl::SkipEmpty())) {
          auto lines = ReadFlagfile(std::string(path));
          if (!lines.ok()) return lines.status();
          if (absl::Status st = Scan(*lines, depth + 1); !st.ok()) return st;
        }
        continue;
      }
      if (name == "fromenv" || name == "tryfromenv") {
        // Abseil sets each named flag from the environment's FLAGS_<name>: they are given too.
        std::vector<std::string> names;
        for (absl::string_view n : absl::StrSplit(value, ',', absl::SkipEmpty())) {
          names.push_back(Underscored(n));
          if (absl::FindCommandLineFlag(names.back()) != nullptr) {
            out_.flags.push_back({absl::StrCat("--", n, " (", spelled, ")"), names.back()});
          }
        }
        out_.args.push_back(
            absl::StrCat(std::string(dashes, '-'), name, "=", absl::StrJoin(names, ",")));
        continue;
      }
      out_.args.push_back(
          absl::StrCat(std::string(dashes, '-'), name, has_value ? "=" : "", value));
      if (abseil_list) continue;  // --undefok
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
      bool negated = false;
      if (flag == nullptr && absl::StartsWith(name, "no")) {
        flag = absl::FindCommandLineFlag(name.substr(2));
        negated = flag != nullptr;
      }
      if (flag == nullptr) continue;  // unknown: Abseil's parse refuses it by name
      // "--name value": the next argument is the value, kept as it is.
      if (!negated && !has_value && !flag->IsOfType<bool>() && i + 1 < in.size()) {
        out_.args.push_back(in[++i]);
      }
      out_.flags.push_back({spelled, std::string(flag->Name())});
    }
    return absl::OkStatus();
  }

  ScannedArgs Take() { return std::move(out_); }

 private:
  ScannedArgs out_;
  bool after_flags_ = false;
};

// "coordinator and serve --loopback": the specs that take `flag`, a command named once when all
// of its modes do.
std::string Owners(absl::string_view flag, bool* all_cluster) {
  std::vector<std::string> owners;
  *all_cluster = true;
  for (absl::string_view command : CommandNames()) {
    const std::vector<const CommandSpec*> specs = SpecsOfCommand(command);
    std::vector<const CommandSpec*> taking;
    for (const CommandSpec* s : specs) {
      if (s->Takes(flag)) taking.push_back(s);
    }
    for (const CommandSpec* s : taking) *all_cluster = *all_cluster && s->cluster_process;
    if (taking.empty()) continue;
    if (taking.size() == specs.size() && specs.size() > 1) {
      owners.emplace_back(command);
    } else {
      for (const CommandSpec* s : taking) {
        // The default mode of a command with modes: "generate without --server".
        owners.push_back(s->selector.empty() && specs.size() > 1
                             ? absl::StrCat(s->command, " ", s->mode_note)
                             : std::string(s->name));
      }
    }
  }
  if (owners.empty()) *all_cluster = false;
  if (owners.size() <= 1) return absl::StrJoin(owners, "");
  return absl::StrCat(absl::StrJoin(owners.begin(), owners.end() - 1, ", "), " and ",
                      owners.back());
}

}  // namespace

absl::StatusOr<ScannedArgs> ScanArgs(const std::vector<std::string>& args) {
  Scanner scanner;
  if (absl::Status st = scanner.Scan(args, 0); !st.ok()) return st;
  return scanner.Take();
}

absl::Status CheckFlagsTaken(const std::vector<const CommandSpec*>& specs, absl::string_view who,
                             const std::vector<GivenFlag>& flags) {
  bool refuser_in_cluster = true;
  for (const CommandSpec* s : specs) refuser_in_cluster = refuser_in_cluster && s->cluster_process;
  for (const GivenFlag& f : flags) {
    if (std::any_of(specs.begin(), specs.end(),
                    [&](const CommandSpec* s) { return s->Takes(f.name); })) {
      continue;
    }
    bool all_cluster = false;
    const std::string owners = Owners(f.name, &all_cluster);
    if (owners.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.spelled, " is a flag of no duet command, not of ", who));
    }
    // To a process outside the cluster (generate, serve --colocated, bench), a flag of the
    // cluster's processes is that.
    const std::string where = all_cluster && !refuser_in_cluster
                                  ? absl::StrCat("the cluster's processes (", owners, ")")
                                  : owners;
    return absl::InvalidArgumentError(absl::StrCat(f.spelled, " applies to ", where, ", not to ",
                                                   who, " (see `duet ", specs.front()->command,
                                                   " --help`)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<const CommandSpec*> SelectSpec(absl::string_view command) {
  const std::vector<const CommandSpec*> specs = SpecsOfCommand(command);
  const CommandSpec* fallback = nullptr;
  std::vector<const CommandSpec*> selected;
  std::vector<std::string> selectors;
  for (const CommandSpec* s : specs) {
    if (s->selector.empty()) {
      fallback = s;
      continue;
    }
    const absl::CommandLineFlag* f = absl::FindCommandLineFlag(s->selector);
    selectors.push_back(absl::StrCat("--", DashedFlagName(s->selector), " (", s->summary, ")"));
    if (f != nullptr && f->CurrentValue() != f->DefaultValue()) selected.push_back(s);
  }
  if (selected.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("--", DashedFlagName(selected[0]->selector),
                                                   " and --", DashedFlagName(selected[1]->selector),
                                                   " exclude each other"));
  }
  if (selected.size() == 1) return selected[0];
  if (fallback != nullptr) return fallback;
  return absl::InvalidArgumentError(absl::StrCat("give ", absl::StrJoin(selectors, " or ")));
}

ParsedCommandLine ParseCommandLineFor(absl::string_view command,
                                      const std::vector<std::string>& args) {
  const std::vector<const CommandSpec*> specs = SpecsOfCommand(command);
  auto refuse = [&](absl::string_view who, const absl::Status& st) {
    std::fprintf(stderr, "duet %s: %s\n", std::string(who).c_str(),
                 std::string(st.message()).c_str());
    return ParsedCommandLine{.exit_code = 2};
  };
  absl::StatusOr<ScannedArgs> scanned = ScanArgs(args);
  if (!scanned.ok()) return refuse(command, scanned.status());
  if (scanned->help) {
    std::fputs(CommandHelp(command).c_str(), stdout);
    return ParsedCommandLine{.exit_code = 0};
  }
  if (absl::Status st = CheckFlagsTaken(specs, command, scanned->flags); !st.ok()) {
    return refuse(command, st);
  }

  std::vector<std::string> storage = {"duet"};
  storage.insert(storage.end(), scanned->args.begin(), scanned->args.end());
  std::vector<char*> argv;
  for (std::string& s : storage) argv.push_back(s.data());
  const std::vector<char*> rest =
      absl::ParseCommandLine(static_cast<int>(argv.size()), argv.data());
  const std::vector<std::string> positional(rest.begin() + 1, rest.end());

  absl::StatusOr<const CommandSpec*> spec = SelectSpec(command);
  if (!spec.ok()) return refuse(command, spec.status());
  const CommandSpec& s = **spec;
  if (!s.subcommand.empty() && (positional.size() != 1 || positional[0] != s.subcommand)) {
    return refuse(command, absl::InvalidArgumentError(absl::StrCat("usage: ", s.usage)));
  }
  if (s.subcommand.empty() && !positional.empty()) {
    return refuse(command, absl::InvalidArgumentError(
                               absl::StrCat("unexpected argument '", positional[0], "'")));
  }
  if (absl::Status st = CheckFlagsTaken({&s}, s.name, scanned->flags); !st.ok()) {
    return refuse(s.name, st);
  }
  CommandLine line{.spec = &s};
  for (const GivenFlag& f : scanned->flags) {
    if (std::find(line.given.begin(), line.given.end(), f.name) == line.given.end()) {
      line.given.push_back(f.name);
    }
  }
  return ParsedCommandLine{.line = std::move(line)};
}

}  // namespace duet::cli
