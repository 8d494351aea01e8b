// The `duet` command's subcommands. Each takes the positional arguments left after absl flag
// parsing (argv[0] is the subcommand name) and returns a process exit code.
//
//   duet generate --model models/tiny --prompt "hello" --max-tokens 8 [--json]
#pragma once

#include <vector>

namespace duet::cli {

int RunGenerate(const std::vector<char*>& args);

}  // namespace duet::cli
