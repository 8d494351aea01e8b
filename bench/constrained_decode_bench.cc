// constrained_decode_bench: what structured output costs a decode step on the engine core, with
// and without a JSON schema, side by side: for each batch size, rounds alternate the two arms,
// each decoding `--steps` steps of a full batch (a sequence that ends is replaced by a fresh one,
// prefilled outside the timing, so every timed step decodes `batch` sequences; both arms stop a
// sequence at --max_tokens, so their contexts stay alike). A timed step is StepRunner::Run: the
// masks filled, the forward pass, the masks applied, the sampling and the tokens accepted.
//
//   constrained_decode_bench --model models/smollm2-135m-instruct-q4_1.gguf --batch 1,32
//       --steps 64 --rounds 3 --threads 2   (one command line)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_json_schema.h"
#include "common/base/status.h"
#include "common/engine/local_engine.h"
#include "common/engine/sequence.h"
#include "common/engine/step_runner.h"
#include "common/grammar/grammar_compiler.h"
#include "common/grammar/grammar_constraint.h"
#include "common/kv/block_pool.h"
#include "common/kv/kv_cache_manager.h"

ABSL_FLAG(std::string, model, "", "model directory or .gguf file (with its tokenizer)");
ABSL_FLAG(std::string, batch, "1,32", "decode batch sizes");
ABSL_FLAG(int, steps, 64, "timed decode steps per arm and round");
ABSL_FLAG(int, rounds, 3, "rounds; each runs both arms, alternating which goes first");
ABSL_FLAG(int, max_tokens, 64, "output tokens after which a sequence is replaced");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all)");
ABSL_FLAG(int64_t, kv_cache_bytes, 256ll << 20, "bytes of the KV pool");

namespace duet::grammar {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Arm {
  const char* name;
  bool grammar;
};

class Bench {
 public:
  Bench(model::LocalEngine* engine, kv::BlockPool* pool, GrammarCompiler* compiler)
      : engine_(engine),
        pool_(pool),
        kv_(pool, engine->runner().PrefixCacheSeed(pool->layout().block_size), false),
        step_(&engine->runner(), &kv_, engine->eos_ids()),
        compiler_(compiler) {}

  // Milliseconds of each of `steps` decode steps at `batch` sequences.
  absl::StatusOr<std::vector<double>> Run(int batch, bool grammar, int steps, int max_tokens) {
    std::vector<std::unique_ptr<engine::Sequence>> seqs(batch);
    for (int i = 0; i < batch; ++i) DUET_RETURN_IF_ERROR(Start(&seqs[i], i, grammar, max_tokens));
    std::vector<double> ms;
    for (int s = 0; s < steps; ++s) {
      std::vector<engine::StepItem> items;
      for (auto& q : seqs) {
        DUET_RETURN_IF_ERROR(kv_.Grow(*q->table, q->computed() + 1));
        items.push_back({.seq = q.get(), .tokens = 1});
      }
      const Clock::time_point t0 = Clock::now();
      DUET_ASSIGN_OR_RETURN(std::vector<engine::StepOutcome> out, step_.Run(items));
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      for (int i = 0; i < batch; ++i) {
        DUET_RETURN_IF_ERROR(out[i].error);
        if (out[i].stop == model::StopReason::kNone) continue;
        ++finished_;
        DUET_RETURN_IF_ERROR(Start(&seqs[i], i, grammar, max_tokens));
      }
    }
    for (auto& q : seqs) kv_.Finish(*q->table, q->tokens, /*publish=*/false);
    return ms;
  }
  int64_t finished() const { return finished_; }

