#include "http/openai_protocol.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/error_reason.h"
#include "http/chat_request.h"
#include "http/request_errors.h"
#include "http/structured_output.h"
#include "proto/sampling_convert.h"

namespace duet::http {
namespace {

using nlohmann::json;

}  // namespace

std::string ErrorBody(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return Dump(json{{"error", err}});
}

ApiError ErrorFromStatus(const absl::Status& s) {
  ApiError e;
  e.message = std::string(s.message());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      e.http_status = 400;
      break;
    case absl::StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.code = "no_capacity";
      e.retry_after_s = 1;
      break;
    case absl::StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "server_error";
      e.code = "unavailable";
      e.retry_after_s = 1;
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      e.type = "server_error";
      e.code = "timeout";
      break;
    case absl::StatusCode::kCancelled:
      e.http_status = 499;
      e.type = "server_error";
      e.code = "cancelled";
      break;
    case absl::StatusCode::kUnimplemented:
      e.http_status = 400;
      e.code = "unsupported";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  // A known cause is the machine-readable code (e.g. "sender_fenced").
  if (const ErrorReason reason = ReasonOf(s); reason != ErrorReason::kNone) {
    e.code = ErrorReasonName(reason);
  }
  return e;
}

namespace {

// A field of the OpenAI or vLLM API this server does not implement, and the values that mean
// "not used" (absent and null always do): any other value is refused naming the field.
struct Unimplemented {
  const char* field;
  bool (*no_op)(const json& v);
  const char* why;
};

bool Empty(const json& v) {
  if (v.is_string()) return v.get_ref<const std::string&>().empty();
  return (v.is_array() || v.is_object()) && v.empty();
}
bool IsFalse(const json& v) { return v.is_boolean() && !v.get<bool>(); }
bool IsTrue(const json& v) { return v.is_boolean() && v.get<bool>(); }
bool IsOne(const json& v) { return v.is_number() && v.get<double>() == 1; }
bool Never(const json&) { return false; }

const Unimplemented kUnimplemented[] = {
    {"length_penalty", IsOne, "length_penalty is not supported (1 only)"},
    {"suffix", Empty, "suffix is not supported"},
    // vLLM's prompt_logprobs (0 too: the prompt tokens' own logprobs); completions echo with
    // logprobs gives them in OpenAI's shape.
    {"prompt_logprobs", Never,
     "prompt_logprobs is not supported (completions echo with logprobs gives them)"},
    {"use_beam_search", IsFalse, "beam search is not supported"},
    {"chat_template", Never, "a per-request chat template is not supported"},
    {"bad_words", Empty, "bad_words is not supported"},
    {"allowed_token_ids", Empty, "allowed_token_ids is not supported"},
    {"truncate_prompt_tokens", Never, "truncate_prompt_tokens is not supported"},
    {"spaces_between_special_tokens", IsTrue,
     "spaces_between_special_tokens false is not supported"},
    {"logits_processors", Empty, "logits_processors are not supported"},
};

std::optional<ApiError> RefuseUnimplemented(const json& j) {
  for (const Unimplemented& u : kUnimplemented) {
    auto it = j.find(u.field);
    if (it == j.end() || it->is_null() || u.no_op(*it)) continue;
    return ApiError{.message = absl::StrCat("'", u.field, "': ", u.why),
                    .param = u.field,
                    .code = "unsupported"};
  }
  return std::nullopt;
}

// min_p, the penalties, logit_bias and min_tokens, with vLLM's ranges (logit_bias: OpenAI's).
std::optional<ApiError> ParseSamplingExtras(const json& j, ParsedRequest* out) {
  double min_p = 0, repetition = 1, presence = 0, frequency = 0;
  if (auto e = GetNumber(j, "min_p", 0, 1, &min_p)) return e;
  if (auto e =
          GetNumber(j, "repetition_penalty", 0, std::numeric_limits<double>::max(), &repetition)) {
    return e;
  }
  if (repetition == 0) {
    return Invalid("'repetition_penalty' must be > 0", "repetition_penalty", "invalid_value");
  }
  if (auto e = GetNumber(j, "presence_penalty", -2, 2, &presence)) return e;
  if (auto e = GetNumber(j, "frequency_penalty", -2, 2, &frequency)) return e;
  out->min_p = static_cast<float>(min_p);
  out->repetition_penalty = static_cast<float>(repetition);
  out->presence_penalty = static_cast<float>(presence);
  out->frequency_penalty = static_cast<float>(frequency);
  int64_t min_tokens = 0;
  if (auto e = GetInt(j, "min_tokens", 0, std::numeric_limits<int32_t>::max(), &min_tokens)) {
    return e;
  }
  out->min_tokens = min_tokens;
  // logit_bias: {"<token id>": bias in [-100, 100]}; the ids are checked against the vocabulary
  // once the request reaches the model (an unknown id is a 400 too).
  auto it = j.find("logit_bias");
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return WrongType("logit_bias", "an object of token id to bias", *it);
  for (const auto& [key, value] : it->items()) {
    int64_t id = -1;
    if (!absl::SimpleAtoi(key, &id) || id < 0 || id > std::numeric_limits<int32_t>::max()) {
      return Invalid(absl::StrCat("logit_bias key '", key, "' is not a token id"), "logit_bias",
                     "invalid_value");
    }
    if (!value.is_number()) return WrongType("logit_bias[]", "a number", value);
    const double bias = value.get<double>();
    if (!(bias >= -100 && bias <= 100)) {
      return Invalid(
          absl::StrCat("logit_bias of token ", id, " must be in [-100, 100], got ", bias),
          "logit_bias", "invalid_value");
    }
    out->logit_bias.push_back({.id = static_cast<int32_t>(id), .bias = static_cast<float>(bias)});
  }
  std::sort(out->logit_bias.begin(), out->logit_bias.end(),
            [](const compute::LogitBias& a, const compute::LogitBias& b) { return a.id < b.id; });
  for (size_t i = 1; i < out->logit_bias.size(); ++i) {
    if (out->logit_bias[i - 1].id == out->logit_bias[i].id) {
      return Invalid(absl::StrCat("logit_bias names token ", out->logit_bias[i].id, " twice"),
                     "logit_bias", "invalid_value");
    }
  }
  return std::nullopt;
}
}  // namespace

std::optional<ApiError> ParseRequest(Endpoint endpoint, const std::string& body,
                                     ParsedRequest* out) {
  *out = ParsedRequest();
  out->endpoint = endpoint;
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return Invalid("the request body is not valid JSON", "", "invalid_json");
  }
  if (!j.is_object()) return Invalid("the request body must be a JSON object", "", "invalid_json");
  if (auto e = RefuseUnimplemented(j)) return e;
  if (auto e = ParseStructuredOutput(j, &out->grammar)) return e;
  if (auto e = ParseToolFields(endpoint, j, body, out)) return e;
  if (auto e = ParseChatRendering(endpoint, j, &out->chat_rendering)) return e;

  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return WrongType("model", "a string", *it);
    out->model = it->get<std::string>();
  }
  int64_t n = 1;
  if (auto e = GetInt(j, "n", 1, kMaxChoices, &n)) return e;
  out->n = static_cast<int>(n);
  int64_t best_of = 1;
  if (auto e = GetInt(j, "best_of", 1, kMaxChoices, &best_of)) return e;
  if (best_of != 1 && best_of != n) {
    return Invalid("best_of other than n (ranking choices by likelihood) is not supported",
                   "best_of", "unsupported");
  }
  if (auto e = GetBool(j, "echo", &out->echo)) return e;
  if (out->echo && endpoint == Endpoint::kChat) {
    return Invalid("'echo' on chat completions is not supported", "echo", "unsupported");
  }

  if (endpoint == Endpoint::kCompletions) {
    auto it = j.find("prompt");
    if (it == j.end() || it->is_null()) return Invalid("'prompt' is required", "prompt");
    // One prompt (a string or an array of token ids), or a list of them.
    const json& p = *it;
    const bool batch = p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array());
    std::vector<const json*> items;
    if (batch) {
      for (const json& e : p) items.push_back(&e);
    } else {
      items.push_back(&p);
    }
    if (items.size() * n > static_cast<size_t>(kMaxChoices)) {
      return Invalid(absl::StrCat(items.size(), " prompts x n = ", n, " is ", items.size() * n,
                                  " choices; at most ", kMaxChoices, " per request"),
                     batch ? "prompt" : "n", "invalid_value");
    }
    for (size_t i = 0; i < items.size(); ++i) {
      const json& q = *items[i];
      const std::string name = batch ? absl::StrCat("prompt[", i, "]") : "prompt";
      ParsedRequest::Prompt prompt;
      if (q.is_string()) {
        prompt.text = q.get<std::string>();
        if (prompt.text.empty())
          return Invalid(absl::StrCat("'", name, "' is empty"), name, "invalid_value");
      } else if (q.is_array()) {
        if (q.empty()) return Invalid(absl::StrCat("'", name, "' is empty"), name, "invalid_value");
        for (const json& t : q) {
          if (!t.is_number_integer() && !t.is_number_unsigned()) {
            return WrongType(name,
                             batch ? "an array of integer token ids (a list of prompts holds "
                                     "prompts of one kind)"
                                   : "a string or an array of integer token ids",
                             t);
          }
          const int64_t id = t.get<int64_t>();
          if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
            return Invalid(absl::StrCat("token id ", id, " is out of range"), name,
                           "invalid_value");
          }
          prompt.ids.push_back(static_cast<int32_t>(id));
        }
        prompt.is_ids = true;
      } else {
        return WrongType(name,
                         batch ? "a string or an array of token ids"
                               : "a string, an array of token ids or a list of prompts",
                         q);
      }
      if (batch && i > 0 && prompt.is_ids != out->prompts[0].is_ids) {
        return WrongType(name, out->prompts[0].is_ids ? "an array of token ids" : "a string", q);
      }
      out->prompts.push_back(std::move(prompt));
    }
    // logprobs: an integer count of alternatives (0..20).
    int64_t lp = 0;
    bool has_lp = false;
    if (auto e = GetInt(j, "logprobs", 0, 20, &lp, &has_lp)) return e;
    out->logprobs = has_lp;
    out->top_logprobs = static_cast<int>(lp);
    // echo with logprobs: the prompt's tokens come first, scored (the first has no logprob).
    if (out->echo && out->logprobs) out->prompt_logprobs = out->top_logprobs;
  } else {
    if (auto e = ParseMessages(j, &out->messages)) return e;
    if (auto e = GetBool(j, "logprobs", &out->logprobs)) return e;
    int64_t top = 0;
    bool has_top = false;
    if (auto e = GetInt(j, "top_logprobs", 0, 20, &top, &has_top)) return e;
    if (has_top && !out->logprobs) {
      return Invalid("'top_logprobs' needs 'logprobs': true", "top_logprobs", "invalid_value");
    }
    out->top_logprobs = static_cast<int>(top);
  }

  // max_tokens (chat also accepts max_completion_tokens); the upper bound is the context,
  // checked once the prompt is tokenized.
  bool has_max = false;
  int64_t max_tokens = -1;
  if (auto e =
          GetInt(j, "max_tokens", 0, std::numeric_limits<int32_t>::max(), &max_tokens, &has_max)) {
    return e;
  }
  if (has_max && max_tokens == 0) {
    // As vLLM: the prompt alone, scored (lm-evaluation-harness's log-likelihood requests).
    if (endpoint != Endpoint::kCompletions || !out->echo) {
      return Invalid("'max_tokens' 0 needs completions 'echo': true (the prompt alone, scored)",
                     "max_tokens", "invalid_value");
    }
    out->echo_only = true;
    max_tokens = 1;  // the backend computes the prompt and samples a token nobody is shown
  }
  if (endpoint == Endpoint::kChat) {
    // As in vLLM, max_completion_tokens wins when both are given.
    int64_t completion_tokens = -1;
    bool has_completion = false;
    if (auto e = GetInt(j, "max_completion_tokens", 1, std::numeric_limits<int32_t>::max(),
                        &completion_tokens, &has_completion)) {
      return e;
    }
    if (has_completion) {
      max_tokens = completion_tokens;
      has_max = true;
    }
  }
  out->max_tokens = has_max ? max_tokens : -1;
  double temperature = 1.0, top_p = 1.0;
  if (auto e = GetNumber(j, "temperature", 0, 2, &temperature)) return e;
  if (auto e = GetNumber(j, "top_p", 0, 1, &top_p)) return e;
  if (top_p == 0) top_p = 1e-6;  // OpenAI accepts 0: the most likely token only
  out->temperature = static_cast<float>(temperature);
  out->top_p = static_cast<float>(top_p);
  if (auto it = j.find("seed"); it != j.end() && !it->is_null()) {
    if (it->is_number_unsigned()) {
      out->seed = it->get<uint64_t>();
    } else if (it->is_number_integer()) {
      out->seed = static_cast<uint64_t>(it->get<int64_t>());  // negative seeds wrap
    } else {
      return WrongType("seed", "an integer", *it);
    }
  }
  // top_k as vLLM has it: -1 (or 0) is off.
  int64_t top_k = 0;
  if (auto e = GetInt(j, "top_k", -1, std::numeric_limits<int32_t>::max(), &top_k)) return e;
  out->top_k = top_k > 0 ? static_cast<int>(top_k) : 0;
  if (auto it = j.find("stop_token_ids"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return WrongType("stop_token_ids", "an array of token ids", *it);
    for (const json& t : *it) {
      if (!t.is_number_integer() && !t.is_number_unsigned()) {
        return WrongType("stop_token_ids[]", "an integer token id", t);
      }
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
        return Invalid(absl::StrCat("token id ", id, " is out of range"), "stop_token_ids",
                       "invalid_value");
      }
      out->stop_token_ids.push_back(static_cast<int32_t>(id));
    }
  }
  if (auto e = ParseSamplingExtras(j, out)) return e;
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      out->stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > 4) return Invalid("'stop' holds at most 4 strings", "stop", "invalid_value");
      for (const json& s : *it) {
        if (!s.is_string()) return WrongType("stop[]", "a string", s);
        out->stop.push_back(s.get<std::string>());
      }
    } else {
      return WrongType("stop", "a string or an array of strings", *it);
    }
    for (const std::string& s : out->stop) {
      if (s.empty()) return Invalid("'stop' strings must not be empty", "stop", "invalid_value");
    }
  }
  if (auto e = GetBool(j, "stream", &out->stream)) return e;
  if (auto e = GetBool(j, "ignore_eos", &out->ignore_eos)) return e;
  if (auto e = GetBool(j, "skip_special_tokens", &out->skip_special_tokens)) return e;
  if (auto e = GetBool(j, "include_stop_str_in_output", &out->include_stop_str_in_output)) {
    return e;
  }
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return WrongType("stream_options", "an object", *it);
    if (!out->stream) {  // as vLLM: they would silently do nothing
      return Invalid("'stream_options' can only be given with 'stream': true", "stream_options",
                     "invalid_value");
    }
    if (auto e = GetBool(*it, "include_usage", &out->include_usage)) return e;
  }
  return std::nullopt;
}

