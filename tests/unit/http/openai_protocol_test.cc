#include "http/openai_protocol.h"

#include <gtest/gtest.h>

namespace duet::http {
namespace {

using nlohmann::json;

std::optional<ApiError> Parse(Endpoint ep, const std::string& body, ParsedRequest* out = nullptr) {
  ParsedRequest r;
  return ParseRequest(ep, body, out ? out : &r);
}

TEST(OpenAiParseTest, MalformedJsonAndNonObjects) {
  auto e = Parse(Endpoint::kCompletions, "{\"prompt\": \"hi\"");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->http_status, 400);
  EXPECT_EQ(e->type, "invalid_request_error");
  EXPECT_EQ(e->code, "invalid_json");
  e = Parse(Endpoint::kCompletions, "[1, 2]");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "invalid_json");
  e = Parse(Endpoint::kCompletions, "");
  ASSERT_TRUE(e);
}

TEST(OpenAiParseTest, KnownFieldsWithWrongTypesNameTheField) {
  struct Case {
    Endpoint ep;
    const char* body;
    const char* param;
  } cases[] = {
      {Endpoint::kCompletions, R"({"prompt": "hi", "max_tokens": "ten"})", "max_tokens"},
      {Endpoint::kCompletions, R"({"prompt": "hi", "max_tokens": 1.5})", "max_tokens"},
      {Endpoint::kCompletions, R"({"prompt": "hi", "temperature": "hot"})", "temperature"},
      {Endpoint::kCompletions, R"({"prompt": "hi", "stream": "yes"})", "stream"},
      {Endpoint::kCompletions, R"({"prompt": "hi", "ignore_eos": 1})", "ignore_eos"},
      {Endpoint::kCompletions, R"({"prompt": "hi", "stop": 5})", "stop"},
      {Endpoint::kCompletions, R"({"prompt": "hi", "stop": ["a", 1]})", "stop[]"},
      {Endpoint::kCompletions, R"({"prompt": "hi", "seed": "x"})", "seed"},
      {Endpoint::kCompletions, R"({"prompt": "hi", "model": 3})", "model"},
      {Endpoint::kCompletions, R"({"prompt": {"a": 1}})", "prompt"},
      {Endpoint::kCompletions, R"({"prompt": [1, "x", 2]})", "prompt"},
      {Endpoint::kCompletions, R"({"prompt": "hi", "logprobs": true})", "logprobs"},
      {Endpoint::kChat, R"({"messages": "hello"})", "messages"},
      {Endpoint::kChat, R"({"messages": [{"role": 1, "content": "x"}]})", "messages[0].role"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 2})",
       "logprobs"},
      {Endpoint::kChat,
       R"({"messages": [{"role": "user", "content": "x"}], "stream": true,
           "stream_options": {"include_usage": 1}})",
       "include_usage"},
  };
  for (const Case& c : cases) {
    auto e = Parse(c.ep, c.body);
    ASSERT_TRUE(e) << c.body;
    EXPECT_EQ(e->http_status, 400) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body << ": " << e->message;
  }
}

TEST(OpenAiParseTest, ValuesOutOfRange) {
  for (const char* body :
       {R"({"prompt": "hi", "max_tokens": 0})", R"({"prompt": "hi", "max_tokens": -3})",
        R"({"prompt": "hi", "temperature": 2.5})", R"({"prompt": "hi", "top_p": 1.5})",
        R"({"prompt": "hi", "n": 0})", R"({"prompt": "hi", "n": 129})",
        R"({"prompt": ["a", "b"], "n": 65})", R"({"prompt": ["a", [1, 2]]})",
        R"({"prompt": ["a", ""]})", R"({"prompt": "hi", "best_of": 3, "n": 2})",
        R"({"prompt": "hi", "logprobs": 21})",
        R"({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]})", R"({"prompt": "hi", "stop": ""})",
        R"({"prompt": "hi", "frequency_penalty": 2.5})",
        R"({"prompt": "hi", "presence_penalty": -3})", R"({"prompt": "hi", "min_p": 1.5})",
        R"({"prompt": "hi", "repetition_penalty": 0})", R"({"prompt": "hi", "min_tokens": -1})",
        R"({"prompt": "hi", "logit_bias": {"5": 101}})", R"({"prompt": "hi", "logit_bias": [1]})",
        R"({"prompt": "hi", "logit_bias": {"x": 1}})",
        R"({"prompt": "hi", "logit_bias": {"-1": 1}})",
        R"({"prompt": "hi", "logit_bias": {"5": 1, "05": 2}})", R"({"prompt": ""})",
        R"({"prompt": []})", R"({"prompt": [-1]})", R"({"max_tokens": 4})",
        // As vLLM: stream_options would silently do nothing without stream.
        R"({"prompt": "hi", "stream_options": {"include_usage": true}})",
        R"({"prompt": "hi", "stream": false, "stream_options": {}})"}) {
    auto e = Parse(Endpoint::kCompletions, body);
    ASSERT_TRUE(e) << body;
    EXPECT_EQ(e->http_status, 400) << body;
    EXPECT_FALSE(e->message.empty());
  }
  for (const char* body :
       {R"({"messages": []})", R"({"messages": [{"role": "wizard", "content": "x"}]})",
        R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
        R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})"}) {
    auto e = Parse(Endpoint::kChat, body);
    ASSERT_TRUE(e) << body;
    EXPECT_EQ(e->http_status, 400) << body;
  }
}

