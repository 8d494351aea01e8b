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
       R"({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": 1}})",
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
        R"({"prompt": "hi", "n": 2})", R"({"prompt": "hi", "logprobs": 21})",
        R"({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]})", R"({"prompt": "hi", "stop": ""})",
        R"({"prompt": "hi", "frequency_penalty": 0.5})", R"({"prompt": "hi", "echo": true})",
        R"({"prompt": ""})", R"({"prompt": []})", R"({"prompt": [-1]})", R"({"max_tokens": 4})"}) {
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
  EXPECT_EQ(r.prompt, "Hello");
  EXPECT_FALSE(r.prompt_is_ids);
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

TEST(OpenAiParseTest, PromptAsTokenIdsOrListOfOne) {
  ParsedRequest r;
  ASSERT_FALSE(Parse(Endpoint::kCompletions, R"({"prompt": [1, 2, 3]})", &r));
  EXPECT_TRUE(r.prompt_is_ids);
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  ASSERT_FALSE(Parse(Endpoint::kCompletions, R"({"prompt": [[4, 5]]})", &r));
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{4, 5}));
  ASSERT_FALSE(Parse(Endpoint::kCompletions, R"({"prompt": ["one"]})", &r));
  EXPECT_EQ(r.prompt, "one");
  EXPECT_TRUE(Parse(Endpoint::kCompletions, R"({"prompt": ["one", "two"]})"));
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
  json c = ChunkJson(Endpoint::kChat, "id1", 7, "m", "Hi", true, nullptr, "", std::nullopt);
  EXPECT_EQ(c["object"], "chat.completion.chunk");
  EXPECT_EQ(c["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(c["choices"][0]["delta"]["content"], "Hi");
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(c.contains("usage"));
  c = ChunkJson(Endpoint::kChat, "id1", 7, "m", "", false, nullptr, "length", Usage{3, 4});
  EXPECT_FALSE(c["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(c["usage"]["total_tokens"], 7);
  c = ChunkJson(Endpoint::kCompletions, "id2", 7, "m", "x", true, nullptr, "", std::nullopt);
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "x");

  json r = ResponseJson(Endpoint::kChat, "id3", 7, "m", "Hello", nullptr, "stop", Usage{2, 1});
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Hello");
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

}  // namespace
}  // namespace duet::http