std::optional<ApiError> CheckLengths(ParsedRequest* req, int64_t prompt_tokens,
                                     int64_t context_length) {
  if (prompt_tokens >= context_length) {
    return Invalid(absl::StrCat("This model's maximum context length is ", context_length,
                                " tokens; the prompt has ", prompt_tokens,
                                " tokens, leaving no room to generate"),
                   req->endpoint == Endpoint::kChat ? "messages" : "prompt",
                   "context_length_exceeded");
  }
  const int64_t room = context_length - prompt_tokens;
  if (req->max_tokens < 0) {
    req->max_tokens = req->endpoint == Endpoint::kCompletions ? std::min<int64_t>(16, room) : room;
  }
  if (req->max_tokens > room) {
    return Invalid(
        absl::StrCat("max_tokens is ", req->max_tokens, " but the context of ", context_length,
                     " tokens leaves ", room, " after the prompt's ", prompt_tokens),
        "max_tokens", "context_length_exceeded");
  }
  if (req->min_tokens > req->max_tokens) {
    return Invalid(absl::StrCat("min_tokens (", req->min_tokens, ") must be at most max_tokens (",
                                req->max_tokens, ")"),
                   "min_tokens", "invalid_value");
  }
  return std::nullopt;
}

v1::SamplingParams ToSampling(const ParsedRequest& req) {
  v1::SamplingParams p;
  p.set_temperature(req.temperature);
  p.set_top_p(req.top_p >= 1.0f ? 0.0f : req.top_p);
  if (req.seed) p.set_seed(*req.seed);
  if (req.prompt_logprobs >= 0) p.set_prompt_logprobs(req.prompt_logprobs);
  p.set_top_k(req.top_k);
  p.mutable_stop_token_ids()->Assign(req.stop_token_ids.begin(), req.stop_token_ids.end());
  p.set_max_tokens(static_cast<int32_t>(req.max_tokens));
  p.set_logprobs(req.top_logprobs);
  p.set_ignore_eos(req.ignore_eos);
  p.set_min_p(req.min_p);
  p.set_repetition_penalty(req.repetition_penalty);
  p.set_presence_penalty(req.presence_penalty);
  p.set_frequency_penalty(req.frequency_penalty);
  for (const compute::LogitBias& b : req.logit_bias) {
    v1::LogitBias* e = p.add_logit_bias();
    e->set_token_id(b.id);
    e->set_bias(b.bias);
  }
  p.set_min_tokens(static_cast<int32_t>(req.min_tokens));
  if (req.grammar.has_value()) *p.mutable_grammar() = rpc::GrammarToProto(*req.grammar);
  return p;
}

