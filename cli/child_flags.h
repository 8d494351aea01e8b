// What `duet serve --loopback` passes on to the processes it starts: of the flags given on its
// own command line, those the child's command takes (command_table.h), with the values this
// process parsed; never a hand-kept list. The launcher adds what is each child's own (address,
// coordinator, node id, address file, metrics port). A child's argv spells names as Abseil does
// (underscores): scripts read them from /proc/PID/cmdline ("--node_id=").
//
//   std::vector<std::string> a = ForwardedFlags(SpecOf(CommandId::kDecode), line.given);
//   // {"--model=/m", "--threads=2", "--max_running=8", ...}
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "cli/command_table.h"

namespace duet::cli {

// "--<name>=<value>" ("--node_id=decode-0").
std::string FlagArg(absl::string_view name, absl::string_view value);
// The flags named in `given` (Abseil names) that `child` takes, each as FlagArg(name, its
// current value), in the order given.
std::vector<std::string> ForwardedFlags(const CommandSpec& child,
                                        const std::vector<std::string>& given);

}  // namespace duet::cli