 private:
  // A fresh sequence in slot i, prefilled (untimed) up to its first decode.
  absl::Status Start(std::unique_ptr<engine::Sequence>* slot, int i, bool grammar, int max_tokens) {
    if (*slot != nullptr && (*slot)->table != nullptr) {
      kv_.Finish(*(*slot)->table, (*slot)->tokens, /*publish=*/false);
    }
    model::SamplingParams p{.temperature = 0.8f,
                            .seed = static_cast<uint64_t>(1000 * i + ++started_),
                            .max_tokens = max_tokens};
    if (grammar) p.grammar = GrammarSpec::JsonSchema(kBenchJsonSchema);
    DUET_ASSIGN_OR_RETURN(
        std::vector<int32_t> prompt,
        engine_->tokenizer().Encode(
            "Write a JSON record for user number " + std::to_string(i) + ":", true));
    auto seq = std::make_unique<engine::Sequence>(i, prompt, 0, p, engine_->eos_ids());
    DUET_ASSIGN_OR_RETURN(seq->constraint, ConstraintFor(compiler_, seq->params, {}));
    const int64_t n = static_cast<int64_t>(seq->tokens.size());
    DUET_ASSIGN_OR_RETURN(kv::SequenceBlocks blocks, kv_.AllocateSequence(seq->tokens, n));
    seq->table = std::move(blocks).MakeTable(pool_);
    engine::StepItem item{.seq = seq.get(), .tokens = seq->pending()};
    DUET_ASSIGN_OR_RETURN(std::vector<engine::StepOutcome> out, step_.Run({&item, 1}));
    DUET_RETURN_IF_ERROR(out[0].error);
    *slot = std::move(seq);
    if (out[0].stop != model::StopReason::kNone) return Start(slot, i, grammar, max_tokens);
    return absl::OkStatus();
  }

  model::LocalEngine* engine_;
  kv::BlockPool* pool_;
  kv::KvCacheManager kv_;
  engine::StepRunner step_;
  GrammarCompiler* compiler_;
  int64_t started_ = 0;
  int64_t finished_ = 0;
};

int Main() {
  const std::string path = absl::GetFlag(FLAGS_model);
  if (path.empty()) {
    std::fprintf(stderr, "constrained_decode_bench: --model is required\n");
    return 2;
  }
  std::vector<int> batches;
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_batch), ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(b, &v) || v <= 0) {
      std::fprintf(stderr, "constrained_decode_bench: bad --batch entry '%s'\n",
                   std::string(b).c_str());
      return 2;
    }
    batches.push_back(v);
  }
  const int steps = absl::GetFlag(FLAGS_steps);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  const int max_tokens = absl::GetFlag(FLAGS_max_tokens);
  if (steps <= 0 || rounds <= 0 || max_tokens <= 1) {
    std::fprintf(stderr, "constrained_decode_bench: --steps, --rounds and --max_tokens > 1\n");
    return 2;
  }
  auto engine = model::LocalEngine::Load(
      path, {.num_threads = absl::GetFlag(FLAGS_threads), .kv_cache_bytes = 1});
  if (!engine.ok() || !(*engine)->has_tokenizer()) {
    std::fprintf(stderr, "constrained_decode_bench: %s\n",
                 engine.ok() ? "the model has no tokenizer" : engine.status().ToString().c_str());
    return 1;
  }
  model::LocalEngine& e = **engine;
  const kv::KvLayout layout = e.runner().MakeKvLayout(16);
  auto pool =
      kv::BlockPool::Create(layout, absl::GetFlag(FLAGS_kv_cache_bytes) / layout.RegionBytes(1));
  auto compiler = GrammarCompiler::Create(e.tokenizer(), e.config().vocab_size, {});
  if (!pool.ok() || !compiler.ok()) {
    std::fprintf(stderr, "constrained_decode_bench: %s %s\n", pool.status().ToString().c_str(),
                 compiler.status().ToString().c_str());
    return 1;
  }
  Bench bench(&e, pool->get(), compiler->get());
  const Arm arms[2] = {{"plain", false}, {"json_schema", true}};
  std::printf("model %s, %d steps per arm and round, %d rounds, max_tokens %d\n", path.c_str(),
              steps, rounds, max_tokens);
  std::printf(
      "| batch | round | plain ms/step | json_schema ms/step | ratio |\n|---|---|---|---|---|\n");
  for (int batch : batches) {
    std::vector<double> ratios;
    for (int r = 0; r < rounds; ++r) {
      double median[2] = {0, 0};
      for (int k = 0; k < 2; ++k) {
        const int a = (r % 2 == 0) ? k : 1 - k;  // alternate which arm goes first
        auto ms = bench.Run(batch, arms[a].grammar, steps, max_tokens);
        if (!ms.ok()) {
          std::fprintf(stderr, "constrained_decode_bench: %s: %s\n", arms[a].name,
                       ms.status().ToString().c_str());
          return 1;
        }
        median[a] = Median(*ms);
      }
      ratios.push_back(median[1] / median[0]);
      std::printf("| %d | %d | %.2f | %.2f | %.3f |\n", batch, r, median[0], median[1],
                  median[1] / median[0]);
    }
    std::printf("| %d | median | | | %.3f |\n", batch, Median(ratios));
  }
  return 0;
}

}  // namespace
}  // namespace duet::grammar

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return duet::grammar::Main();
}
