#include "cli/generate_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/flag_groups.h"

ABSL_FLAG(std::string, prompt, "", "prompt text");
ABSL_FLAG(std::string, prompt_ids, "", "prompt as comma-separated token ids (instead of --prompt)");
ABSL_FLAG(int, max_tokens, 16, "maximum tokens to generate");
ABSL_FLAG(double, temperature, 0.0, "sampling temperature (0: greedy)");
ABSL_FLAG(double, top_p, 1.0, "nucleus sampling mass");
ABSL_FLAG(int, top_k, 0, "top-k sampling (0: off)");
ABSL_FLAG(int, logprobs, 0, "report the top-K log-probabilities per token");
ABSL_FLAG(std::string, stop_ids, "", "comma-separated token ids that stop generation");
ABSL_FLAG(bool, json, false, "print JSON instead of text");

ABSL_FLAG(uint64_t, seed, 0,
          "seed: generate's sampling; bench serve's arrivals and prompts (each from its own "
          "stream)");
ABSL_FLAG(bool, ignore_eos, false,
          "keep generating past EOS (bench serve always does: each request yields exactly its "
          "output length)");

ABSL_FLAG(bool, add_bos, true,
          "prepend BOS to --prompt when the model's tokenizer does (GGUF add_bos_token)");
ABSL_FLAG(bool, chat, false,
          "wrap --prompt in the model's chat template as one user message (ChatML models)");

ABSL_FLAG(std::string, server, "",
          "the server: a coordinator or serve's HOST:PORT (gRPC); bench serve also takes "
          "http://HOST:PORT (the HTTP API)");
ABSL_FLAG(int, timeout_s, 300, "deadline (s) of each request");

namespace duet::cli {
namespace {

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text, const char* flag) {
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", part, "' is not a token id (comma-separated ids)"));
    }
    ids.push_back(id);
  }
  return ids;
}

}  // namespace

std::vector<FlagGroupInfo> GenerateFlagGroups() {
  return {
      {FlagGroup::kRequest,
       "request",
       "request: prompt, sampling and output",
       {&absl::GetFlagReflectionHandle(FLAGS_prompt),
        &absl::GetFlagReflectionHandle(FLAGS_prompt_ids),
        &absl::GetFlagReflectionHandle(FLAGS_max_tokens),
        &absl::GetFlagReflectionHandle(FLAGS_temperature),
        &absl::GetFlagReflectionHandle(FLAGS_top_p), &absl::GetFlagReflectionHandle(FLAGS_top_k),
        &absl::GetFlagReflectionHandle(FLAGS_logprobs),
        &absl::GetFlagReflectionHandle(FLAGS_stop_ids),
        &absl::GetFlagReflectionHandle(FLAGS_json)}},
      {FlagGroup::kSampling,
       "sampling",
       "sampling: seed and EOS",
       {&absl::GetFlagReflectionHandle(FLAGS_seed),
        &absl::GetFlagReflectionHandle(FLAGS_ignore_eos)}},
      {FlagGroup::kPromptText,
       "prompt_text",
       "prompt text (in this process)",
       {&absl::GetFlagReflectionHandle(FLAGS_add_bos), &absl::GetFlagReflectionHandle(FLAGS_chat)}},
      {FlagGroup::kClient,
       "client",
       "server",
       {&absl::GetFlagReflectionHandle(FLAGS_server),
        &absl::GetFlagReflectionHandle(FLAGS_timeout_s)}}};
}

absl::StatusOr<RequestFlags> ReadRequestFlags() {
  RequestFlags r{.max_tokens = absl::GetFlag(FLAGS_max_tokens),
                 .temperature = absl::GetFlag(FLAGS_temperature),
                 .top_p = absl::GetFlag(FLAGS_top_p),
                 .top_k = absl::GetFlag(FLAGS_top_k),
                 .logprobs = absl::GetFlag(FLAGS_logprobs),
                 .json = absl::GetFlag(FLAGS_json)};
  const std::string text = absl::GetFlag(FLAGS_prompt);
  const std::string ids = absl::GetFlag(FLAGS_prompt_ids);
  if (text.empty() == ids.empty()) {
    return absl::InvalidArgumentError("give exactly one of --prompt and --prompt-ids");
  }
  if (!text.empty()) {
    r.prompt = text;
  } else {
    auto parsed = ParseIds(ids, "prompt-ids");
    if (!parsed.ok()) return parsed.status();
    r.prompt_ids = *std::move(parsed);
  }
  auto stop = ParseIds(absl::GetFlag(FLAGS_stop_ids), "stop-ids");
  if (!stop.ok()) return stop.status();
  r.stop_ids = *std::move(stop);
  return r;
}

SamplingFlags ReadSamplingFlags() {
  return {.seed = absl::GetFlag(FLAGS_seed), .ignore_eos = absl::GetFlag(FLAGS_ignore_eos)};
}

PromptTextFlags ReadPromptTextFlags() {
  return {.add_bos = absl::GetFlag(FLAGS_add_bos), .chat = absl::GetFlag(FLAGS_chat)};
}

ClientFlags ReadClientFlags() {
  return {.server = absl::GetFlag(FLAGS_server),
          .timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s))};
}

}  // namespace duet::cli
