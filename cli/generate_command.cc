// `duet generate`: runs the model in this process and prints the text, or JSON with
// prompt_ids, generated_ids, text, per-token top-K logprobs and timings.
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/commands.h"
#include "common/base/logging.h"
#include "common/model/chat_template.h"
#include "common/model/local_engine.h"
#include "nlohmann/json.hpp"

ABSL_DECLARE_FLAG(int64_t, kv_cache_bytes);  // node_commands.cc

ABSL_FLAG(std::string, model, "",
          "model: a directory (config.json, model.safetensors, tokenizer) or a .gguf file");
ABSL_FLAG(std::string, prompt, "", "prompt text");
ABSL_FLAG(std::string, prompt_ids, "", "prompt as comma-separated token ids (instead of --prompt)");
ABSL_FLAG(int, max_tokens, 16, "maximum tokens to generate");
ABSL_FLAG(double, temperature, 0.0, "sampling temperature (0: greedy)");
ABSL_FLAG(double, top_p, 1.0, "nucleus sampling mass");
ABSL_FLAG(int, top_k, 0, "top-k sampling (0: off)");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed");
ABSL_FLAG(int, logprobs, 0, "report the top-K log-probabilities per token");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past EOS");
ABSL_FLAG(std::string, stop_ids, "", "comma-separated token ids that stop generation");
ABSL_FLAG(bool, json, false, "print JSON instead of text");
ABSL_FLAG(std::string, device, "auto", "compute device: auto, cpu or cuda");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all cores)");
ABSL_FLAG(std::string, cpu_gemm, "invariant",
          "CPU GEMM: invariant (batch-invariant, default), bf16 (invariant too; bf16 weights "
          "on bf16 dot products, activations rounded to bf16; with --weights_dtype bf16 or "
          "native) or openblas");
ABSL_FLAG(std::string, cpu_isa, "auto",
          "CPU kernel path: auto (the best this CPU runs), scalar, avx2, avx512, avx512_vnni, "
          "avx512_bf16 or amx; a path the CPU lacks is refused");
ABSL_FLAG(
    std::string, weights_dtype, "auto",
    "weight matrices: f32 (dequantized at load; also auto), native (GGUF Q8_0/Q4_x/Q5_x/"
    "Q4_K/Q5_K/Q6_K and F16/BF16 kept as stored, other GGUF block types converted to Q8_0; cpu "
    "backend) "
    "or bf16 (every matrix in 16 bits: F16/BF16 as stored, the others rounded to bf16; cpu "
    "backend)");
ABSL_FLAG(int, block_size, 16, "KV cache block size in tokens");
ABSL_FLAG(std::string, kv_dtype, "auto",
          "KV cache dtype: f32, bf16, f16, int8, fp8 (e4m3), or auto (the compute dtype: f32 on "
          "cpu, the GEMM dtype on cuda); int8 and fp8 keep a scale per token and KV head");
ABSL_FLAG(bool, add_bos, true,
          "prepend BOS to --prompt when the model's tokenizer does (GGUF add_bos_token)");
ABSL_FLAG(bool, chat, false,
          "wrap --prompt in the model's chat template as one user message (ChatML models)");

