// engine_bench: prefill and decode throughput of the in-process engine on the CPU.
//
//   engine_bench [--model DIR|FILE.gguf | --preset smollm2-135m] [--prefill 128,512,2048]
//                [--decode-batch 1,8,32] [--gemm invariant,openblas] [--json FILE]
//                [--decode_sample logits,host,backend [--temperature T --top_p P]]
//                [--kv_dtypes f32,bf16,f16,int8,fp8] [--context N] [--kv_cache_bytes B]
//
// Prefill: tokens/s of one prompt's forward pass (best of --reps). Decode: tokens/s of one
// decode step over a batch of sequences, each with --context tokens already cached. Beside
// the decode figures it prints the memory-bound limit: weight bytes / measured read bandwidth.
// --decode_sample adds decode steps that also pick each row's token: "host" copies the logits
// out and samples with model::Sample (the schedulers' old path), "backend" asks Forward for
// sampled tokens (ComputeBackend::SampleRows, their path now). --kv_dtypes repeats the sweep
// for each KV cache dtype (decode at a long --context shows what reading fewer KV bytes buys).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/kv/block_table.h"
#include "common/model/local_engine.h"
#include "common/model/sampler.h"
#include "common/model/synthetic_model.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "",
          "model directory or .gguf file; empty: write --preset to a temp dir");
ABSL_FLAG(std::string, preset, "smollm2-135m", "synthetic preset when --model is empty");
ABSL_FLAG(std::string, prefill, "128,512,2048", "prompt lengths");
ABSL_FLAG(std::string, decode_batch, "1,8,32", "decode batch sizes");
ABSL_FLAG(int, context, 128, "cached tokens per sequence in the decode benchmark");
ABSL_FLAG(std::string, kv_dtypes, "f32", "KV cache dtypes to compare (f32, bf16, f16, int8, fp8)");
ABSL_FLAG(int64_t, kv_cache_bytes, 512ll << 20, "bytes of the KV pool");
ABSL_FLAG(std::string, gemm, "invariant,openblas", "CPU GEMMs to compare");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all)");
ABSL_FLAG(int, reps, 3, "repetitions (best is reported)");
ABSL_FLAG(std::string, json, "", "write results as JSON to this file");
ABSL_FLAG(std::string, decode_sample, "logits",
          "decode step variants, interleaved: logits (the step's logits to the host), host "
          "(logits + model::Sample per row on the host), backend (SequenceInput::sample: "
          "sampled by the compute backend)");
ABSL_FLAG(float, temperature, 0.f, "sampling temperature of the host/backend variants (0: greedy)");
ABSL_FLAG(float, top_p, 1.f, "top_p of the host/backend variants");