const char* FinishReasonText(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_MAX_TOKENS:
      return "length";
    case v1::FINISH_REASON_EOS:
    case v1::FINISH_REASON_STOP_TOKEN:
      return "stop";
    default:
      return "";
  }
}

size_t Utf8SafePrefix(const std::string& s, size_t limit) {
  limit = std::min(limit, s.size());
  // Look back at most 3 bytes for the lead byte of a sequence that runs past `limit`.
  for (size_t back = 1; back <= 3 && back <= limit; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[limit - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking
    size_t len = 1;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
    }
    return len > back ? limit - back : limit;
  }
  return limit;
}

TextAssembler::TextAssembler(std::vector<std::string> stops, bool include_stop)
    : stops_(std::move(stops)), include_stop_(include_stop) {
  for (const std::string& s : stops_) max_stop_ = std::max(max_stop_, s.size());
}

std::string TextAssembler::Add(const std::string& bytes) {
  if (stopped_) return "";
  pending_ += bytes;
  size_t first = std::string::npos;
  size_t end = std::string::npos;  // just past the stop string that starts first
  for (const std::string& s : stops_) {
    const size_t at = pending_.find(s);
    if (at < first) {
      first = at;
      end = at + s.size();
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, include_stop_ ? end : first);
    pending_.clear();
    return out;
  }
  const size_t hold = max_stop_ > 0 ? max_stop_ - 1 : 0;
  if (pending_.size() <= hold) return "";
  const size_t n = Utf8SafePrefix(pending_, pending_.size() - hold);
  std::string out = pending_.substr(0, n);
  pending_.erase(0, n);
  return out;
}

