#include "cli/child_flags.h"

#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"

namespace duet::cli {

std::string FlagArg(absl::string_view name, absl::string_view value) {
  return absl::StrCat("--", name, "=", value);
}

std::vector<std::string> ForwardedFlags(const CommandSpec& child,
                                        const std::vector<std::string>& given) {
  std::vector<std::string> args;
  for (const std::string& name : given) {
    if (!child.Takes(name)) continue;
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag != nullptr) args.push_back(FlagArg(name, flag->CurrentValue()));
  }
  return args;
}

}  // namespace duet::cli