TEST(OpenAiParseTest, CompletionFieldsAndUnknownFieldsIgnored) {
  ParsedRequest r;
  ASSERT_FALSE(Parse(Endpoint::kCompletions,
                     R"({"model": "m", "prompt": "Hello", "max_tokens": 7, "temperature": 0,
                         "top_p": 0.9, "seed": 42, "stop": ["\n", "END"], "logprobs": 3,
                         "stream": true, "user": "me", "suffix": null, "n": 1,
                         "ignore_eos": true})",
                     &r));
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "Hello");
  EXPECT_FALSE(r.prompts[0].is_ids);
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.echo);
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.temperature, 0.0f);
  EXPECT_FLOAT_EQ(r.top_p, 0.9f);
  ASSERT_TRUE(r.seed);
  EXPECT_EQ(*r.seed, 42u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_TRUE(r.stream);

  const v1::SamplingParams sp = ToSampling(r);
  EXPECT_EQ(sp.temperature(), 0.0f);
  EXPECT_FLOAT_EQ(sp.top_p(), 0.9f);
  EXPECT_EQ(sp.seed(), 42u);
  EXPECT_EQ(sp.max_tokens(), 7);
  EXPECT_EQ(sp.logprobs(), 3);
  EXPECT_TRUE(sp.ignore_eos());
}

// A field of the OpenAI or vLLM API that the server does not implement is a 400 naming it, as
// soon as its value would change the answer; its no-op values are accepted.
TEST(OpenAiParseTest, UnimplementedFieldsAreRefusedNamingThem) {
  struct Case {
    const char* field;
    const char* used;   // a value that would change the answer
    const char* no_op;  // a value that does not (besides null); empty: none
  } cases[] = {
      {"functions", R"([{"name": "f"}])", ""},
      {"function_call", R"("auto")", ""},
      {"suffix", R"("tail")", R"("")"},
      {"prompt_logprobs", "0", ""},  // 0 is not a no-op: the prompt tokens' own logprobs
      {"use_beam_search", "true", "false"},
      {"chat_template", R"("{{ x }}")", ""},
      {"bad_words", R"(["x"])", "[]"},
      {"allowed_token_ids", "[1, 2]", "[]"},
  };
  for (const Case& c : cases) {
    for (Endpoint ep : {Endpoint::kCompletions, Endpoint::kChat}) {
      const std::string base = ep == Endpoint::kChat
                                   ? R"({"messages": [{"role": "user", "content": "x"}])"
                                   : R"({"prompt": "x")";
      auto e = Parse(ep, base + ", \"" + c.field + "\": " + c.used + "}");
      ASSERT_TRUE(e) << c.field << " was accepted";
      EXPECT_EQ(e->http_status, 400) << c.field;
      EXPECT_EQ(e->param, c.field) << e->message;
      EXPECT_EQ(e->code, "unsupported") << c.field;
      EXPECT_NE(e->message.find(c.field), std::string::npos) << e->message;
      EXPECT_FALSE(Parse(ep, base + ", \"" + c.field + "\": null}")) << c.field << ": null";
      if (*c.no_op) {
        auto ok = Parse(ep, base + ", \"" + c.field + "\": " + c.no_op + "}");
        EXPECT_FALSE(ok) << c.field << ": " << c.no_op << ": " << ok->message;
      }
    }
  }
}

