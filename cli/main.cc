// duet: the command-line entry point. Thin dispatch to the subcommands in commands.h.
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "cli/commands.h"

namespace {

constexpr char kUsage[] =
    "duet: disaggregated LLM inference\n"
    "usage: duet <command> [flags]\n"
    "commands:\n"
    "  generate   run the model in this process: --model DIR (--prompt TEXT | --prompt-ids 1,2)\n"
    "             [--max-tokens N --temperature T --top-p P --top-k K --seed S --logprobs K\n"
    "              --json --device auto|cpu|cuda --threads N --weights_dtype f32|native|bf16\n"
    "              --cpu_isa auto|avx2|avx512_vnni|...]\n"
    "  coordinator  run the coordinator: --model DIR [--listen HOST:PORT --http-port P\n"
    "               --http-host H --api-key KEY --max-body-bytes N --max-concurrent-streams N]\n"
    "  prefill      run a prefill node: --coordinator ADDR --model DIR [--node_id ID\n"
    "               --transport shm|tcp --max_batch_tokens N --no_layer_pipelining]\n"
    "  decode       run a decode node: --coordinator ADDR --model DIR [--node_id ID\n"
    "               --transport shm|tcp --max_running N]\n"
    "  serve        --loopback [--prefill N --decode M] --model DIR [--port P]\n"
    "               [--transport shm|tcp]: the whole cluster on this machine\n"
    "  serve        --colocated --model DIR [--port P --max_batch_tokens N --max_running M]:\n"
    "               prefill and decode in one process, the same client API\n"
    "  generate --server ADDR ...: the same generate, served by a cluster\n"
    "  bench serve  --server ADDR (--request_rate R | --concurrency C) (--num_requests N |\n"
    "               --duration_s S) [--input_len A-B --output_len A-B --dataset FILE.jsonl\n"
    "               --slo_ttft_ms X --slo_tpot_ms Y --json_out FILE]: TTFT/TPOT load generator\n"
    "run `duet <command> --help` for every flag.\n";

// absl flags are spelled with underscores; accept the dashed spelling users expect
// (--max-tokens) by rewriting the name part of each "--flag[=value]" argument.
void NormalizeFlagNames(std::vector<char*>& args, std::vector<std::string>& storage) {
  storage.reserve(args.size());
  for (char*& arg : args) {
    std::string a = arg;
    if (a.size() < 3 || a.compare(0, 2, "--") != 0) continue;
    const size_t end = std::min(a.find('='), a.size());
    for (size_t i = 2; i < end; ++i) {
      if (a[i] == '-') a[i] = '_';
    }
    storage.push_back(std::move(a));
    arg = storage.back().data();
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  // Parse flags from everything after the subcommand name.
  std::vector<char*> rest(argv + 1, argv + argc);
  std::vector<std::string> storage;
  NormalizeFlagNames(rest, storage);
  std::vector<char*> args = absl::ParseCommandLine(static_cast<int>(rest.size()), rest.data());
  if (command == "generate") return duet::cli::RunGenerate(args);
  if (command == "coordinator") return duet::cli::RunCoordinator(args);
  if (command == "prefill") return duet::cli::RunPrefill(args);
  if (command == "decode") return duet::cli::RunDecode(args);
  if (command == "serve") return duet::cli::RunServe(args);
  if (command == "bench") return duet::cli::RunBench(args);
  std::fprintf(stderr, "duet: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return 2;
}
