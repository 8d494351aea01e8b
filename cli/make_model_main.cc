// duet-make-model: writes a random-weight model in Hugging Face layout from a preset and a seed.
//
//   duet-make-model --preset tiny --seed 1 --out /tmp/tiny
//   duet-make-model --preset smollm2-135m --seed 7 --out /tmp/smol --dtype bf16
//   duet-make-model --preset llama3-8b --seed 1 --out /tmp/l3 --config_only
//
// Exit status: 0 written, 1 failed while writing, 2 bad flags.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/model/synthetic_model.h"

ABSL_FLAG(std::string, preset, "", "model preset: tiny, smollm2-135m, llama3-8b");
ABSL_FLAG(uint64_t, seed, 0, "seed of the random weights");
ABSL_FLAG(std::string, out, "", "output directory (created if missing)");
ABSL_FLAG(std::string, dtype, "f32", "weight dtype: f32, bf16 or f16");
ABSL_FLAG(int32_t, num_layers, 0, "override num_hidden_layers (0 = the preset's)");
ABSL_FLAG(int32_t, num_shards, 1, "write N shards plus model.safetensors.index.json");
ABSL_FLAG(bool, config_only, false, "write config.json and tokenizer_config.json only");

namespace {

// The Debian Abseil's ParseCommandLine exits with status 1 on a bad flag; this tool promises 2
// for every usage error, so an exit during parsing is turned into 2.
// A --help* request is not an error: it exits 0.
std::atomic<bool> g_parsing{false};
std::atomic<bool> g_help{false};
void ExitTwoIfParsing() {
  if (g_parsing.load()) {
    std::fflush(stdout);
    _exit(g_help.load() ? 0 : 2);
  }
}

int UsageError(const std::string& msg) {
  std::fprintf(stderr, "duet-make-model: %s\nusage: %s\n", msg.c_str(),
               std::string(absl::ProgramUsageMessage()).c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "duet-make-model --preset NAME --seed N --out DIR [--dtype f32|bf16|f16] "
      "[--num_layers N] [--num_shards N] [--config_only]");
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "make_model_main.cc");
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  std::atexit(ExitTwoIfParsing);
  for (int i = 1; i < argc; ++i) {
    if (absl::StartsWith(argv[i], "--help") || absl::StartsWith(argv[i], "-help")) g_help = true;
  }
  g_parsing = true;
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  g_parsing = false;

  if (positional.size() > 1)
    return UsageError(std::string("unexpected argument '") + positional[1] + "'");
  const std::string preset = absl::GetFlag(FLAGS_preset);
  const std::string out = absl::GetFlag(FLAGS_out);
  const std::vector<std::string> presets = duet::model::SyntheticPresets();
  if (preset.empty())
    return UsageError("--preset is required (" + absl::StrJoin(presets, ", ") + ")");
  if (std::find(presets.begin(), presets.end(), preset) == presets.end()) {
    return UsageError("unknown --preset '" + preset + "'; known: " + absl::StrJoin(presets, ", "));
  }
  if (out.empty()) return UsageError("--out is required");
  duet::model::SyntheticOverrides overrides;
  overrides.dtype = absl::GetFlag(FLAGS_dtype);
  if (overrides.dtype != "f32" && overrides.dtype != "bf16" && overrides.dtype != "f16") {
    return UsageError("--dtype must be f32, bf16 or f16, not '" + overrides.dtype + "'");
  }
  if (absl::GetFlag(FLAGS_num_layers) < 0) return UsageError("--num_layers must be >= 0");
  if (absl::GetFlag(FLAGS_num_layers) > 0) overrides.num_layers = absl::GetFlag(FLAGS_num_layers);
  if (absl::GetFlag(FLAGS_num_shards) < 1) return UsageError("--num_shards must be >= 1");
  overrides.num_shards = absl::GetFlag(FLAGS_num_shards);
  overrides.config_only = absl::GetFlag(FLAGS_config_only);

  const auto start = std::chrono::steady_clock::now();
  absl::Status s =
      duet::model::WriteSyntheticModel(preset, absl::GetFlag(FLAGS_seed), out, overrides);
  if (!s.ok()) {
    std::fprintf(stderr, "duet-make-model: %s\n", s.ToString().c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wrote %s model (seed %llu, %s%s) to %s in %.2f s\n", preset.c_str(),
              static_cast<unsigned long long>(absl::GetFlag(FLAGS_seed)), overrides.dtype.c_str(),
              overrides.config_only ? ", config only" : "", out.c_str(), secs);
  return 0;
}