// min_p, the penalties, logit_bias and min_tokens reach the sampler (vLLM's names and ranges).
TEST(OpenAiParseTest, PenaltiesLogitBiasMinPAndMinTokensReachTheSampler) {
  ParsedRequest r;
  ASSERT_FALSE(Parse(Endpoint::kChat,
                     R"({"messages": [{"role": "user", "content": "x"}], "min_p": 0.05,
                         "repetition_penalty": 1.3, "presence_penalty": -0.5,
                         "frequency_penalty": 1.5, "logit_bias": {"42": -100, "7": 2.5},
                         "min_tokens": 3})",
                     &r));
  ASSERT_FALSE(CheckLengths(&r, 10, 100));
  const v1::SamplingParams sp = ToSampling(r);
  EXPECT_FLOAT_EQ(sp.min_p(), 0.05f);
  EXPECT_FLOAT_EQ(sp.repetition_penalty(), 1.3f);
  EXPECT_FLOAT_EQ(sp.presence_penalty(), -0.5f);
  EXPECT_FLOAT_EQ(sp.frequency_penalty(), 1.5f);
  EXPECT_EQ(sp.min_tokens(), 3);
  ASSERT_EQ(sp.logit_bias_size(), 2);  // by token id
  EXPECT_EQ(sp.logit_bias(0).token_id(), 7);
  EXPECT_FLOAT_EQ(sp.logit_bias(0).bias(), 2.5f);
  EXPECT_EQ(sp.logit_bias(1).token_id(), 42);
  EXPECT_FLOAT_EQ(sp.logit_bias(1).bias(), -100.f);
  // Defaults: off (repetition_penalty 1).
  ASSERT_FALSE(Parse(Endpoint::kCompletions, R"({"prompt": "x"})", &r));
  const v1::SamplingParams off = ToSampling(r);
  EXPECT_EQ(off.min_p(), 0.f);
  EXPECT_EQ(off.repetition_penalty(), 1.f);
  EXPECT_EQ(off.logit_bias_size(), 0);
  // min_tokens beyond max_tokens is a 400 naming it, once max_tokens is known.
  ASSERT_FALSE(Parse(Endpoint::kCompletions, R"({"prompt": "x", "min_tokens": 17})", &r));
  auto e = CheckLengths(&r, 4, 100);  // max_tokens defaults to 16
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "min_tokens");
}

// top_k (vLLM's -1 is off) and stop_token_ids reach the sampler; out of range is a 400.
TEST(OpenAiParseTest, TopKAndStopTokenIdsReachTheSampler) {
  ParsedRequest r;
  ASSERT_FALSE(Parse(Endpoint::kCompletions,
                     R"({"prompt": "x", "top_k": 40, "stop_token_ids": [7, 42]})", &r));
  v1::SamplingParams sp = ToSampling(r);
  EXPECT_EQ(sp.top_k(), 40);
  EXPECT_EQ(std::vector<int32_t>(sp.stop_token_ids().begin(), sp.stop_token_ids().end()),
            (std::vector<int32_t>{7, 42}));
  for (const char* off : {R"({"prompt": "x", "top_k": -1})", R"({"prompt": "x", "top_k": 0})",
                          R"({"prompt": "x"})"}) {
    ASSERT_FALSE(Parse(Endpoint::kCompletions, off, &r)) << off;
    EXPECT_EQ(ToSampling(r).top_k(), 0) << off;
  }
  for (const auto& [body, param] : std::vector<std::pair<const char*, const char*>>{
           {R"({"prompt": "x", "top_k": -2})", "top_k"},
           {R"({"prompt": "x", "top_k": "many"})", "top_k"},
           {R"({"prompt": "x", "stop_token_ids": 5})", "stop_token_ids"},
           {R"({"prompt": "x", "stop_token_ids": ["a"]})", "stop_token_ids[]"},
           {R"({"prompt": "x", "stop_token_ids": [-1]})", "stop_token_ids"}}) {
    auto e = Parse(Endpoint::kCompletions, body);
    ASSERT_TRUE(e) << body;
    EXPECT_EQ(e->param, param) << body << ": " << e->message;
  }
}

