// grammar_bench: what structured output costs on a model's vocabulary: building the compiler
// (the vocabulary's bytes), compiling each kind of spec (first time and cached), and per decode
// step filling a request's token mask and applying it to a logits row.
//
//   grammar_bench --model models/smollm2-135m-instruct-q4_1.gguf [--steps 200] [--reps 5]
//
// Compile times are the best of --reps fresh compilers; the per-step figures are medians (and the
// slowest mask) over up to --steps tokens of a JSON-schema document decoded greedily from random
// logits through the mask.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/types/span.h"
#include "bench/bench_json_schema.h"
#include "common/grammar/grammar_compiler.h"
#include "common/grammar/grammar_matcher.h"
#include "common/tokenizer/tokenizer.h"

ABSL_FLAG(std::string, model, "", "model directory or .gguf file (its tokenizer)");
ABSL_FLAG(int, steps, 200, "decode steps timed for the mask (at most)");
ABSL_FLAG(int, reps, 5, "fresh compilers per compile figure (best of)");

namespace duet::grammar {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int Run() {
  const std::string path = absl::GetFlag(FLAGS_model);
  if (path.empty()) {
    std::fprintf(stderr, "grammar_bench: --model is required\n");
    return 2;
  }
  const int steps = absl::GetFlag(FLAGS_steps);
  const int reps = absl::GetFlag(FLAGS_reps);
  if (steps <= 0 || reps <= 0) {
    std::fprintf(stderr, "grammar_bench: --steps and --reps must be positive\n");
    return 2;
  }
  auto tok = model::LoadTokenizer(path);
  if (!tok.ok()) {
    std::fprintf(stderr, "grammar_bench: %s\n", tok.status().ToString().c_str());
    return 1;
  }
  const int32_t width = (*tok)->vocab_size();
  const std::vector<std::pair<const char*, GrammarSpec>> specs = {
      {"json_object", GrammarSpec::JsonObject()},
      {"json_schema", GrammarSpec::JsonSchema(kBenchJsonSchema)},
      {"regex", GrammarSpec::Regex("[a-z]{2,8}-[0-9]{3,6}( [A-Z][a-z]+)?")},
      {"choice", GrammarSpec::Choice({"positive", "negative", "neutral"})},
  };
  std::vector<double> create_ms;
  std::vector<std::vector<double>> compile_ms(specs.size()), cached_ms(specs.size());
  std::vector<size_t> bytes(specs.size());
  std::unique_ptr<GrammarCompiler> compiler;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    auto created = GrammarCompiler::Create(**tok, width, {});
    create_ms.push_back(Ms(Clock::now() - t0));
    if (!created.ok()) {
      std::fprintf(stderr, "grammar_bench: %s\n", created.status().ToString().c_str());
      return 1;
    }
    compiler = *std::move(created);
    for (size_t i = 0; i < specs.size(); ++i) {
      t0 = Clock::now();
      auto grammar = compiler->Compile(specs[i].second);
      compile_ms[i].push_back(Ms(Clock::now() - t0));
      t0 = Clock::now();
      auto again = compiler->Compile(specs[i].second);
      cached_ms[i].push_back(Ms(Clock::now() - t0));
      if (!grammar.ok() || !again.ok()) {
        std::fprintf(stderr, "grammar_bench: %s: %s\n", specs[i].first,
                     grammar.status().ToString().c_str());
        return 1;
      }
      bytes[i] = (*grammar)->memory_bytes();
    }
  }
  std::printf("%s: %s tokenizer, %d tokens\n", path.c_str(), (*tok)->name().c_str(), width);
  std::printf("compiler (vocabulary) %.1f ms\n",
              *std::min_element(create_ms.begin(), create_ms.end()));
  std::printf("%-12s %12s %12s %14s\n", "spec", "compile ms", "cached ms", "compiled bytes");
  for (size_t i = 0; i < specs.size(); ++i) {
    std::printf("%-12s %12.2f %12.4f %14zu\n", specs[i].first,
                *std::min_element(compile_ms[i].begin(), compile_ms[i].end()),
                *std::min_element(cached_ms[i].begin(), cached_ms[i].end()), bytes[i]);
  }

  // Per step: a json_schema document decoded greedily from random logits through the mask.
  auto grammar = compiler->Compile(specs[1].second);
  auto matcher = GrammarMatcher::Create(*grammar);
  if (!matcher.ok()) {
    std::fprintf(stderr, "grammar_bench: %s\n", matcher.status().ToString().c_str());
    return 1;
  }
  TokenBitmask mask(width);
  std::vector<float> logits(width);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-10.0f, 10.0f);
  std::vector<double> fill_ms, apply_ms, accept_ms;
  for (int step = 0; step < steps && !matcher->IsTerminated(); ++step) {
    for (float& l : logits) l = uniform(rng);
    auto t0 = Clock::now();
    if (!matcher->FillNextTokenBitmask(&mask).ok()) return 1;
    fill_ms.push_back(Ms(Clock::now() - t0));
    t0 = Clock::now();
    if (!mask.Apply(absl::MakeSpan(logits)).ok()) return 1;
    apply_ms.push_back(Ms(Clock::now() - t0));
    const int32_t best =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    t0 = Clock::now();
    if (!matcher->AcceptToken(best)) return 1;
    accept_ms.push_back(Ms(Clock::now() - t0));
  }
  std::printf(
      "per step (median of %zu): fill mask %.3f ms (max %.3f), apply %.3f ms, accept "
      "%.4f ms\n",
      fill_ms.size(), Median(fill_ms), *std::max_element(fill_ms.begin(), fill_ms.end()),
      Median(apply_ms), Median(accept_ms));
  return 0;
}

}  // namespace
}  // namespace duet::grammar

int main(int argc, char** argv) {
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::fprintf(stderr, "grammar_bench: unexpected argument '%s'\n", positional[1]);
    return 2;
  }
  return duet::grammar::Run();
}