namespace duet::cli {
namespace {

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text, const char* flag) {
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(std::string("--") + flag + ": '" + std::string(part) +
                                        "' is not a token id");
    }
    ids.push_back(id);
  }
  return ids;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "duet generate: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int RunGenerate(const std::vector<char*>& args) {
  if (args.size() > 1) {
    std::fprintf(stderr, "duet generate: unexpected argument '%s'\n", args[1]);
    return 2;
  }
  if (GenerateUsesServer()) return RunGenerateRemote();
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  if (model_dir.empty()) {
    std::fprintf(stderr, "duet generate: --model is required\n");
    return 2;
  }
  const bool have_text = !absl::GetFlag(FLAGS_prompt).empty();
  const bool have_ids = !absl::GetFlag(FLAGS_prompt_ids).empty();
  if (have_text == have_ids) {
    std::fprintf(stderr, "duet generate: give exactly one of --prompt and --prompt-ids\n");
    return 2;
  }
  SetMinLogLevel(LogLevel::kWarning);
  model::EngineOptions options{.device = absl::GetFlag(FLAGS_device),
                               .num_threads = absl::GetFlag(FLAGS_threads),
                               .cpu_gemm = absl::GetFlag(FLAGS_cpu_gemm),
                               .block_size = absl::GetFlag(FLAGS_block_size),
                               .kv_dtype = absl::GetFlag(FLAGS_kv_dtype),
                               .cpu_isa = absl::GetFlag(FLAGS_cpu_isa),
                               .weights_dtype = absl::GetFlag(FLAGS_weights_dtype)};
  // generate's pool is EngineOptions' default unless --kv_cache_bytes is set.
  if (const absl::CommandLineFlag* f = absl::FindCommandLineFlag("kv_cache_bytes");
      f != nullptr && f->CurrentValue() != f->DefaultValue()) {
    options.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  }
  auto engine = model::LocalEngine::Load(model_dir, options);
  if (!engine.ok()) return Fail(engine.status());

  std::vector<int32_t> prompt_ids;
  if (have_ids) {
    auto ids = ParseIds(absl::GetFlag(FLAGS_prompt_ids), "prompt-ids");
    if (!ids.ok()) return Fail(ids.status());
    prompt_ids = *ids;
  } else {
    if (!(*engine)->has_tokenizer()) {
      return Fail(absl::FailedPreconditionError(
          model_dir + " has no tokenizer files: --prompt needs one; give --prompt-ids"));
    }
    std::string prompt = absl::GetFlag(FLAGS_prompt);
    if (absl::GetFlag(FLAGS_chat)) {
      auto chat = model::RenderChat(model::ChatTemplateOf((*engine)->tokenizer()), prompt);
      if (!chat.ok()) return Fail(chat.status());
      prompt = *chat;
    }
    auto ids = (*engine)->tokenizer().Encode(prompt, absl::GetFlag(FLAGS_add_bos));
    if (!ids.ok()) return Fail(ids.status());
    prompt_ids = *ids;
  }
  model::SamplingParams params;
  params.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  params.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  params.top_k = absl::GetFlag(FLAGS_top_k);
  params.seed = absl::GetFlag(FLAGS_seed);
  params.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  params.logprobs = absl::GetFlag(FLAGS_logprobs);
  params.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  auto stop_ids = ParseIds(absl::GetFlag(FLAGS_stop_ids), "stop-ids");
  if (!stop_ids.ok()) return Fail(stop_ids.status());
  params.stop_token_ids = *stop_ids;

  auto result = (*engine)->Generate(prompt_ids, params);
  if (!result.ok()) return Fail(result.status());
  // Text output leaves out control tokens (BOS, EOS, <|im_end|>, ...). Without a tokenizer
  // there is no text: plain output prints the ids, --json has "text": null.
  std::optional<std::string> text;
  if ((*engine)->has_tokenizer()) {
    const model::Tokenizer& tok = (*engine)->tokenizer();
    std::vector<int32_t> shown;
    for (int32_t id : result->generated_ids) {
      if (!tok.IsControl(id)) shown.push_back(id);
    }
    auto decoded = tok.Decode(shown);
    if (!decoded.ok()) return Fail(decoded.status());
    text = *std::move(decoded);
  }

  if (!absl::GetFlag(FLAGS_json)) {
    if (text) {
      std::cout << *text << std::endl;
    } else {
      std::fprintf(stderr, "duet generate: %s has no tokenizer; printing the generated ids\n",
                   model_dir.c_str());
      std::cout << absl::StrJoin(result->generated_ids, ",") << std::endl;
    }
    return 0;
  }
  nlohmann::json j;
  j["model"] = model_dir;
  j["backend"] = (*engine)->backend().name();
  j["prompt_ids"] = result->prompt_ids;
  j["generated_ids"] = result->generated_ids;
  j["text"] = text ? nlohmann::json(*text) : nlohmann::json(nullptr);
  j["finish_reason"] = model::StopReasonName(result->stop);
  nlohmann::json lps = nlohmann::json::array();
  for (const model::SampledToken& t : result->tokens) {
    nlohmann::json e{{"id", t.id}, {"logprob", t.logprob}};
    nlohmann::json top = nlohmann::json::array();
    for (const auto& [id, lp] : t.top_logprobs) top.push_back({{"id", id}, {"logprob", lp}});
    e["top"] = top;
    lps.push_back(e);
  }
  j["logprobs"] = lps;
  j["timings"] = {{"prefill_ms", result->prefill_ms}, {"decode_ms", result->decode_ms}};
  // What one token's K/V cost: from the pool's layout, and from 2 x L x Hkv x d x b (+ scales).
  const kv::KvLayout& layout = (*engine)->pool().layout();
  const model::ModelConfig& c = (*engine)->config();
  j["kv_cache"] = {
      {"dtype", kv::KvDtypeName(layout.dtype)},
      {"scales", kv::KvScaleSchemeName(layout.dtype)},
      {"bytes_per_token", layout.BytesForTokens(1)},
      {"bytes_per_token_formula",
       kv::KvBytesPerToken(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, layout.dtype)},
      {"block_bytes", layout.BlockBytes()}};
  std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  return 0;
}

}  // namespace duet::cli
