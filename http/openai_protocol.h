// The OpenAI-compatible wire format of the HTTP front (http_front.h), without any server:
// request JSON -> ParsedRequest (types, ranges, n, the prompts), the context/max_tokens checks once
// the prompt is tokenized, streamed text assembly (UTF-8 boundaries and `stop` strings), and the
// JSON of responses, chunks and errors. Chat messages become prompt text in
// common/tokenizer/chat_template.h.
//
//   ParsedRequest req;
//   if (std::optional<ApiError> e = ParseRequest(Endpoint::kChat, body, &req)) reply(*e);
//   DUET_ASSIGN_OR_RETURN(std::string prompt,   // common/tokenizer/chat_template.h
//                         model::RenderChat(model::ChatTemplateOf(*tokenizer), req.messages));
//   std::optional<ApiError> e = CheckLengths(&req, prompt_tokens, context_length);
//   v1::SamplingParams sp = ToSampling(req);
//   TextAssembler text(req.stop);  std::string piece = text.Add(token_bytes);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grammar/grammar_spec.h"
#include "common/sampling/sampling.h"
#include "common/tokenizer/chat_template.h"
#include "duet/v1/common.pb.h"
#include "nlohmann/json.hpp"

namespace duet::http {

enum class Endpoint { kCompletions, kChat };

// The most choices one request may ask for: n x the number of prompts.
inline constexpr int kMaxChoices = 128;

// An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http_status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;      // empty: null
  std::string code;       // empty: null
  int retry_after_s = 0;  // > 0: send Retry-After
};
std::string ErrorBody(const ApiError& e);
// The status of a failed Generate as the HTTP error a client expects: InvalidArgument 400,
// ResourceExhausted 429, Unavailable 503 (both with Retry-After), DeadlineExceeded 504,
// Cancelled 499, others 500.
ApiError ErrorFromStatus(const absl::Status& s);

using model::ChatMessage;

// The request's tools (tool_calls.h reads them and turns output into calls).
enum class ToolChoice { kNone, kAuto, kRequired, kNamed };
struct ToolRequest {
  std::vector<nlohmann::ordered_json> tools;       // the tool objects as sent
  std::vector<std::string> names;                  // each tool's function name
  std::vector<nlohmann::ordered_json> parameters;  // each one's JSON schema
  ToolChoice choice = ToolChoice::kNone;
  std::string named;     // kNamed: the function
  bool parallel = true;  // parallel_tool_calls
};

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  // Completions: the prompts, in order (a list of several is a batch: each prompt gets n
  // choices, indexed prompt * n + choice).
  struct Prompt {
    std::string text;
    std::vector<int32_t> ids;  // a prompt given as token ids
    bool is_ids = false;
  };
  std::vector<Prompt> prompts;
  std::vector<ChatMessage> messages;  // chat
  int n = 1;                          // choices per prompt
  bool echo = false;                  // completions: each choice's text starts with its prompt
  // Completions max_tokens 0 with echo: the prompt alone (scored with logprobs), no completion
  // tokens, finish_reason "length"; the backend is asked for one token, which is not shown.
  bool echo_only = false;
  int64_t max_tokens = -1;            // -1: not given
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;  // 0: off (vLLM's -1 too)
  std::optional<uint64_t> seed;
  std::vector<int32_t> stop_token_ids;  // extension (as vLLM): stop after any of these
  // As vLLM (common/sampling/sampling.h): min_p, repetition_penalty, min_tokens are extensions.
  float min_p = 0.f;
  float repetition_penalty = 1.f;
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  std::vector<compute::LogitBias> logit_bias;  // ids increasing and distinct
  int64_t min_tokens = 0;                      // <= max_tokens (CheckLengths)
  std::vector<std::string> stop;
  bool logprobs = false;  // completions: logprobs given; chat: logprobs true
  int top_logprobs = 0;   // alternatives per token
  // >= 0: the prompt's logprobs with this many alternatives (completions echo with logprobs).
  int prompt_logprobs = -1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
  bool ignore_eos = false;  // extension (as vLLM): keep generating past EOS, for benchmarks
  // As vLLM: false writes control tokens' text (<|im_start|>, ...) into the output.
  bool skip_special_tokens = true;
  // As vLLM: the matched stop string, or the text of the stop token (EOS, stop_token_ids) that
  // ended the output, is kept at its end.
  bool include_stop_str_in_output = false;
  // Structured output (structured_output.h): what the output must match.
  std::optional<grammar::GrammarSpec> grammar;
  // Chat: add_generation_prompt, continue_final_message, chat_template_kwargs (and the tools,
  // which the template renders).
  model::ChatRenderOptions chat_rendering;
  ToolRequest tools;  // chat
};

