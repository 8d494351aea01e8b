// Tool calling's request side (tools, tool_choice, tool messages; the grammar of required and
// named) and its output side (ToolCallExtractor: hermes, llama3_json, required, named), whose
// result must not depend on how the output was cut into streamed pieces.
#include "http/tool_calls.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "http/openai_protocol.h"

namespace duet::http {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr char kTools[] =
    R"("tools": [{"type": "function", "function": {"name": "get_weather", "parameters":
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
       {"type": "function", "function": {"name": "now"}}])";

std::optional<ApiError> ParseChat(const std::string& extra, ParsedRequest* r) {
  return ParseRequest(Endpoint::kChat,
                      R"({"messages": [{"role": "user", "content": "x"}], )" + extra + "}", r);
}

TEST(ToolRequestTest, ToolsAndToolChoiceAreReadAsVllmReadsThem) {
  ParsedRequest r;
  ASSERT_FALSE(ParseChat(kTools, &r));
  EXPECT_EQ(r.tools.choice, ToolChoice::kAuto);  // the default with tools
  EXPECT_EQ(r.tools.names, (std::vector<std::string>{"get_weather", "now"}));
  ASSERT_EQ(r.chat_rendering.tools.size(), 2u);
  // As sent, keys in order ("type" before "function"), for the template's tojson.
  EXPECT_EQ(r.chat_rendering.tools[0].begin().key(), "type");
  EXPECT_FALSE(r.grammar);  // auto: the model decides

  ASSERT_FALSE(ParseChat(std::string(kTools) + R"(, "tool_choice": "none")", &r));
  EXPECT_EQ(r.tools.choice, ToolChoice::kNone);
  EXPECT_FALSE(r.grammar);

  // Named: the function's parameters are the grammar.
  ASSERT_FALSE(ParseChat(std::string(kTools) +
                             R"(, "tool_choice": {"type": "function", "function": {"name":
                                 "get_weather"}})",
                         &r));
  EXPECT_EQ(r.tools.choice, ToolChoice::kNamed);
  ASSERT_TRUE(r.grammar);
  EXPECT_EQ(r.grammar->kind, grammar::GrammarKind::kJsonSchema);
  EXPECT_EQ(json::parse(r.grammar->text)["required"], json({"city"}));

  // Required: an array of {name, parameters}, one of the tools each (a tool without
  // parameters takes an empty object).
  ASSERT_FALSE(ParseChat(std::string(kTools) + R"(, "tool_choice": "required")", &r));
  ASSERT_TRUE(r.grammar);
  const json schema = json::parse(r.grammar->text);
  EXPECT_EQ(schema["type"], "array");
  EXPECT_EQ(schema["minItems"], 1);
  EXPECT_FALSE(schema.contains("maxItems"));
  EXPECT_TRUE(r.grammar->strict);  // unlisted properties are not generated
  ASSERT_EQ(schema["items"]["anyOf"].size(), 2u);
  EXPECT_EQ(schema["items"]["anyOf"][1]["properties"]["name"]["enum"], json({"now"}));
  EXPECT_EQ(schema["items"]["anyOf"][1]["properties"]["parameters"]["type"], "object");
  ASSERT_FALSE(ParseChat(
      std::string(kTools) + R"(, "tool_choice": "required", "parallel_tool_calls": false)", &r));
  EXPECT_EQ(json::parse(r.grammar->text)["maxItems"], 1);
}

TEST(ToolRequestTest, BadToolFieldsAreRefusedNamingThem) {
  struct Case {
    std::string extra;
    const char* param;
    const char* says;
  } cases[] = {
      {R"("tool_choice": "required")", "tool_choice", "needs 'tools'"},
      {std::string(kTools) + R"(, "tool_choice": {"type": "function", "function": {"name":
           "other"}})",
       "tool_choice", "not among 'tools'"},
      {std::string(kTools) + R"(, "tool_choice": "sometimes")", "tool_choice", "sometimes"},
      {R"("tools": [{"type": "retrieval"}])", "tools[0]", "must be \"function\""},
      {R"("tools": [{"type": "function", "function": {"description": "no name"}}])", "tools[0]",
       "name"},
      {R"("tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}])", "tools[0]",
       "parameters"},
      {R"("tools": [{"type": "function", "function": {"name": "f"}},
                    {"type": "function", "function": {"name": "f"}}])",
       "tools", "twice"},
      {std::string(kTools) + R"(, "tool_choice": "required", "response_format": {"type":
           "json_object"})",
       "tool_choice", "structured output"},
      {R"("functions": [{"name": "f"}])", "functions", "deprecated"},
  };
  for (const Case& c : cases) {
    ParsedRequest r;
    std::optional<ApiError> e = ParseChat(c.extra, &r);
    ASSERT_TRUE(e) << c.extra;
    EXPECT_EQ(e->http_status, 400);
    EXPECT_EQ(e->param, c.param) << e->message;
    EXPECT_THAT(e->message, HasSubstr(c.says));
  }
  // Tools belong to chat.
  ParsedRequest r;
  std::optional<ApiError> e =
      ParseRequest(Endpoint::kCompletions, std::string(R"({"prompt": "x", )") + kTools + "}", &r);
  ASSERT_TRUE(e);
  EXPECT_THAT(e->message, HasSubstr("chat completions only"));
}

