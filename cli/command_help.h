// The help of `duet` (every command's usage) and of `duet <command> --help`: the command's
// usage and exactly its flags, group by group, with their defaults, spelled with dashes; a flag
// only one mode takes says so ("with --loopback only").
//
//   std::fputs(DuetUsage().c_str(), stdout);
//   std::fputs(CommandHelp("decode").c_str(), stdout);
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace duet::cli {

std::string DuetUsage();
// `command` must be one of CommandNames().
std::string CommandHelp(absl::string_view command);

}  // namespace duet::cli
