#include "cli/command_help.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/command_table.h"
#include "cli/flag_groups.h"

namespace duet::cli {
namespace {

constexpr size_t kWidth = 100;

// `text` wrapped at kWidth, each line after `indent` spaces.
std::string Wrap(absl::string_view text, size_t indent) {
  std::string out;
  std::string line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && indent + line.size() + 1 + word.size() > kWidth) {
      absl::StrAppend(&out, std::string(indent, ' '), line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) absl::StrAppend(&out, std::string(indent, ' '), line, "\n");
  return out;
}

std::string DefaultOf(const absl::CommandLineFlag& f) {
  if (f.IsOfType<std::string>()) return absl::StrCat("\"", f.DefaultValue(), "\"");
  return f.DefaultValue();
}

}  // namespace

std::string DuetUsage() {
  std::string out =
      "duet: disaggregated LLM inference\n"
      "usage: duet <command> [flags]\n\n";
  for (const CommandSpec& s : AllCommandSpecs()) {
    absl::StrAppend(&out, "  ", s.usage, "\n", Wrap(s.summary, 6));
  }
  absl::StrAppend(&out,
                  "\nFlags are spelled with dashes (--max-tokens); underscores work too "
                  "(--max_tokens).\nRun `duet <command> --help` for the flags of a command.\n");
  return out;
}

std::string CommandHelp(absl::string_view command) {
  const std::vector<const CommandSpec*> specs = SpecsOfCommand(command);
  std::string out;
  for (const CommandSpec* s : specs) {
    absl::StrAppend(&out, out.empty() ? "usage: " : "       ", s->usage, "\n");
  }
  for (const CommandSpec* s : specs) {
    absl::StrAppend(
        &out,
        Wrap(absl::StrCat(specs.size() > 1 ? absl::StrCat(s->name, ": ") : "", s->summary), 2));
  }
  absl::StrAppend(&out, "\nflags (dashes or underscores alike: --max-tokens or --max_tokens):\n");
  // Each group some mode takes, in the order the modes list them, with the flags some mode takes.
  std::vector<FlagGroup> groups;
  for (const CommandSpec* s : specs) {
    for (FlagGroup g : s->groups) {
      if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
    }
  }
  for (FlagGroup g : groups) {
    const FlagGroupInfo& info = FlagGroupInfoOf(g);
    absl::StrAppend(&out, "\n", info.title, ":\n");
    for (const absl::CommandLineFlag* f : info.flags) {
      std::vector<absl::string_view> notes;
      for (const CommandSpec* s : specs) {
        if (s->Takes(f->Name())) notes.push_back(s->mode_note);
      }
      if (notes.empty()) continue;
      std::string line =
          absl::StrCat("  --", DashedFlagName(f->Name()), " (default ", DefaultOf(*f), ")");
      const bool selector = std::any_of(specs.begin(), specs.end(), [&](const CommandSpec* s) {
        return s->selector == f->Name();
      });
      if (notes.size() < specs.size() && !selector) {
        absl::StrAppend(&line, " [", absl::StrJoin(notes, " or "), " only]");
      }
      absl::StrAppend(&out, line, "\n", Wrap(f->Help(), 6));
    }
  }
  absl::StrAppend(&out,
                  "\nalso: --flagfile=FILE[,FILE] (flags one a line, '#' comments), --help\n");
  return out;
}

}  // namespace duet::cli
