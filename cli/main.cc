// duet: the command-line entry point. Reads `duet <command> [flags]` (command_line.h) and runs
// the mode of the command it names (commands.h).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/usage.h"
#include "cli/command_help.h"
#include "cli/command_line.h"
#include "cli/commands.h"
#include "cli/tls_flags.h"

int main(int argc, char** argv) {
  using duet::cli::CommandId;
  const std::string usage = duet::cli::DuetUsage();
  absl::SetProgramUsageMessage(usage);
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(usage.c_str(), argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (duet::cli::SpecsOfCommand(command).empty()) {
    std::fprintf(stderr, "duet: unknown command '%s'\n\n%s", command.c_str(), usage.c_str());
    return 2;
  }
  const duet::cli::ParsedCommandLine parsed =
      duet::cli::ParseCommandLineFor(command, std::vector<std::string>(argv + 2, argv + argc));
  if (!parsed.line) return parsed.exit_code;
  // gRPC's transport security, process-wide, before the mode makes any channel or server.
  if (parsed.line->spec->Takes("tls_ca_file")) {
    const absl::Status tls = duet::cli::InstallGrpcTlsFromFlags();
    if (!tls.ok()) {
      std::fprintf(stderr, "duet %s: %s\n", std::string(parsed.line->spec->name).c_str(),
                   std::string(tls.message()).c_str());
      return 2;
    }
  }
  switch (parsed.line->spec->id) {
    case CommandId::kGenerate:
      return duet::cli::RunGenerate();
    case CommandId::kGenerateServer:
      return duet::cli::RunGenerateRemote();
    case CommandId::kCoordinator:
      return duet::cli::RunCoordinator();
    case CommandId::kPrefill:
      return duet::cli::RunPrefill();
    case CommandId::kDecode:
      return duet::cli::RunDecode();
    case CommandId::kServeLoopback:
      return duet::cli::RunServeLoopback(*parsed.line);
    case CommandId::kServeColocated:
      return duet::cli::RunServeColocated();
    case CommandId::kBenchServe:
      return duet::cli::RunBenchServe(*parsed.line);
  }
  return 2;
}