std::string TextAssembler::Finish() {
  std::string out;
  out.swap(pending_);
  return stopped_ ? "" : out;
}

nlohmann::json UsageJson(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", json{{"cached_tokens", u.cached_tokens}}}};
}

namespace {
// A logprob as JSON: a token structured output masked out has -inf, which JSON cannot carry
// (nlohmann writes null); vLLM reports such a one as -9999.0, and so does duet.
double LogprobValue(float lp) { return std::max(static_cast<double>(lp), -9999.0); }
}  // namespace

nlohmann::json LogprobsJson(Endpoint endpoint, const std::vector<TokenOut>& tokens,
                            size_t text_offset) {
  if (endpoint == Endpoint::kChat) {
    json content = json::array();
    for (const TokenOut& t : tokens) {
      json top = json::array();
      for (const auto& [text, lp] : t.top) {
        top.push_back({{"token", text},
                       {"logprob", LogprobValue(lp)},
                       {"bytes", std::vector<int>(text.begin(), text.end())}});
      }
      std::vector<int> bytes;
      for (unsigned char c : t.text) bytes.push_back(c);
      content.push_back({{"token", t.text},
                         {"logprob", LogprobValue(t.logprob)},
                         {"bytes", bytes},
                         {"top_logprobs", top}});
    }
    return json{{"content", content}};
  }
  json toks = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (const TokenOut& t : tokens) {
    toks.push_back(t.text);
    lps.push_back(t.no_logprob ? json(nullptr) : json(LogprobValue(t.logprob)));
    json top = json::object();
    for (const auto& [text, lp] : t.top) top[text] = LogprobValue(lp);
    tops.push_back(t.no_logprob ? json(nullptr) : top);
    offs.push_back(text_offset);
    text_offset += t.text.size();
  }
  return json{
      {"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

nlohmann::json ChunkJson(Endpoint endpoint, const std::string& id, int64_t created,
                         const std::string& model, int index, const std::string& text, bool first,
                         const nlohmann::json& logprobs, const std::string& finish_reason,
                         const std::optional<Usage>& usage, const nlohmann::json& tool_calls) {
  json choice = {{"index", index},
                 {"logprobs", logprobs},
                 {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}};
  json out = {{"id", id}, {"created", created}, {"model", model}};
  if (endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && tool_calls.is_null())) delta["content"] = text;
    if (!tool_calls.is_null()) delta["tool_calls"] = tool_calls;
    choice["delta"] = delta;
    out["object"] = "chat.completion.chunk";
  } else {
    choice["text"] = text;
    out["object"] = "text_completion";
  }
  out["choices"] = json::array({choice});
  if (usage) out["usage"] = UsageJson(*usage);
  return out;
}

nlohmann::json ResponseJson(Endpoint endpoint, const std::string& id, int64_t created,
                            const std::string& model, const std::vector<ChoiceOut>& choices,
                            const Usage& usage) {
  json out = {{"id", id}, {"created", created}, {"model", model}};
  out["object"] = endpoint == Endpoint::kChat ? "chat.completion" : "text_completion";
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceOut& c = choices[i];
    json choice = {{"index", i}, {"logprobs", c.logprobs}, {"finish_reason", c.finish_reason}};
    if (endpoint == Endpoint::kChat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      if (!c.tool_calls.is_null()) {
        // As OpenAI: a message of calls alone has no content.
        if (c.text.empty()) choice["message"]["content"] = nullptr;
        choice["message"]["tool_calls"] = c.tool_calls;
      }
    } else {
      choice["text"] = c.text;
    }
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  out["usage"] = UsageJson(usage);
  return out;
}

std::string Dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace duet::http