// Parses and checks the body: malformed JSON, a known field of the wrong type, values out of
// range, missing prompt/messages, and any field of the OpenAI or vLLM API that this
// server does not implement set to a value that would change the answer (functions,
// bad_words, ...) are errors naming the field; fields of neither API are ignored, as
// vLLM does. Chat's max_completion_tokens wins over max_tokens.
std::optional<ApiError> ParseRequest(Endpoint endpoint, const std::string& body,
                                     ParsedRequest* out);

// After tokenizing: the prompt must leave room in the context, max_tokens (default 16 for
// completions, the rest of the context for chat) must be in [1, context - prompt], and
// min_tokens at most max_tokens.
std::optional<ApiError> CheckLengths(ParsedRequest* req, int64_t prompt_tokens,
                                     int64_t context_length);

v1::SamplingParams ToSampling(const ParsedRequest& req);

// "stop", "length" (or null while running) from duet's finish reason.
const char* FinishReasonText(v1::FinishReason r);

// Turns token byte pieces into text that is safe to send: never splits a UTF-8 character,
// holds back text that could be the start of a stop string, and ends at the first stop string
// (emitted only with `include_stop`).
class TextAssembler {
 public:
  explicit TextAssembler(std::vector<std::string> stops, bool include_stop = false);
  // Returns the text that can be sent now.
  std::string Add(const std::string& bytes);
  // Returns what is still held back (at the end of generation).
  std::string Finish();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  bool include_stop_ = false;
  size_t max_stop_ = 0;
  std::string pending_;
  bool stopped_ = false;
};

// Length of the longest prefix of s[0, limit) that does not end inside a UTF-8 sequence.
size_t Utf8SafePrefix(const std::string& s, size_t limit);

// One generated token as the front reports it.
struct TokenOut {
  int32_t id = 0;
  std::string text;  // this token's (raw) text
  bool no_logprob = false;  // a prompt's first token: null logprob and alternatives
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;  // alternatives, best first
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // of the prompt, taken from the prefix cache (not computed)
};
nlohmann::json UsageJson(const Usage& u);

// The logprobs object of one choice: completions {tokens, token_logprobs, top_logprobs,
// text_offset}; chat {content: [{token, logprob, bytes, top_logprobs}]}.
nlohmann::json LogprobsJson(Endpoint endpoint, const std::vector<TokenOut>& tokens,
                            size_t text_offset);

// One streamed chunk ("text_completion" / "chat.completion.chunk") of choice `index`; chat's
// delta carries `tool_calls` (tool_calls.h's deltas) when not null.
// finish_reason null when empty; usage only on the final chunk; role only on a choice's first
// chat chunk.
nlohmann::json ChunkJson(Endpoint endpoint, const std::string& id, int64_t created,
                         const std::string& model, int index, const std::string& text, bool first,
                         const nlohmann::json& logprobs, const std::string& finish_reason,
                         const std::optional<Usage>& usage,
                         const nlohmann::json& tool_calls = nullptr);

// One choice of a whole response.
struct ChoiceOut {
  std::string text;
  nlohmann::json logprobs;  // null: not asked for
  std::string finish_reason;
  nlohmann::json tool_calls;  // chat: the message's tool calls; null: none
};
// The whole response of a non-streamed request; choice i has index i.
nlohmann::json ResponseJson(Endpoint endpoint, const std::string& id, int64_t created,
                            const std::string& model, const std::vector<ChoiceOut>& choices,
                            const Usage& usage);

// Serialises JSON for the wire; invalid UTF-8 becomes U+FFFD instead of throwing.
std::string Dump(const nlohmann::json& j);

}  // namespace duet::http
