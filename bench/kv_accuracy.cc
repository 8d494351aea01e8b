// kv_accuracy: what a narrower KV cache dtype costs in accuracy, against f32 KV on the same model
// and weights (the same CPU kernels; only the KV dtype differs); with --weights_dtypes, also what
// keeping the weight matrices in another form costs (native: GGUF blocks as stored, integer dot
// products; bf16/bf16: bf16 weights on bf16 dot products, cpu_gemm bf16), against f32 weights
// with f32 KV.
//
//   kv_accuracy --model models/smollm2-135m-instruct-q4_1.gguf [--kv_dtypes bf16,f16,int8,fp8]
//               [--weights_dtypes native,bf16,bf16/bf16]
//               [--prompts 50 --min_len 64 --max_len 1024 --gen 64]
//               [--ppl_tokens 16384 --ppl_window 1024 --ppl_chunk 128]
//               [--text_dir /usr/share/common-licenses] [--json FILE]
//
// Prompts are windows of a fixed English text (every regular file of --text_dir, by name,
// read at run time and named in the report), their lengths spread evenly over
// [--min_len, --max_len]. For each dtype:
//   - greedy agreement: each prompt generates --gen tokens greedily (free-running); reported are
//     the prompts whose tokens all equal f32's, the tokens before the first difference, and the
//     |logprob difference| of the chosen tokens over that common prefix (same context on both);
//   - perplexity over the first --ppl_tokens tokens of the text, in windows of --ppl_window
//     tokens, each prefilled in chunks of --ppl_chunk tokens so that later chunks attend over the
//     earlier chunks' K/V as the cache holds them (quantized).
// A scale study quantizes real f32 K/V (from the f32 run) with a scale per (token, kv head) and
// with one per (block of 16 tokens, kv head), and reports the error of each.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "common/base/auto_option.h"
#include "common/base/clock.h"
#include "common/base/float8.h"
#include "common/base/logging.h"
#include "common/engine/local_engine.h"
#include "common/kv/block_table.h"
#include "common/sampling/sampler.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "model directory or .gguf file");
ABSL_FLAG(std::string, kv_dtypes, "bf16,f16,int8,fp8", "KV dtypes to compare against f32");
ABSL_FLAG(std::string, weights_dtypes, "",
          "weight forms to compare against f32 weights (native, bf16, or DTYPE/GEMM for another "
          "cpu_gemm: bf16/bf16), each with f32 KV");
ABSL_FLAG(int, prompts, 50, "number of prompts");
ABSL_FLAG(int, min_len, 64, "shortest prompt (tokens)");
ABSL_FLAG(int, max_len, 1024, "longest prompt (tokens)");
ABSL_FLAG(int, gen, 64, "tokens generated per prompt");
ABSL_FLAG(int, batch, 10, "prompts decoded together");
ABSL_FLAG(int, ppl_tokens, 16384, "tokens of the text scored for perplexity");
ABSL_FLAG(int, ppl_window, 1024, "tokens per perplexity window (a fresh KV cache each)");
ABSL_FLAG(int, ppl_chunk, 128, "tokens per prefill chunk within a window");
ABSL_FLAG(std::string, text_dir, "/usr/share/common-licenses", "the text: its regular files");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all)");
ABSL_FLAG(std::string, json, "", "write the results as JSON to this file");

namespace {

using duet::kv::BlockTable;
using duet::model::LocalEngine;
using duet::model::SequenceInput;

[[noreturn]] void Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "kv_accuracy: %s: %s\n", what.c_str(), std::string(s.message()).c_str());
  std::exit(1);
}

struct Text {
  std::vector<std::string> files;
  size_t bytes = 0;
  std::string content;
};

Text ReadText(const std::string& dir) {
  Text t;
  std::vector<std::filesystem::path> paths;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_regular_file() && !e.is_symlink()) paths.push_back(e.path());
  }
  std::sort(paths.begin(), paths.end());
  for (const auto& p : paths) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    t.content += ss.str();
    t.content += "\n\n";
    t.bytes += ss.str().size();
    t.files.push_back(p.filename().string());
  }
  return t;
}

