// The `duet` commands, one function per mode (command_table.h); main.cc parses the command line
// (command_line.h) and calls the mode's. Each reads its flag groups and returns the exit code.
//
//   duet generate --model models/tiny --prompt "hello" --max-tokens 8 [--json]
#pragma once

#include "cli/command_line.h"

namespace duet::cli {

int RunGenerate();                              // generate_command.cc
int RunGenerateRemote();                        // generate --server: generate_remote.cc
int RunCoordinator();                           // node_commands.cc
int RunPrefill();                               // node_commands.cc
int RunDecode();                                // node_commands.cc
int RunServeLoopback(const CommandLine& line);  // serve_command.cc: hands `line.given` on
int RunServeColocated();                        // serve_colocated.cc
int RunBenchServe(const CommandLine& line);     // bench_command.cc: refuses --ignore-eos=false

}  // namespace duet::cli
