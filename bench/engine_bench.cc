// engine_bench: prefill and decode throughput of the in-process engine on the CPU.
//
//   engine_bench [--model DIR|FILE.gguf | --preset smollm2-135m] [--prefill 128,512,2048]
//                [--decode-batch 1,8,32] [--gemm invariant,openblas] [--json FILE]
//                [--decode_sample logits,host,backend [--temperature T --top_p P]]
//                [--kv_dtypes f32,bf16,f16,int8,fp8] [--context N] [--kv_cache_bytes B]
//                [--weights_dtype f32,native,auto] [--cpu_isa auto,avx2,avx512,...]
//
// Prefill: tokens/s of one prompt's forward pass (best of --reps). Decode: tokens/s of one
// decode step over a batch of sequences, each with --context tokens already cached (every
// repetition decodes at that position: the table is cut back after each step). Beside
// the decode figures it prints the memory-bound limit: the bytes a step reads (the weight
// matrices, and each sequence's K/V at --context + 1 tokens) / measured read bandwidth.
// --decode_sample adds decode steps that also pick each row's token: "host" copies the logits
// out and samples with model::Sample (the schedulers' old path), "backend" asks Forward for
// sampled tokens (ComputeBackend::SampleRows, their path now). --kv_dtypes repeats the sweep
// for each KV cache dtype (decode at a long --context shows what reading fewer KV bytes buys),
// --weights_dtype for each way of keeping the weight matrices (f32, or native: GGUF blocks as
// stored), --cpu_isa for each CPU kernel path (cpu_isa.h). Every variant is loaded first and the
// variants run interleaved, repetition by repetition, so that noise on a shared machine hits each
// alike; the memory-read bound of each is its own matrix bytes (ModelRunner::MatrixBytes) plus
// its K/V bytes over the measured read bandwidth: the better of two probes, one before the
// engines load and one after they are freed (on a shared machine either can read low, which
// would flatter the ratio).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/base/auto_option.h"
#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/engine/local_engine.h"
#include "common/kv/block_table.h"
#include "common/model/synthetic_model.h"
#include "common/sampling/sampler.h"
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
ABSL_FLAG(std::string, weights_dtype, "f32",
          "ways of keeping the weight matrices to compare (f32, native, bf16, or auto: duet's "
          "default, reported as what it resolved to, e.g. auto=native)");
ABSL_FLAG(
    std::string, cpu_isa, "auto",
    "CPU kernel paths to compare (auto, scalar, avx2, avx512, avx512_vnni, avx512_bf16, amx)");
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

// The value of a --flag's element, or exit 2 naming the flag.
template <typename T>
T OrExit(absl::StatusOr<T> v, const char* flag) {
  if (!v.ok()) {
    std::fprintf(stderr, "engine_bench: --%s: %s\n", flag,
                 std::string(v.status().message()).c_str());
    std::exit(2);
  }
  return *std::move(v);
}

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

// Sequential read bandwidth with `threads` threads (the run's), over a buffer of `bytes`
// (larger than the last-level cache, so it measures memory, not cache), GB/s, best of 3. Each
// thread sums its contiguous slice with 64 independent float lanes, so the adds' latency does not
// bound the reads.
double MeasureReadBandwidth(int threads, size_t bytes) {
  threads = std::max(1, threads);
  const size_t n = bytes / sizeof(float) / 64 * 64;
  std::vector<float> buf(n, 1.0f);
  double best = 0;
  std::vector<float> sinks(threads);
  for (int rep = 0; rep < 3; ++rep) {
    duet::Stopwatch sw;
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const size_t per = n / threads / 64 * 64;
        const size_t begin = per * t, end = t == threads - 1 ? n : begin + per;
        float acc[64] = {0};
        for (size_t i = begin; i < end; i += 64) {
          for (int j = 0; j < 64; ++j) acc[j] += buf[i + j];
        }
        float s = 0;
        for (float a : acc) s += a;
        sinks[t] = s;
      });
    }
    for (auto& th : pool) th.join();
    const double s = sw.ElapsedSeconds();
    best = std::max(best, n * sizeof(float) / s / 1e9);
  }
  volatile float sink = sinks[0];
  (void)sink;
  return best;
}

