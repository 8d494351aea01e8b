// The `duet` command's subcommands. Each takes the positional arguments left after absl flag
// parsing (argv[0] is the subcommand name) and returns a process exit code.
//
//   duet generate --model models/tiny --prompt "hello" --max-tokens 8 [--json]
#pragma once

#include <vector>

namespace duet::cli {

int RunGenerate(const std::vector<char*>& args);
// generate --server: the cluster client (generate_remote.cc).
bool GenerateUsesServer();
int RunGenerateRemote();
int RunCoordinator(const std::vector<char*>& args);
int RunPrefill(const std::vector<char*>& args);
int RunDecode(const std::vector<char*>& args);
int RunServe(const std::vector<char*>& args);
// bench serve: the serving load generator (bench_command.cc).
int RunBench(const std::vector<char*>& args);
// serve --colocated: prefill and decode in this process (serve_colocated.cc).
bool ServeColocated();
int RunServeColocated(const std::vector<char*>& args);

}  // namespace duet::cli