// As in vLLM, chat's max_completion_tokens wins over max_tokens when both are given.
TEST(OpenAiParseTest, MaxCompletionTokensWinsOverMaxTokens) {
  ParsedRequest r;
  ASSERT_FALSE(Parse(Endpoint::kChat,
                     R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 50,
                         "max_completion_tokens": 7})",
                     &r));
  EXPECT_EQ(r.max_tokens, 7);
  ASSERT_FALSE(Parse(Endpoint::kChat,
                     R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 50})", &r));
  EXPECT_EQ(r.max_tokens, 50);
}

TEST(OpenAiParseTest, PromptAsTokenIdsOrAList) {
  ParsedRequest r;
  ASSERT_FALSE(Parse(Endpoint::kCompletions, R"({"prompt": [1, 2, 3]})", &r));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_TRUE(r.prompts[0].is_ids);
  EXPECT_EQ(r.prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  ASSERT_FALSE(Parse(Endpoint::kCompletions, R"({"prompt": [[4, 5]]})", &r));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].ids, (std::vector<int32_t>{4, 5}));
  ASSERT_FALSE(Parse(Endpoint::kCompletions, R"({"prompt": ["one"]})", &r));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "one");
  // A list of several prompts is a batch, in order; n choices each.
  ASSERT_FALSE(Parse(Endpoint::kCompletions, R"({"prompt": ["one", "two"], "n": 3})", &r));
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].text, "two");
  EXPECT_EQ(r.n, 3);
  ASSERT_FALSE(Parse(Endpoint::kCompletions, R"({"prompt": [[1], [2, 3]], "echo": true})", &r));
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].ids, (std::vector<int32_t>{2, 3}));
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.prompt_logprobs, -1);
  // echo with logprobs asks for the prompt's logprobs, with as many alternatives.
  ASSERT_FALSE(
      Parse(Endpoint::kCompletions, R"({"prompt": "x", "echo": true, "logprobs": 2})", &r));
  EXPECT_EQ(r.prompt_logprobs, 2);
  EXPECT_EQ(ToSampling(r).prompt_logprobs(), 2);
  ASSERT_FALSE(Parse(Endpoint::kCompletions, R"({"prompt": "x", "logprobs": 2})", &r));
  EXPECT_FALSE(ToSampling(r).has_prompt_logprobs());
  // best_of equal to n is n; chat takes n but not echo.
  ASSERT_FALSE(Parse(Endpoint::kCompletions, R"({"prompt": "x", "n": 2, "best_of": 2})", &r));
  EXPECT_EQ(r.n, 2);
  ASSERT_FALSE(
      Parse(Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "n": 4})", &r));
  EXPECT_EQ(r.n, 4);
  auto e = Parse(Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}],
                                      "echo": true})");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "echo");
}

TEST(OpenAiParseTest, ChatMessagesAndLogprobs) {
  ParsedRequest r;
  ASSERT_FALSE(Parse(Endpoint::kChat,
                     R"({"messages": [{"role": "developer", "content": "Be brief."},
                                      {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                                                   {"type": "text", "text": "there"}]}],
                         "logprobs": true, "top_logprobs": 2, "max_completion_tokens": 5})",
                     &r));
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "Hi there");
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 2);
  EXPECT_EQ(r.max_tokens, 5);
}

TEST(OpenAiLengthsTest, ContextAndMaxTokens) {
  ParsedRequest r;
  r.endpoint = Endpoint::kCompletions;
  auto e = CheckLengths(&r, 100, 100);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "context_length_exceeded");
  EXPECT_EQ(e->param, "prompt");

  r = ParsedRequest();
  ASSERT_FALSE(CheckLengths(&r, 10, 100));
  EXPECT_EQ(r.max_tokens, 16);  // the completions default
  r = ParsedRequest();
  ASSERT_FALSE(CheckLengths(&r, 95, 100));
  EXPECT_EQ(r.max_tokens, 5);  // the default shrinks to fit

  r = ParsedRequest();
  r.endpoint = Endpoint::kChat;
  ASSERT_FALSE(CheckLengths(&r, 10, 100));
  EXPECT_EQ(r.max_tokens, 90);  // chat: the rest of the context

  r = ParsedRequest();
  r.max_tokens = 91;
  e = CheckLengths(&r, 10, 100);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "max_tokens");
  r.max_tokens = 90;
  EXPECT_FALSE(CheckLengths(&r, 10, 100));
}

