// `duet generate`: runs the model in this process and prints the text, or JSON with
// prompt_ids, generated_ids, text, per-token top-K logprobs and timings.
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "cli/generate_flags.h"
#include "cli/model_flags.h"
#include "common/base/logging.h"
#include "common/engine/local_engine.h"
#include "common/tokenizer/chat_template.h"
#include "nlohmann/json.hpp"

namespace duet::cli {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "duet generate: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int RunGenerate() {
  const std::string model_dir = ReadModelFlags().model_dir;
  if (model_dir.empty()) {
    std::fprintf(stderr, "duet generate: --model is required\n");
    return 2;
  }
  absl::StatusOr<RequestFlags> request = ReadRequestFlags();
  if (!request.ok()) {
    std::fprintf(stderr, "duet generate: %s\n", std::string(request.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<model::EngineOptions> options = EngineOptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "duet generate: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  SetMinLogLevel(LogLevel::kWarning);
  auto engine = model::LocalEngine::Load(model_dir, *options);
  if (!engine.ok()) return Fail(engine.status());

  std::vector<int32_t> prompt_ids;
  if (request->prompt_ids) {
    prompt_ids = *request->prompt_ids;
  } else {
    if (!(*engine)->has_tokenizer()) {
      return Fail(absl::FailedPreconditionError(
          model_dir + " has no tokenizer files: --prompt needs one; give --prompt-ids"));
    }
    const PromptTextFlags text = ReadPromptTextFlags();
    std::string prompt = *request->prompt;
    if (text.chat) {
      auto chat = model::RenderChat(model::ChatTemplateOf((*engine)->tokenizer()), prompt);
      if (!chat.ok()) return Fail(chat.status());
      prompt = *chat;
    }
    auto ids = (*engine)->tokenizer().Encode(prompt, text.add_bos);
    if (!ids.ok()) return Fail(ids.status());
    prompt_ids = *ids;
  }
  model::SamplingParams params;
  params.temperature = static_cast<float>(request->temperature);
  params.top_p = static_cast<float>(request->top_p);
  params.top_k = request->top_k;
  const SamplingFlags sampling = ReadSamplingFlags();
  params.seed = sampling.seed;
  params.max_tokens = request->max_tokens;
  params.logprobs = request->logprobs;
  params.ignore_eos = sampling.ignore_eos;
  params.stop_token_ids = request->stop_ids;

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

  if (!request->json) {
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