TEST(ToolRequestTest, ToolMessagesAndAssistantCallsAreRead) {
  ParsedRequest r;
  ASSERT_FALSE(ParseRequest(Endpoint::kChat, R"({"messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"a\": 1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "3 C"}]})",
                            &r));
  ASSERT_EQ(r.messages.size(), 3u);
  ASSERT_EQ(r.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[1].tool_calls[0].name, "get_weather");
  // The arguments' keys keep their order.
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments.dump(), R"({"city":"Oslo","a":1})");
  EXPECT_EQ(r.messages[2].role, "tool");
  EXPECT_EQ(r.messages[2].tool_call_id, "c1");

  std::optional<ApiError> e = ParseRequest(Endpoint::kChat, R"({"messages": [
      {"role": "assistant", "tool_calls": [{"type": "function",
          "function": {"name": "f", "arguments": "{not json"}}]}]})",
                                           &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "messages[0].tool_calls[0].function.arguments");
  e = ParseRequest(Endpoint::kChat,
                   R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})", &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "messages[0].tool_calls");
}

ToolRequest Request(ToolChoice choice, bool parallel = true) {
  ToolRequest r;
  r.names = {"get_weather", "now"};
  r.choice = choice;
  if (choice == ToolChoice::kNamed) r.named = "get_weather";
  r.parallel = parallel;
  return r;
}

// The output fed in the given pieces, then Finish; content and calls rebuilt from the deltas
// alone, as a client of the stream does, and checked against the extractor's own totals.
struct Result {
  std::string content;
  std::vector<ToolCallOut> calls;
};
Result Feed(const ToolRequest& request, ToolCallParser parser,
            const std::vector<std::string>& pieces) {
  ToolCallExtractor x(request, parser, "call");
  Result r;
  auto take = [&r](const ChatDelta& d) {
    r.content += d.content;
    for (const ToolCallDelta& t : d.tool_calls) {
      if (!t.id.empty()) {
        EXPECT_EQ(t.index, static_cast<int>(r.calls.size()));
        r.calls.push_back({t.id, t.name, ""});
      }
      EXPECT_LT(t.index, static_cast<int>(r.calls.size()));
      if (t.index < static_cast<int>(r.calls.size())) r.calls[t.index].arguments += t.arguments;
    }
  };
  for (const std::string& p : pieces) take(x.Add(p));
  take(x.Finish());
  EXPECT_EQ(r.content, x.content());
  EXPECT_EQ(r.calls.size(), x.calls().size());
  for (size_t i = 0; i < r.calls.size() && i < x.calls().size(); ++i) {
    EXPECT_EQ(r.calls[i].arguments, x.calls()[i].arguments);
  }
  return r;
}

// Every way of cutting `text` in two, and one byte at a time, gives the whole text's result.
Result FeedEveryWay(const ToolRequest& request, ToolCallParser parser, const std::string& text) {
  const Result whole = Feed(request, parser, {text});
  auto same = [&whole](const Result& r, const std::string& how) {
    EXPECT_EQ(r.content, whole.content) << how;
    ASSERT_EQ(r.calls.size(), whole.calls.size()) << how;
    for (size_t i = 0; i < r.calls.size(); ++i) {
      EXPECT_EQ(r.calls[i].name, whole.calls[i].name) << how;
      EXPECT_EQ(r.calls[i].arguments, whole.calls[i].arguments) << how;
    }
  };
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    same(Feed(request, parser, {text.substr(0, cut), text.substr(cut)}),
         "cut at " + std::to_string(cut));
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  same(Feed(request, parser, bytes), "byte by byte");
  return whole;
}

TEST(ToolCallExtractorTest, HermesBlocksBecomeCallsAndTheTextBeforeThemContent) {
  const ToolRequest auto_tools = Request(ToolChoice::kAuto);
  Result r = FeedEveryWay(auto_tools, ToolCallParser::kHermes,
                          "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                          "{\"city\": \"Oslo\", \"unit\":\"c\"}}\n</tool_call>\n<tool_call>\n"
                          "{\"name\": \"now\", \"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(r.content, "Let me check.\n");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  // Arguments as Python's json.dumps writes them (vLLM's form), keys in the model's order.
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Oslo", "unit": "c"})");
  EXPECT_EQ(r.calls[0].id, "call-0");
  EXPECT_EQ(r.calls[1].name, "now");
  EXPECT_EQ(r.calls[1].arguments, "{}");

  // No call: all content, also text that looks like the start of a tag.
  r = FeedEveryWay(auto_tools, ToolCallParser::kHermes, "a < b and <tool_c");
  EXPECT_EQ(r.content, "a < b and <tool_c");
  EXPECT_TRUE(r.calls.empty());
  // A block that is not a call stays text; an unclosed one at the end is still a call.
  r = FeedEveryWay(auto_tools, ToolCallParser::kHermes, "x<tool_call>{\"oops\"</tool_call>");
  EXPECT_EQ(r.content, "x<tool_call>{\"oops\"</tool_call>");
  EXPECT_TRUE(r.calls.empty());
  r = FeedEveryWay(auto_tools, ToolCallParser::kHermes,
                   "<tool_call>{\"name\": \"now\", \"arguments\": {\"tz\": \"UTC\"}}");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"tz": "UTC"})");
  // parallel_tool_calls false: the first call only.
  r = FeedEveryWay(Request(ToolChoice::kAuto, /*parallel=*/false), ToolCallParser::kHermes,
                   "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call><tool_call>"
                   "{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "now");
}