TEST(OpenAiTextTest, NeverSplitsUtf8) {
  EXPECT_EQ(Utf8SafePrefix("ab", 2), 2u);
  EXPECT_EQ(Utf8SafePrefix("a\xC3", 2), 1u);         // first byte of é
  EXPECT_EQ(Utf8SafePrefix("a\xC3\xA9", 3), 3u);     // é complete
  EXPECT_EQ(Utf8SafePrefix("\xF0\x9F\x98", 3), 0u);  // 3 of an emoji's 4 bytes
  EXPECT_EQ(Utf8SafePrefix("\xF0\x9F\x98\x80", 4), 4u);
  TextAssembler t({});
  EXPECT_EQ(t.Add("caf"), "caf");
  EXPECT_EQ(t.Add("\xC3"), "");
  EXPECT_EQ(t.Add("\xA9!"), "\xC3\xA9!");
  EXPECT_EQ(t.Finish(), "");
}

TEST(OpenAiTextTest, StopStringsAcrossTokensAreNotEmitted) {
  TextAssembler t({"END", "\n\n"});
  std::string out;
  for (const char* piece : {"Hello", " wor", "ld E", "N", "D more"}) out += t.Add(piece);
  EXPECT_TRUE(t.stopped());
  EXPECT_EQ(out + t.Finish(), "Hello world ");
  EXPECT_EQ(t.Add("ignored"), "");

  TextAssembler u({"\n\n"});
  out.clear();
  for (const char* piece : {"a\n", "b\n", "\n", "c"}) out += u.Add(piece);
  EXPECT_EQ(out, "a\nb");
  EXPECT_TRUE(u.stopped());

  TextAssembler v({"XYZ"});
  out.clear();
  for (const char* piece : {"aX", "Y", "b"}) out += v.Add(piece);
  out += v.Finish();
  EXPECT_FALSE(v.stopped());
  EXPECT_EQ(out, "aXYb");  // a held-back prefix of a stop string comes out once it is not one
}

TEST(OpenAiErrorTest, StatusMappingAndShape) {
  EXPECT_EQ(ErrorFromStatus(absl::InvalidArgumentError("x")).http_status, 400);
  ApiError e = ErrorFromStatus(absl::ResourceExhaustedError("no blocks"));
  EXPECT_EQ(e.http_status, 429);
  EXPECT_GT(e.retry_after_s, 0);
  e = ErrorFromStatus(absl::UnavailableError("no nodes"));
  EXPECT_EQ(e.http_status, 503);
  EXPECT_GT(e.retry_after_s, 0);
  EXPECT_EQ(ErrorFromStatus(absl::DeadlineExceededError("slow")).http_status, 504);
  EXPECT_EQ(ErrorFromStatus(absl::InternalError("bug")).http_status, 500);

  json j = json::parse(ErrorBody(ApiError{.message = "bad", .param = "max_tokens"}));
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "max_tokens");
  EXPECT_TRUE(j["error"]["code"].is_null());
}