struct Row {
  std::string gemm, kv_dtype, weights, isa, phase;
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
  // 1 GiB: twice the largest last-level cache seen on the development machines (480 MiB).
  const int probe_threads = absl::GetFlag(FLAGS_threads) > 0
                                ? absl::GetFlag(FLAGS_threads)
                                : static_cast<int>(std::thread::hardware_concurrency());
  const double bw_before = MeasureReadBandwidth(probe_threads, size_t{1} << 30);
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

  struct Variant {
    std::string gemm, kv_dtype, weights, isa;
    std::unique_ptr<LocalEngine> engine;
  };
  std::vector<Variant> variants;
  for (absl::string_view gemm : absl::StrSplit(absl::GetFlag(FLAGS_gemm), ',')) {
    for (absl::string_view kvd : absl::StrSplit(absl::GetFlag(FLAGS_kv_dtypes), ',')) {
      for (absl::string_view wd : absl::StrSplit(absl::GetFlag(FLAGS_weights_dtype), ',')) {
        for (absl::string_view isa : absl::StrSplit(absl::GetFlag(FLAGS_cpu_isa), ',')) {
          variants.push_back(
              {std::string(gemm), std::string(kvd), std::string(wd), std::string(isa), nullptr});
        }
      }
    }
  }
  // Blocks of the largest phase: one prompt, or a batch of sequences held at --context + 1.
  auto blocks_needed = [&](const duet::kv::KvLayout& layout) {
    int64_t blocks = 0;
    for (int p : prefill) blocks = std::max(blocks, layout.BlocksForTokens(p));
    for (int b : batches) blocks = std::max(blocks, b * layout.BlocksForTokens(context + 1));
    return blocks;
  };
  for (Variant& v : variants) {
    duet::model::EngineOptions opts{
        .device = duet::compute::Device::kCpu,
        .num_threads = absl::GetFlag(FLAGS_threads),
        .cpu_gemm = OrExit(duet::compute::ParseCpuGemm(v.gemm), "gemm"),
        .kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes),
        .kv_dtype = OrExit(duet::ParseOrAuto<duet::kv::KvDtype>(v.kv_dtype, duet::kv::ParseKvDtype),
                           "kv_dtypes"),
        .cpu_isa = OrExit(
            duet::ParseOrAuto<duet::compute::cpu::CpuIsa>(v.isa, duet::compute::cpu::ParseCpuIsa),
            "cpu_isa"),
        .weights_dtype = OrExit(
            duet::ParseOrAuto<duet::model::WeightsDtype>(v.weights, duet::model::ParseWeightsDtype),
            "weights_dtype")};
    auto engine_or = LocalEngine::Load(model_dir, opts);
    if (!engine_or.ok()) {
      std::fprintf(stderr, "engine_bench: %s\n", std::string(engine_or.status().message()).c_str());
      return 1;
    }
    v.engine = *std::move(engine_or);
    // "auto" reported as what it resolved to: "auto=native".
    if (!opts.weights_dtype) {
      v.weights += std::string("=") + duet::model::WeightsDtypeName(v.engine->weights_dtype());
    }
    config = v.engine->config();
    duet::kv::BlockPool& pool = v.engine->pool();
    if (pool.layout().BytesForTokens(blocks_needed(pool.layout()) * pool.layout().block_size) >
        pool.region_bytes()) {
      std::fprintf(stderr, "engine_bench: KV pool too small for the sweep (--kv_cache_bytes)\n");
      return 1;
    }
    // What this dtype buys a decode node: requests of --context (+ 64 generated) tokens a pool
    // of --kv_cache_bytes holds.
    const duet::kv::KvLayout& l = pool.layout();
    const int64_t per_request = l.BlocksForTokens(context + 64);
    capacity.push_back({{"gemm", v.gemm},
                        {"kv_dtype", v.kv_dtype},
                        {"bytes_per_token", l.BytesForTokens(1)},
                        {"pool_bytes", pool.region_bytes()},
                        {"blocks", pool.num_blocks()},
                        {"tokens", pool.num_blocks() * l.block_size},
                        {"requests_of_context", pool.num_blocks() / per_request}});
  }
  auto token = [&](int i) { return static_cast<int32_t>((i * 7919 + 13) % config.vocab_size); };
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "engine_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  };

  for (int len : prefill) {
    std::vector<double> best(variants.size(), 1e30);
    for (int r = 0; r < reps; ++r) {
      for (size_t vi = 0; vi < variants.size(); ++vi) {
        LocalEngine& engine = *variants[vi].engine;
        duet::kv::BlockTable table(&engine.pool());
        std::vector<SequenceInput> batch(1);
        batch[0].tokens.resize(len);
        for (int i = 0; i < len; ++i) batch[0].tokens[i] = token(i);
        batch[0].table = &table;
        if (absl::Status st = table.Reserve(len); !st.ok()) return fail(st);
        duet::Stopwatch sw;
        auto out = engine.runner().Forward(absl::MakeSpan(batch), engine.pool().View());
        if (!out.ok()) return fail(out.status());
        best[vi] = std::min(best[vi], sw.ElapsedMs());
      }
    }
    for (size_t vi = 0; vi < variants.size(); ++vi) {
      const Variant& v = variants[vi];
      rows.push_back(
          {v.gemm, v.kv_dtype, v.weights, v.isa, "prefill", len, best[vi], len / best[vi] * 1e3});
    }
  }
  for (int b : batches) {
    // Each variant's b sequences of --context cached tokens.
    std::vector<std::vector<std::unique_ptr<duet::kv::BlockTable>>> tables(variants.size());
    for (size_t vi = 0; vi < variants.size(); ++vi) {
      LocalEngine& engine = *variants[vi].engine;
      for (int s = 0; s < b; ++s) {
        tables[vi].push_back(std::make_unique<duet::kv::BlockTable>(&engine.pool()));
        std::vector<SequenceInput> one(1);
        one[0].seq_id = s;
        one[0].tokens.resize(context);
        for (int i = 0; i < context; ++i) one[0].tokens[i] = token(i + s);
        one[0].table = tables[vi].back().get();
        one[0].want_logits = false;
        if (absl::Status st = one[0].table->Reserve(context); !st.ok()) return fail(st);
        if (auto out = engine.runner().Forward(absl::MakeSpan(one), engine.pool().View());
            !out.ok()) {
          return fail(out.status());
        }
      }
    }
    // Variants and sampling modes interleaved per repetition, so that noise hits each alike.
    // Every step decodes at position --context: afterwards each table is cut back to --context
    // tokens (the step's block, if it took one, stays for the next), so a long run, or a
    // profile of one, sees the stated context and not a growing one.
    std::vector<std::vector<double>> best(variants.size(), std::vector<double>(modes.size(), 1e30));
    std::vector<SequenceInput> batch(b);
    for (int r = 0; r < reps; ++r) {
      for (size_t vi = 0; vi < variants.size(); ++vi) {
        LocalEngine& engine = *variants[vi].engine;
        for (size_t m = 0; m < modes.size(); ++m) {
          const bool on_backend = modes[m] == "backend";
          for (int s = 0; s < b; ++s) {
            batch[s] = SequenceInput{.seq_id = s,
                                     .tokens = {token(s)},
                                     .start_pos = static_cast<int32_t>(tables[vi][s]->num_tokens()),
                                     .table = tables[vi][s].get(),
                                     .want_logits = !on_backend,
                                     .sample = on_backend ? &sampling : nullptr,
                                     .sample_step = r};
            if (absl::Status st = tables[vi][s]->Reserve(tables[vi][s]->num_tokens() + 1);
                !st.ok()) {
              return fail(st);
            }
          }
          duet::Stopwatch sw;
          auto out = engine.runner().Forward(absl::MakeSpan(batch), engine.pool().View());
          if (!out.ok()) return fail(out.status());
          int64_t checksum = 0;  // keeps the sampling from being optimised away
          if (modes[m] == "host") {
            for (int s = 0; s < b; ++s) {
              checksum += duet::model::Sample(out->Row(s), out->vocab, sampling, r).id;
            }
          } else if (on_backend) {
            for (const duet::model::SampledToken& t : out->tokens) checksum += t.id;
          }
          best[vi][m] = std::min(best[vi][m], sw.ElapsedMs());
          if (checksum < 0) std::fprintf(stderr, "engine_bench: negative token id\n");
          for (int s = 0; s < b; ++s) {
            std::vector<duet::kv::BlockId> blocks = tables[vi][s]->Detach();
            tables[vi][s] =
                std::make_unique<duet::kv::BlockTable>(&engine.pool(), std::move(blocks), context);
          }
        }
      }
    }
    for (size_t vi = 0; vi < variants.size(); ++vi) {
      const Variant& v = variants[vi];
      for (size_t m = 0; m < modes.size(); ++m) {
        const std::string phase = modes[m] == "logits" ? "decode" : "decode+" + modes[m];
        rows.push_back(
            {v.gemm, v.kv_dtype, v.weights, v.isa, phase, b, best[vi][m], b / best[vi][m] * 1e3});
      }
    }
  }
  std::map<std::string, double> weight_bytes;  // weights dtype -> matrix bytes per step
  std::map<std::string, double> kv_token_bytes;  // kv dtype -> K/V bytes of a token, all layers
  for (const auto& c : capacity) {
    kv_token_bytes[c["kv_dtype"].get<std::string>()] = c["bytes_per_token"].get<double>();
  }
  for (const Variant& v : variants) {
    weight_bytes[v.weights] = static_cast<double>(v.engine->runner().MatrixBytes());
  }
  variants.clear();  // frees the engines before the bandwidth probe

  const double bw_after = MeasureReadBandwidth(probe_threads, size_t{1} << 30);
  const double bw = std::max(bw_before, bw_after);
  std::printf("model: %s (layers %d, hidden %d, vocab %d)\n", model_dir.c_str(),
              config.num_hidden_layers, config.hidden_size, config.vocab_size);
  std::printf(
      "measured read bandwidth %.1f GB/s (%d threads, 1 GiB; probes before / after the "
      "runs %.1f / %.1f)\n",
      bw, probe_threads, bw_before, bw_after);
  for (const auto& [wd, bytes] : weight_bytes) {
    // Decode steps/s if the matrices stream from memory once per step.
    std::printf(
        "weights %-6s: %.1f MB of matrices read per step -> memory-bound decode limit "
        "%.1f steps/s (x batch tokens/s) before K/V reads (in vs_mem_bound)\n",
        wd.c_str(), bytes / 1e6, bw * 1e9 / bytes);
  }
  std::printf("\n");
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
  std::printf("%-10s %-5s %-7s %-11s %-20s %6s %10s %12s %12s\n", "gemm", "kv", "weights",
              "cpu_isa", "phase", "size", "ms", "tokens/s", "vs_mem_bound");
  nlohmann::json j;
  j["model"] = model_dir;
  j["kv_capacity"] = capacity;
  j["read_bandwidth_gbps"] = bw;
  j["read_bandwidth_probes_gbps"] = {bw_before, bw_after};
  j["weight_bytes"] = weight_bytes;
  for (const Row& r : rows) {
    const bool decode = r.phase.rfind("decode", 0) == 0;
    // A step of batch b reads the matrices once and each sequence's K/V: --context + 1 tokens.
    const double step_bytes = weight_bytes[r.weights] + static_cast<double>(r.size) *
                                                            (context + 1) *
                                                            kv_token_bytes[r.kv_dtype];
    const double bound = bw * 1e9 / step_bytes;
    const double vs = decode ? (1e3 / r.ms) / bound : 0;
    std::printf("%-10s %-5s %-7s %-11s %-20s %6d %10.2f %12.1f %12s\n", r.gemm.c_str(),
                r.kv_dtype.c_str(), r.weights.c_str(), r.isa.c_str(), r.phase.c_str(), r.size, r.ms,
                r.tokens_per_s, decode ? (std::to_string(vs).substr(0, 5)).c_str() : "-");
    j["rows"].push_back({{"gemm", r.gemm},
                         {"kv_dtype", r.kv_dtype},
                         {"weights_dtype", r.weights},
                         {"cpu_isa", r.isa},
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