struct Generation {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
};

// `weights` is a weights_dtype, or "DTYPE/GEMM" for another cpu_gemm (bf16/bf16: bf16 weights
// on bf16 dot products).
std::unique_ptr<LocalEngine> Load(const std::string& model, const std::string& dtype,
                                  int64_t kv_bytes, const std::string& weights = "f32") {
  const size_t slash = weights.find('/');
  auto parsed = [&](auto v, const std::string& what) {
    if (!v.ok()) Die(what, v.status());
    return *std::move(v);
  };
  auto e = LocalEngine::Load(
      model,
      {.device = duet::compute::Device::kCpu,
       .num_threads = absl::GetFlag(FLAGS_threads),
       .cpu_gemm = parsed(duet::compute::ParseCpuGemm(
                              slash == std::string::npos ? "invariant" : weights.substr(slash + 1)),
                          "--weights_dtypes " + weights),
       .kv_cache_bytes = kv_bytes,
       .kv_dtype = parsed(duet::ParseOrAuto<duet::kv::KvDtype>(dtype, duet::kv::ParseKvDtype),
                          "--kv_dtypes " + dtype),
       .weights_dtype = parsed(duet::ParseOrAuto<duet::model::WeightsDtype>(
                                   weights.substr(0, slash), duet::model::ParseWeightsDtype),
                               "--weights_dtypes " + weights)});
  if (!e.ok()) Die("load " + dtype + " / weights " + weights, e.status());
  return *std::move(e);
}

// Greedy, free-running: --gen tokens per prompt, prompts decoded --batch at a time.
std::vector<Generation> Generate(LocalEngine& e, const std::vector<std::vector<int32_t>>& prompts,
                                 int gen, int batch) {
  const duet::model::SamplingParams greedy;
  std::vector<Generation> out(prompts.size());
  for (size_t g0 = 0; g0 < prompts.size(); g0 += batch) {
    const size_t g1 = std::min(prompts.size(), g0 + batch);
    std::vector<std::unique_ptr<BlockTable>> tables;
    for (size_t i = g0; i < g1; ++i) {
      tables.push_back(std::make_unique<BlockTable>(&e.pool()));
      std::vector<SequenceInput> one = {{.seq_id = static_cast<int64_t>(i),
                                         .tokens = prompts[i],
                                         .start_pos = 0,
                                         .table = tables.back().get()}};
      if (absl::Status s = tables.back()->Reserve(static_cast<int64_t>(prompts[i].size()));
          !s.ok()) {
        Die("prefill", s);
      }
      auto r = e.runner().Forward(absl::MakeSpan(one), e.pool().View());
      if (!r.ok()) Die("prefill", r.status());
      const auto t = duet::model::Sample(r->Row(0), r->vocab, greedy, 0);
      out[i].ids.push_back(t.id);
      out[i].logprobs.push_back(t.logprob);
    }
    for (int step = 1; step < gen; ++step) {
      std::vector<SequenceInput> b;
      for (size_t i = g0; i < g1; ++i) {
        BlockTable* table = tables[i - g0].get();
        if (absl::Status s = table->Reserve(table->num_tokens() + 1); !s.ok()) Die("decode", s);
        b.push_back({.seq_id = static_cast<int64_t>(i),
                     .tokens = {out[i].ids.back()},
                     .start_pos = static_cast<int32_t>(table->num_tokens()),
                     .table = table});
      }
      auto r = e.runner().Forward(absl::MakeSpan(b), e.pool().View());
      if (!r.ok()) Die("decode", r.status());
      for (size_t i = g0; i < g1; ++i) {
        const auto t = duet::model::Sample(r->Row(i - g0), r->vocab, greedy, step);
        out[i].ids.push_back(t.id);
        out[i].logprobs.push_back(t.logprob);
      }
    }
    for (auto& t : tables) {
      if (absl::Status s = t->Release(); !s.ok()) Die("release", s);
    }
  }
  return out;
}

struct Perplexity {
  double nll_sum = 0;
  int64_t scored = 0;
  double ppl() const { return std::exp(nll_sum / static_cast<double>(scored)); }
};