namespace {

using duet::model::LocalEngine;
using duet::model::SequenceInput;

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    int v;
    if (!absl::SimpleAtoi(p, &v) || v <= 0) {
      std::fprintf(stderr, "engine_bench: bad list element '%s'\n", std::string(p).c_str());
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

// Sequential read bandwidth over a buffer much larger than the caches, GB/s (best of 3).
double MeasureReadBandwidth() {
  const size_t n = (512ull << 20) / sizeof(float);
  std::vector<float> buf(n, 1.0f);
  double best = 0;
  volatile float sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    duet::Stopwatch sw;
    float acc[8] = {0};
    for (size_t i = 0; i < n; i += 8) {
      for (int j = 0; j < 8; ++j) acc[j] += buf[i + j];
    }
    const double s = sw.ElapsedSeconds();
    sink = sink + acc[0] + acc[7];
    best = std::max(best, n * sizeof(float) / s / 1e9);
  }
  return best;
}

double WeightBytes(const duet::model::ModelConfig& c) {
  const double h = c.hidden_size, qd = c.num_attention_heads * c.head_dim,
               kvd = c.num_key_value_heads * c.head_dim, inter = c.intermediate_size;
  const double per_layer = h * qd * 2 + h * kvd * 2 + 3 * h * inter + 2 * h;
  const double lm_head = c.vocab_size * h;  // read once per step (embedding lookup is sparse)
  return 4.0 * (per_layer * c.num_hidden_layers + lm_head + h);
}

struct Row {
  std::string gemm, kv_dtype, phase;
  int size;
  double ms, tokens_per_s;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  duet::SetMinLogLevel(duet::LogLevel::kWarning);
  std::string model_dir = absl::GetFlag(FLAGS_model);
  std::filesystem::path tmp;
  if (model_dir.empty()) {
    tmp = std::filesystem::temp_directory_path() /
          ("duet_engine_bench_" + std::to_string(getpid()));
    absl::Status s = duet::model::WriteSyntheticModel(absl::GetFlag(FLAGS_preset), 1, tmp.string());
    if (!s.ok()) {
      std::fprintf(stderr, "engine_bench: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    model_dir = tmp.string();
  }
  const std::vector<int> prefill = ParseList(absl::GetFlag(FLAGS_prefill));
  const std::vector<int> batches = ParseList(absl::GetFlag(FLAGS_decode_batch));
  const int context = absl::GetFlag(FLAGS_context);
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  std::vector<std::string> modes;
  for (absl::string_view m : absl::StrSplit(absl::GetFlag(FLAGS_decode_sample), ',')) {
    if (m != "logits" && m != "host" && m != "backend") {
      std::fprintf(stderr, "engine_bench: unknown --decode_sample variant '%s'\n",
                   std::string(m).c_str());
      return 2;
    }
    modes.emplace_back(m);
  }
  const duet::model::SamplingParams sampling{.temperature = absl::GetFlag(FLAGS_temperature),
                                             .top_p = absl::GetFlag(FLAGS_top_p),
                                             .seed = 1};
  std::vector<Row> rows;
  nlohmann::json capacity = nlohmann::json::array();
  duet::model::ModelConfig config;

  std::vector<std::pair<std::string, std::string>> variants;  // (gemm, kv dtype)
  for (absl::string_view gemm : absl::StrSplit(absl::GetFlag(FLAGS_gemm), ',')) {
    for (absl::string_view kvd : absl::StrSplit(absl::GetFlag(FLAGS_kv_dtypes), ',')) {
      variants.emplace_back(std::string(gemm), std::string(kvd));
    }
  }
  for (const auto& [gemm, kv_dtype] : variants) {
    duet::model::EngineOptions opts{.device = "cpu",
                                    .num_threads = absl::GetFlag(FLAGS_threads),
                                    .cpu_gemm = gemm,
                                    .kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes),
                                    .kv_dtype = kv_dtype};
    int64_t max_tokens = 0;
    for (int p : prefill) max_tokens = std::max<int64_t>(max_tokens, p);
    for (int b : batches) max_tokens = std::max<int64_t>(max_tokens, int64_t{b} * (context + 1));
    auto engine_or = LocalEngine::Load(model_dir, opts);
    if (!engine_or.ok()) {
      std::fprintf(stderr, "engine_bench: %s\n", std::string(engine_or.status().message()).c_str());
      return 1;
    }
    LocalEngine& engine = **engine_or;
    config = engine.config();
    duet::kv::BlockPool& pool = engine.pool();
    if (pool.layout().BytesForTokens(max_tokens + 64 * pool.layout().block_size) >
        pool.region_bytes()) {
      std::fprintf(stderr, "engine_bench: KV pool too small for the sweep (--kv_cache_bytes)\n");
      return 1;
    }
    auto token = [&](int i) { return static_cast<int32_t>((i * 7919 + 13) % config.vocab_size); };
    {
      // What this dtype buys a decode node: requests of --context (+ 64 generated) tokens a pool
      // of --kv_cache_bytes holds.
      const duet::kv::KvLayout& l = pool.layout();
      const int64_t per_request = l.BlocksForTokens(context + 64);
      capacity.push_back({{"gemm", gemm},
                          {"kv_dtype", kv_dtype},
                          {"bytes_per_token", l.BytesForTokens(1)},
                          {"pool_bytes", pool.region_bytes()},
                          {"blocks", pool.num_blocks()},
                          {"tokens", pool.num_blocks() * l.block_size},
                          {"requests_of_context", pool.num_blocks() / per_request}});
    }

    for (int len : prefill) {
      double best = 1e30;
      for (int r = 0; r < reps; ++r) {
        duet::kv::BlockTable table(&pool);
        std::vector<SequenceInput> batch(1);
        batch[0].tokens.resize(len);
        for (int i = 0; i < len; ++i) batch[0].tokens[i] = token(i);
        batch[0].table = &table;
        duet::Stopwatch sw;
        auto out = engine.runner().Forward(absl::MakeSpan(batch), pool.View());
        if (!out.ok()) {
          std::fprintf(stderr, "engine_bench: %s\n", std::string(out.status().message()).c_str());
          return 1;
        }
        best = std::min(best, sw.ElapsedMs());
      }
      rows.push_back({gemm, kv_dtype, "prefill", len, best, len / best * 1e3});
    }
    for (int b : batches) {
      std::vector<std::unique_ptr<duet::kv::BlockTable>> tables;
      std::vector<SequenceInput> batch(b);
      for (int s = 0; s < b; ++s) {
        tables.push_back(std::make_unique<duet::kv::BlockTable>(&pool));
        std::vector<SequenceInput> one(1);
        one[0].seq_id = s;
        one[0].tokens.resize(context);
        for (int i = 0; i < context; ++i) one[0].tokens[i] = token(i + s);
        one[0].table = tables.back().get();
        one[0].want_logits = false;
        if (auto out = engine.runner().Forward(absl::MakeSpan(one), pool.View()); !out.ok()) {
          std::fprintf(stderr, "engine_bench: %s\n", std::string(out.status().message()).c_str());
          return 1;
        }
      }
      // Variants interleaved per repetition, so context growth and noise hit each alike.
      std::vector<double> best(modes.size(), 1e30);
      for (int r = 0; r < reps; ++r) {
        for (size_t m = 0; m < modes.size(); ++m) {
          const bool on_backend = modes[m] == "backend";
          for (int s = 0; s < b; ++s) {
            batch[s] = SequenceInput{.seq_id = s,
                                     .tokens = {token(s)},
                                     .start_pos = static_cast<int32_t>(tables[s]->num_tokens()),
                                     .table = tables[s].get(),
                                     .want_logits = !on_backend,
                                     .sample = on_backend ? &sampling : nullptr,
                                     .sample_step = r};
          }
          duet::Stopwatch sw;
          auto out = engine.runner().Forward(absl::MakeSpan(batch), pool.View());
          if (!out.ok()) {
            std::fprintf(stderr, "engine_bench: %s\n", std::string(out.status().message()).c_str());
            return 1;
          }
          int64_t checksum = 0;  // keeps the sampling from being optimised away
          if (modes[m] == "host") {
            for (int s = 0; s < b; ++s) {
              checksum += duet::model::Sample(out->Row(s), out->vocab, sampling, r).id;
            }
          } else if (on_backend) {
            for (const duet::model::SampledToken& t : out->tokens) checksum += t.id;
          }
          best[m] = std::min(best[m], sw.ElapsedMs());
          if (checksum < 0) std::fprintf(stderr, "engine_bench: negative token id\n");
        }
      }
      for (size_t m = 0; m < modes.size(); ++m) {
        const std::string phase = modes[m] == "logits" ? "decode" : "decode+" + modes[m];
        rows.push_back({gemm, kv_dtype, phase, b, best[m], b / best[m] * 1e3});
      }
    }
  }

  const double bw = MeasureReadBandwidth();
  const double wbytes = WeightBytes(config);
  const double bound = bw * 1e9 / wbytes;  // decode steps/s if weights stream once per step
  std::printf("model: %s (layers %d, hidden %d, vocab %d), fp32 weights %.0f MB\n",
              model_dir.c_str(), config.num_hidden_layers, config.hidden_size, config.vocab_size,
              wbytes / 1e6);
  std::printf("measured read bandwidth %.1f GB/s -> memory-bound decode limit %.1f steps/s "
              "(x batch tokens/s)\n\n", bw, bound);
  std::printf("%-10s %-5s %10s %12s %10s %12s %14s\n", "gemm", "kv", "bytes/tok", "pool_bytes",
              "blocks", "tokens", "requests@ctx");
  for (const auto& c : capacity) {
    std::printf("%-10s %-5s %10lld %12lld %10lld %12lld %14lld\n",
                c["gemm"].get<std::string>().c_str(), c["kv_dtype"].get<std::string>().c_str(),
                c["bytes_per_token"].get<long long>(), c["pool_bytes"].get<long long>(),
                c["blocks"].get<long long>(), c["tokens"].get<long long>(),
                c["requests_of_context"].get<long long>());
  }
  std::printf("\n");
  std::printf("%-10s %-5s %-20s %6s %10s %12s %12s\n", "gemm", "kv", "phase", "size", "ms",
              "tokens/s", "vs_mem_bound");
  nlohmann::json j;
  j["model"] = model_dir;
  j["kv_capacity"] = capacity;
  j["read_bandwidth_gbps"] = bw;
  j["weight_bytes"] = wbytes;
  j["decode_bound_steps_per_s"] = bound;
  for (const Row& r : rows) {
    const bool decode = r.phase.rfind("decode", 0) == 0;
    const double vs = decode ? (1e3 / r.ms) / bound : 0;
    std::printf("%-10s %-5s %-20s %6d %10.2f %12.1f %12s\n", r.gemm.c_str(), r.kv_dtype.c_str(),
                r.phase.c_str(), r.size, r.ms, r.tokens_per_s,
                decode ? (std::to_string(vs).substr(0, 5)).c_str() : "-");
    j["rows"].push_back({{"gemm", r.gemm},
                         {"kv_dtype", r.kv_dtype},
                         {"phase", r.phase},
                         {"size", r.size},
                         {"ms", r.ms},
                         {"tokens_per_s", r.tokens_per_s},
                         {"decode_steps_vs_memory_bound", vs}});
  }
  if (!absl::GetFlag(FLAGS_json).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_json)) << j.dump(2) << "\n";
  }
  if (!tmp.empty()) std::filesystem::remove_all(tmp);
  return 0;
}