TEST(OpenAiResponseTest, ChunksAndResponses) {
  json c = ChunkJson(Endpoint::kChat, "id1", 7, "m", 0, "Hi", true, nullptr, "", std::nullopt);
  EXPECT_EQ(c["object"], "chat.completion.chunk");
  EXPECT_EQ(c["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(c["choices"][0]["delta"]["content"], "Hi");
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(c.contains("usage"));
  c = ChunkJson(Endpoint::kChat, "id1", 7, "m", 0, "", false, nullptr, "length", Usage{3, 4});
  EXPECT_FALSE(c["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(c["usage"]["total_tokens"], 7);
  c = ChunkJson(Endpoint::kCompletions, "id2", 7, "m", 3, "x", true, nullptr, "", std::nullopt);
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "x");
  EXPECT_EQ(c["choices"][0]["index"], 3);

  json r = ResponseJson(Endpoint::kChat, "id3", 7, "m",
                        {{.text = "Hello", .logprobs = nullptr, .finish_reason = "stop"},
                         {.text = "Hi", .logprobs = nullptr, .finish_reason = "length"}},
                        Usage{2, 1});
  EXPECT_EQ(r["object"], "chat.completion");
  ASSERT_EQ(r["choices"].size(), 2u);
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(r["choices"][1]["index"], 1);
  EXPECT_EQ(r["choices"][1]["message"]["content"], "Hi");
  EXPECT_EQ(r["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 2);
}

TEST(OpenAiResponseTest, LogprobsShapes) {
  std::vector<TokenOut> toks = {
      {.id = 1, .text = "He", .logprob = -0.5f, .top = {{"He", -0.5f}, {"Hi", -1.5f}}},
      {.id = 2, .text = "llo", .logprob = -0.25f, .top = {}}};
  json c = LogprobsJson(Endpoint::kCompletions, toks, 10);
  EXPECT_EQ(c["tokens"], json({"He", "llo"}));
  EXPECT_EQ(c["text_offset"], json({10, 12}));
  EXPECT_FLOAT_EQ(c["top_logprobs"][0]["Hi"].get<float>(), -1.5f);
  json h = LogprobsJson(Endpoint::kChat, toks, 0);
  EXPECT_EQ(h["content"][1]["token"], "llo");
  EXPECT_EQ(h["content"][0]["top_logprobs"][1]["token"], "Hi");
  EXPECT_EQ(h["content"][1]["bytes"], json({108, 108, 111}));
}

TEST(OpenAiResponseTest, DumpReplacesInvalidUtf8) {
  EXPECT_EQ(Dump(json("a\xFF")), "\"a\xEF\xBF\xBD\"");
}

// Chat rendering options, as vLLM takes them; chat only, and only what the renderer reads.
TEST(OpenAiParseTest, ChatRenderingOptions) {
  ParsedRequest r;
  ASSERT_FALSE(Parse(Endpoint::kChat,
                     R"({"messages": [{"role": "user", "content": "x"}],
                         "add_generation_prompt": false, "continue_final_message": true,
                         "chat_template_kwargs": {"enable_thinking": false}})",
                     &r));
  EXPECT_FALSE(r.chat_rendering.add_generation_prompt);
  EXPECT_TRUE(r.chat_rendering.continue_final_message);
  EXPECT_EQ(r.chat_rendering.enable_thinking, std::optional<bool>(false));
  ASSERT_FALSE(Parse(Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}]})", &r));
  EXPECT_TRUE(r.chat_rendering.add_generation_prompt);
  EXPECT_FALSE(r.chat_rendering.enable_thinking.has_value());
  struct Case {
    Endpoint ep;
    const char* body;
    const char* param;
  } cases[] = {
      {Endpoint::kChat,
       R"({"messages": [{"role": "user", "content": "x"}], "continue_final_message": true})",
       "continue_final_message"},
      {Endpoint::kChat,
       R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"x": 1}})",
       "chat_template_kwargs"},
      {Endpoint::kChat,
       R"({"messages": [{"role": "user", "content": "x"}],
           "chat_template_kwargs": {"enable_thinking": "no"}})",
       "chat_template_kwargs.enable_thinking"},
      {Endpoint::kCompletions, R"({"prompt": "x", "add_generation_prompt": false})",
       "add_generation_prompt"},
  };
  for (const Case& c : cases) {
    auto e = Parse(c.ep, c.body);
    ASSERT_TRUE(e) << c.body;
    EXPECT_EQ(e->http_status, 400);
    EXPECT_EQ(e->param, c.param) << e->message;
  }
}

// max_tokens 0 is the prompt alone (lm-evaluation-harness): completions with echo only.
TEST(OpenAiParseTest, MaxTokensZeroWithEchoScoresThePromptAlone) {
  ParsedRequest r;
  ASSERT_FALSE(Parse(Endpoint::kCompletions,
                     R"({"prompt": [1, 2, 3], "echo": true, "logprobs": 1, "max_tokens": 0})", &r));
  EXPECT_TRUE(r.echo_only);
  EXPECT_EQ(r.max_tokens, 1);  // what the backend is asked for; its token is not shown
  EXPECT_EQ(r.prompt_logprobs, 1);
  for (const auto& [ep, body] : std::vector<std::pair<Endpoint, std::string>>{
           {Endpoint::kCompletions, R"({"prompt": "x", "max_tokens": 0})"},
           {Endpoint::kChat,
            R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})"}}) {
    auto e = Parse(ep, body);
    ASSERT_TRUE(e) << body;
    EXPECT_EQ(e->param, "max_tokens");
  }
}

}  // namespace
}  // namespace duet::http