// log-softmax(row)[target], in double.
double LogProb(const float* row, int vocab, int32_t target) {
  double mx = row[0];
  for (int j = 1; j < vocab; ++j) mx = std::max(mx, static_cast<double>(row[j]));
  double sum = 0;
  for (int j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(row[j]) - mx);
  return static_cast<double>(row[target]) - mx - std::log(sum);
}

Perplexity Score(LocalEngine& e, const std::vector<int32_t>& tokens, int window, int chunk) {
  Perplexity p;
  for (size_t w0 = 0; w0 + 1 < tokens.size(); w0 += window) {
    const size_t w1 = std::min(tokens.size(), w0 + window);
    BlockTable table(&e.pool());
    for (size_t c0 = w0; c0 < w1; c0 += chunk) {
      const size_t c1 = std::min(w1, c0 + chunk);
      std::vector<SequenceInput> b = {
          {.seq_id = 1,
           .tokens = std::vector<int32_t>(tokens.begin() + c0, tokens.begin() + c1),
           .start_pos = static_cast<int32_t>(c0 - w0),
           .table = &table,
           .all_logits = true}};
      if (absl::Status s = table.Reserve(static_cast<int64_t>(c1 - w0)); !s.ok()) Die("score", s);
      auto r = e.runner().Forward(absl::MakeSpan(b), e.pool().View());
      if (!r.ok()) Die("score", r.status());
      for (size_t i = c0; i < c1 && i + 1 < w1; ++i) {
        p.nll_sum -= LogProb(r->Row(i - c0), r->vocab, tokens[i + 1]);
        ++p.scored;
      }
    }
    if (absl::Status s = table.Release(); !s.ok()) Die("release", s);
  }
  return p;
}

// Quantization error of real K/V rows (each [head_dim]) with one scale per row, and with one
// scale per group of `group` consecutive tokens of the same kv head.
struct ScaleStudy {
  double rel_rms_token = 0, rel_rms_block = 0;
};