TEST(ToolCallExtractorTest, Llama3JsonCallsStartTheOutput) {
  const ToolRequest auto_tools = Request(ToolChoice::kAuto);
  Result r = FeedEveryWay(auto_tools, ToolCallParser::kLlama3Json,
                          "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; "
                          "{\"name\": \"now\", \"arguments\": {}}");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Oslo"})");
  EXPECT_EQ(r.calls[1].name, "now");
  r = FeedEveryWay(auto_tools, ToolCallParser::kLlama3Json, "It is {sunny}.");
  EXPECT_EQ(r.content, "It is {sunny}.");
  EXPECT_TRUE(r.calls.empty());
  // Cut short, or not a call: the text is content.
  r = FeedEveryWay(auto_tools, ToolCallParser::kLlama3Json, "{\"name\": \"now\", \"parame");
  EXPECT_EQ(r.content, "{\"name\": \"now\", \"parame");
  EXPECT_TRUE(r.calls.empty());
  r = FeedEveryWay(auto_tools, ToolCallParser::kLlama3Json, "{\"city\": \"Oslo\"}");
  EXPECT_EQ(r.content, "{\"city\": \"Oslo\"}");
}

TEST(ToolCallExtractorTest, RequiredAndNamedOutputsAreCalls) {
  Result r = FeedEveryWay(Request(ToolChoice::kRequired), ToolCallParser::kNone,
                          R"([{"name": "get_weather", "parameters": {"city": "Oslo"}},)"
                          R"( {"name": "now", "parameters": {}}])");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Oslo"})");
  // An array cut short by max_tokens stays text.
  r = FeedEveryWay(Request(ToolChoice::kRequired), ToolCallParser::kNone, R"([{"name": "now")");
  EXPECT_EQ(r.content, R"([{"name": "now")");
  EXPECT_TRUE(r.calls.empty());
  // Named: the output is the arguments, streamed as they come.
  r = FeedEveryWay(Request(ToolChoice::kNamed), ToolCallParser::kHermes, R"({"city": "Oslo"})");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Oslo"})");
  // none: nothing is parsed.
  r = FeedEveryWay(Request(ToolChoice::kNone), ToolCallParser::kHermes,
                   "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>");
  EXPECT_TRUE(r.calls.empty());
}

TEST(ToolCallExtractorTest, FinishReasonIsToolCallsWhenCallsWereMade) {
  ToolCallExtractor required(Request(ToolChoice::kRequired), ToolCallParser::kNone, "c");
  required.Add(R"([{"name": "now", "parameters": {}}])");
  required.Finish();
  EXPECT_EQ(required.FinishReason("stop"), "tool_calls");
  EXPECT_EQ(required.FinishReason("length"), "length");
  ToolCallExtractor named(Request(ToolChoice::kNamed), ToolCallParser::kNone, "c");
  named.Add("{}");
  named.Finish();
  EXPECT_EQ(named.FinishReason("stop"), "stop");  // as OpenAI for a named function
  ToolCallExtractor text(Request(ToolChoice::kAuto), ToolCallParser::kHermes, "c");
  text.Add("Hello");
  text.Finish();
  EXPECT_EQ(text.FinishReason("stop"), "stop");
}

TEST(ToolCallExtractorTest, DeltasAreOpenAiShaped) {
  const json j = ToolCallDeltasJson(
      {{.index = 0, .id = "c0", .name = "f", .arguments = "{"}, {.index = 0, .arguments = "}"}});
  EXPECT_EQ(j[0], json::parse(R"({"index": 0, "id": "c0", "type": "function",
                                  "function": {"name": "f", "arguments": "{"}})"));
  EXPECT_EQ(j[1], json::parse(R"({"index": 0, "function": {"arguments": "}"}})"));
  EXPECT_TRUE(ToolCallDeltasJson({}).is_null());
  EXPECT_EQ(ParseToolCallParser("mistral").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseToolCallParser("hermes"), ToolCallParser::kHermes);
}

}  // namespace
}  // namespace duet::http