ScaleStudy StudyScales(duet::kv::KvDtype dtype, const std::vector<std::vector<float>>& heads,
                       int group) {
  const float qmax = dtype == duet::kv::KvDtype::kInt8 ? 127.f : duet::kFp8E4M3Max;
  auto quant = [&](float x, float scale) {
    if (scale <= 0) return 0.f;
    if (dtype == duet::kv::KvDtype::kInt8) {
      return std::clamp(std::nearbyint(x / scale), -127.f, 127.f) * scale;
    }
    return duet::Fp8E4M3ToFloat(duet::FloatToFp8E4M3(x / scale)) * scale;
  };
  double err_t = 0, err_b = 0, norm = 0;
  for (size_t g0 = 0; g0 < heads.size(); g0 += group) {
    const size_t g1 = std::min(heads.size(), g0 + group);
    float block_max = 0;
    for (size_t r = g0; r < g1; ++r) {
      for (float x : heads[r]) block_max = std::max(block_max, std::fabs(x));
    }
    for (size_t r = g0; r < g1; ++r) {
      float row_max = 0;
      for (float x : heads[r]) row_max = std::max(row_max, std::fabs(x));
      for (float x : heads[r]) {
        const double et = x - quant(x, row_max / qmax), eb = x - quant(x, block_max / qmax);
        err_t += et * et;
        err_b += eb * eb;
        norm += static_cast<double>(x) * x;
      }
    }
  }
  return {std::sqrt(err_t / norm), std::sqrt(err_b / norm)};
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  duet::SetMinLogLevel(duet::LogLevel::kWarning);
  const std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) {
    std::fprintf(stderr, "kv_accuracy: --model is required\n");
    return 2;
  }
  const int n_prompts = absl::GetFlag(FLAGS_prompts), gen = absl::GetFlag(FLAGS_gen);
  const int min_len = absl::GetFlag(FLAGS_min_len), max_len = absl::GetFlag(FLAGS_max_len);
  const Text text = ReadText(absl::GetFlag(FLAGS_text_dir));
  // (kv dtype, weights dtype); the first is the reference.
  std::vector<std::pair<std::string, std::string>> variants = {{"f32", "f32"}};
  for (absl::string_view d :
       absl::StrSplit(absl::GetFlag(FLAGS_kv_dtypes), ',', absl::SkipWhitespace())) {
    variants.emplace_back(std::string(d), "f32");
  }
  for (absl::string_view w :
       absl::StrSplit(absl::GetFlag(FLAGS_weights_dtypes), ',', absl::SkipWhitespace())) {
    variants.emplace_back("f32", std::string(w));
  }
  const int64_t kv_bytes = 2ll << 30;

  std::unique_ptr<LocalEngine> ref = Load(model, "f32", kv_bytes);
  auto encoded = ref->tokenizer().Encode(text.content, /*add_bos=*/false);
  if (!encoded.ok()) Die("tokenize", encoded.status());
  const std::vector<int32_t>& all = *encoded;
  if (static_cast<int>(all.size()) < max_len + 1) {
    std::fprintf(stderr, "kv_accuracy: the text has only %zu tokens\n", all.size());
    return 1;
  }
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n_prompts; ++i) {
    const int len = n_prompts == 1 ? max_len : min_len + (max_len - min_len) * i / (n_prompts - 1);
    const size_t off = (static_cast<size_t>(i) * 104729u) % (all.size() - len);
    prompts.emplace_back(all.begin() + off, all.begin() + off + len);
  }
  const std::vector<int32_t> ppl_text(
      all.begin(), all.begin() + std::min<size_t>(all.size(), absl::GetFlag(FLAGS_ppl_tokens)));
  std::printf(
      "model %s; text: %zu files of %s (%zu bytes, %zu tokens); %d prompts of %d-%d "
      "tokens, %d generated each; perplexity over %zu tokens (windows %d, chunks %d)\n",
      model.c_str(), text.files.size(), absl::GetFlag(FLAGS_text_dir).c_str(), text.bytes,
      all.size(), n_prompts, min_len, max_len, gen, ppl_text.size(),
      absl::GetFlag(FLAGS_ppl_window), absl::GetFlag(FLAGS_ppl_chunk));

  nlohmann::json j;
  j["model"] = model;
  j["text"] = {{"dir", absl::GetFlag(FLAGS_text_dir)},
               {"files", text.files},
               {"bytes", text.bytes},
               {"tokens", all.size()}};
  j["prompts"] = {{"count", n_prompts}, {"min_len", min_len}, {"max_len", max_len}, {"gen", gen}};
  std::vector<Generation> ref_gen;
  double ref_ppl = 0;
  std::printf("\n%-5s %-7s %9s %8s %11s %11s %13s %13s %10s %9s\n", "kv", "weights", "bytes/tok",
              "exact", "agree_tok", "mean_prefix", "max|dlogp|", "mean|dlogp|", "ppl",
              "ppl_vs_f32");
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    const auto& [dtype, weights] = variants[vi];
    std::unique_ptr<LocalEngine> owned;
    LocalEngine* e = ref.get();
    if (vi > 0) {
      owned = Load(model, dtype, kv_bytes, weights);
      e = owned.get();
    }
    duet::Stopwatch sw;
    std::vector<Generation> g = Generate(*e, prompts, gen, absl::GetFlag(FLAGS_batch));
    const Perplexity p =
        Score(*e, ppl_text, absl::GetFlag(FLAGS_ppl_window), absl::GetFlag(FLAGS_ppl_chunk));
    int exact = 0;
    int64_t agreed = 0, compared = 0;
    double max_d = 0, sum_d = 0;
    if (vi == 0) {
      ref_gen = g;
      ref_ppl = p.ppl();
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      size_t k = 0;
      while (k < g[i].ids.size() && g[i].ids[k] == ref_gen[i].ids[k]) {
        const double d = std::fabs(static_cast<double>(g[i].logprobs[k]) - ref_gen[i].logprobs[k]);
        max_d = std::max(max_d, d);
        sum_d += d;
        ++compared;
        ++k;
      }
      agreed += static_cast<int64_t>(k);
      if (k == g[i].ids.size()) ++exact;
    }
    const double bpt = static_cast<double>(e->pool().layout().BytesForTokens(1));
    const double agree = static_cast<double>(agreed) / (static_cast<double>(prompts.size()) * gen);
    const double mean_d = compared ? sum_d / static_cast<double>(compared) : 0;
    std::printf("%-5s %-7s %9.0f %5d/%-3d %10.2f%% %11.1f %13.5f %13.5f %10.4f %+8.3f%%\n",
                dtype.c_str(), weights.c_str(), bpt, exact, n_prompts, 100 * agree,
                static_cast<double>(agreed) / static_cast<double>(prompts.size()), max_d, mean_d,
                p.ppl(), 100 * (p.ppl() / ref_ppl - 1));
    std::fflush(stdout);
    j["dtypes"].push_back({{"kv_dtype", dtype},
                           {"weights_dtype", weights},
                           {"matrix_bytes", e->runner().MatrixBytes()},
                           {"bytes_per_token", bpt},
                           {"exact_prompts", exact},
                           {"token_agreement", agree},
                           {"max_abs_logprob_diff", max_d},
                           {"mean_abs_logprob_diff", mean_d},
                           {"perplexity", p.ppl()},
                           {"perplexity_tokens_scored", p.scored},
                           {"perplexity_vs_f32", p.ppl() / ref_ppl - 1},
                           {"seconds", sw.ElapsedMs() / 1e3}});
  }

  // Scale study: real K/V of one 1024-token window from the f32 pool.
  {
    LocalEngine& e = *ref;
    const duet::kv::KvLayout& l = e.pool().layout();
    BlockTable table(&e.pool());
    const int n = std::min<int>(1024, static_cast<int>(all.size()));
    std::vector<SequenceInput> b = {{.seq_id = 1,
                                     .tokens = std::vector<int32_t>(all.begin(), all.begin() + n),
                                     .start_pos = 0,
                                     .table = &table,
                                     .want_logits = false}};
    if (absl::Status s = table.Reserve(n); !s.ok()) Die("scale study", s);
    if (auto r = e.runner().Forward(absl::MakeSpan(b), e.pool().View()); !r.ok()) {
      Die("scale study", r.status());
    }
    const duet::kv::KvCacheView view = e.pool().View();
    std::printf("\nscale study (real f32 K/V of %d tokens, %d layers): relative RMS error\n", n,
                l.num_layers);
    std::printf("%-5s %-2s %14s %18s\n", "kv", "", "per token+head", "per 16-token block");
    for (duet::kv::KvDtype dt : {duet::kv::KvDtype::kInt8, duet::kv::KvDtype::kFp8E4M3}) {
      for (int half = 0; half < 2; ++half) {
        double t_sum = 0, b_sum = 0;
        for (int layer = 0; layer < l.num_layers; ++layer) {
          for (int h = 0; h < l.num_kv_heads; ++h) {
            std::vector<std::vector<float>> rows;
            for (int t = 0; t < n; ++t) {
              const auto blk = table.blocks()[t / l.block_size];
              const float* p = (half ? view.ValuePtr<float>(layer, blk, t % l.block_size)
                                     : view.KeyPtr<float>(layer, blk, t % l.block_size)) +
                               h * l.head_dim;
              rows.emplace_back(p, p + l.head_dim);
            }
            const ScaleStudy s = StudyScales(dt, rows, 16);
            t_sum += s.rel_rms_token;
            b_sum += s.rel_rms_block;
          }
        }
        const double m = l.num_layers * l.num_kv_heads;
        std::printf("%-5s %-2s %14.5f %18.5f\n", duet::kv::KvDtypeName(dt), half ? "V" : "K",
                    t_sum / m, b_sum / m);
        j["scale_study"].push_back({{"kv_dtype", duet::kv::KvDtypeName(dt)},
                                    {"half", half ? "V" : "K"},
                                    {"rel_rms_per_token_head", t_sum / m},
                                    {"rel_rms_per_block16_head", b_sum / m}});
      }
    }
    if (absl::Status s = table.Release(); !s.ok()) Die("release", s);
  }
  if (!absl::GetFlag(FLAGS_json).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_json)) << j.dump(2) << "\n";
  }
  return 0;
}
