// Chat rendering per template family against hand-written expected strings derived from the
// published templates (SmolLM2/Qwen2 ChatML, Meta Llama-3 and Llama-3.1, Llama-2-chat,
// Mistral-7B-Instruct, Gemma and Gemma 3): single and multi-turn, system messages, the
// alternation rule, no template, unknown templates.
#include "common/tokenizer/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "common/tokenizer/byte_tokenizer.h"

namespace duet::model {
namespace {

using ::testing::HasSubstr;

// Shortened template sources: the renderer only looks at the markers (and at the phrases noted).
const char kSmolLm2[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}";
const char kLlama3[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}";
const char kLlama31[] =
    "{{- bos_token }}{%- if not date_string is defined %}{%- set date_string = \"26 Jul 2024\" "
    "%}{%- endif %}{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}{{- \"Cutting "
    "Knowledge Date: December 2023\\n\" }} ... <|eot_id|>";
const char kLlama2[] =
    "{% if messages[0]['role'] == 'system' %}...{% set content = '<<SYS>>\\n' + system_message "
    "+ '\\n<</SYS>>\\n\\n' + message['content'] %}...{{ bos_token + '[INST] ' + "
    "content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + "
    "content.strip() + ' ' + eos_token }}";
const char kMistral[] =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] "
    "' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token}}{% endif %}{% endfor %}";
const char kGemma[] =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role "
    "not supported') }}{% endif %}...{{ '<start_of_turn>' + role + '\n' + message['content'] | "
    "trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{'<start_of_turn>model\n'}}{% endif %}";
const char kGemma3[] =
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = "
    "messages[0]['content'] + '\n\n' -%}...{{ '<start_of_turn>' + role + '\n' + "
    "(first_user_prefix if loop.first else \"\") }}...{{ '<end_of_turn>\n' }}";

std::string Render(const std::string& source, const std::vector<ChatMessage>& messages) {
  absl::StatusOr<std::string> out = RenderChat(ChatTemplate{.source = source}, messages);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : "";
}

const std::vector<ChatMessage> kMultiTurn = {
    {"system", "Be terse."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "What is 2+2?"}};

TEST(ChatTemplateTest, ChatMlKeepsTheTemplatesDefaultSystemTurn) {
  EXPECT_EQ(Render(kSmolLm2, {{"user", "Hi"}}),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  absl::StatusOr<std::string> one = RenderChat(ChatTemplate{.source = kSmolLm2}, "Hi");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, Render(kSmolLm2, {{"user", "Hi"}}));
  EXPECT_EQ(Render(kSmolLm2, kMultiTurn),
            "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  // Without a literal default system turn, none is added.
  EXPECT_EQ(Render("{{'<|im_start|>' + m + '<|im_end|>'}}", {{"user", "hi"}}),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Llama3) {
  EXPECT_EQ(Render(kLlama3, {{"user", "  Hi \n"}}),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(Render(kLlama3, kMultiTurn),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, Llama31WritesTheSystemTurnWithItsPreamble) {
  EXPECT_EQ(Render(kLlama31, {{"user", "Hi"}}),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(Render(kLlama31, {{"system", " Be terse. "}, {"user", "Hi"}}),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, Llama2FoldsTheSystemTurnIntoTheFirstUserTurn) {
  EXPECT_EQ(Render(kLlama2, {{"user", "Hi "}}), "<s>[INST] Hi [/INST]");
  EXPECT_EQ(Render(kLlama2, kMultiTurn),
            "<s>[INST] <<SYS>>\nBe terse.\n<</SYS>>\n\nHi [/INST] Hello! </s>"
            "<s>[INST] What is 2+2? [/INST]");
}

TEST(ChatTemplateTest, Mistral) {
  EXPECT_EQ(Render(kMistral, {{"user", "Hi"}}), "<s>[INST] Hi [/INST]");
  EXPECT_EQ(Render(kMistral, kMultiTurn),
            "<s>[INST] Be terse.\n\nHi [/INST]Hello!</s>[INST] What is 2+2? [/INST]");
}

TEST(ChatTemplateTest, Gemma) {
  const std::vector<ChatMessage> turns(kMultiTurn.begin() + 1, kMultiTurn.end());
  const std::string want =
      "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
      "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n";
  EXPECT_EQ(Render(kGemma, turns), want);
  EXPECT_EQ(Render(kGemma3, turns), want);
  EXPECT_EQ(Render(kGemma3, kMultiTurn),
            "<bos><start_of_turn>user\nBe terse.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
            "Hello!<end_of_turn>\n<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n"
            "<start_of_turn>model\n");
  // Gemma 1/2 templates raise on a system message.
  absl::StatusOr<std::string> sys = RenderChat(ChatTemplate{.source = kGemma}, kMultiTurn);
  EXPECT_EQ(sys.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(sys.status().message()), HasSubstr("system"));
}

TEST(ChatTemplateTest, TheTokenizersBosAndEosTextsAreUsed) {
  const ChatTemplate t{.source = kLlama2, .bos_token = "<B>", .eos_token = "<E>"};
  absl::StatusOr<std::string> out =
      RenderChat(t, {{"user", "a"}, {"assistant", "b"}, {"user", "c"}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "<B>[INST] a [/INST] b <E><B>[INST] c [/INST]");
  // ChatTemplateOf reads them from the tokenizer.
  auto byte = ByteTokenizer::Create(300);
  ASSERT_TRUE(byte.ok());
  const ChatTemplate of = ChatTemplateOf(**byte);
  EXPECT_EQ(of.bos_token, "<|bos|>");
  EXPECT_EQ(of.eos_token, "<|eos|>");
  EXPECT_EQ(of.source, "");
}

TEST(ChatTemplateTest, InstAndGemmaTemplatesNeedAlternatingRoles) {
  const std::vector<std::vector<ChatMessage>> bad = {
      {{"user", "a"}, {"user", "b"}},
      {{"assistant", "a"}},
      {{"system", "s"}, {"assistant", "a"}, {"user", "b"}},
      {{"user", "a"}, {"system", "s"}},
      {{"system", "s"}},
  };
  for (const char* tmpl : {kLlama2, kMistral, kGemma3}) {
    for (const std::vector<ChatMessage>& m : bad) {
      absl::StatusOr<std::string> out = RenderChat(ChatTemplate{.source = tmpl}, m);
      EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument)
          << tmpl << " with " << m.size() << " messages";
      EXPECT_THAT(std::string(out.status().message()), HasSubstr("alternat")) << out.status();
    }
  }
  // ChatML and Llama-3 have no such rule.
  EXPECT_TRUE(RenderChat(ChatTemplate{.source = kSmolLm2}, bad[0]).ok());
  EXPECT_TRUE(RenderChat(ChatTemplate{.source = kLlama3}, bad[0]).ok());
}

TEST(ChatTemplateTest, NoTemplateAndUnknownTemplates) {
  EXPECT_EQ(Render("", {{"system", "S"}, {"user", "Hi"}}), "system: S\nuser: Hi\nassistant:");
  absl::StatusOr<std::string> out =
      RenderChat(ChatTemplate{.source = "### Instruction:\n{{ messages[0]['content'] }}"}, "hi");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("### Instruction:"));
}

TEST(ChatTemplateTest, EndOfTurnTokens) {
  EXPECT_EQ(EndOfTurnToken(kSmolLm2), "<|im_end|>");
  EXPECT_EQ(EndOfTurnToken(kLlama3), "<|eot_id|>");
  EXPECT_EQ(EndOfTurnToken(kLlama31), "<|eot_id|>");
  EXPECT_EQ(EndOfTurnToken(kGemma3), "<end_of_turn>");
  EXPECT_EQ(EndOfTurnToken(kMistral), "");  // EOS ends the turn
  EXPECT_EQ(EndOfTurnToken(""), "");
}

// add_generation_prompt, continue_final_message and Qwen3's enable_thinking, as transformers'
// apply_chat_template renders them (the final message continued: cut after its content).
TEST(ChatTemplateTest, GenerationPromptContinuationAndThinking) {
  const std::vector<ChatMessage> partial = {{"user", "Hi"}, {"assistant", "The answer is"}};
  auto render = [](const std::string& source, const std::vector<ChatMessage>& m,
                   const ChatRenderOptions& o) {
    absl::StatusOr<std::string> out = RenderChat(ChatTemplate{.source = source}, m, o);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : "";
  };
  const ChatRenderOptions no_prompt{.add_generation_prompt = false};
  const ChatRenderOptions cont{.add_generation_prompt = false, .continue_final_message = true};
  EXPECT_EQ(render(kSmolLm2, {{"user", "Hi"}}, no_prompt),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(render(kSmolLm2, partial, cont),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nThe answer is");
  EXPECT_EQ(render(kLlama3, partial, cont),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nThe answer is");
  EXPECT_EQ(render(kLlama3, {{"user", "Hi"}}, no_prompt),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
  EXPECT_EQ(render(kLlama2, partial, cont), "<s>[INST] Hi [/INST] The answer is");
  EXPECT_EQ(render(kGemma, partial, cont),
            "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nThe answer is");
  EXPECT_EQ(render(kGemma, {{"user", "Hi"}}, no_prompt),
            "<bos><start_of_turn>user\nHi<end_of_turn>\n");
  // Content with trailing space is continued as the trimming family wrote it.
  EXPECT_EQ(render(kLlama3, {{"user", "Hi"}, {"assistant", "Sure, "}}, cont),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nSure,");
  // Qwen3 reads enable_thinking: off writes the empty think block.
  const std::string qwen3 =
      "{%- for message in messages %}<|im_start|>...<|im_end|>{%- endfor %}{%- if "
      "add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is "
      "defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}";
  EXPECT_EQ(render(qwen3, {{"user", "Hi"}}, {.enable_thinking = false}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(render(qwen3, {{"user", "Hi"}}, {.enable_thinking = true}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // Refused: both at once, thinking for a template that does not read it, nothing to continue.
  for (const auto& [source, messages, options] :
       std::vector<std::tuple<std::string, std::vector<ChatMessage>, ChatRenderOptions>>{
           {kSmolLm2, partial, {.continue_final_message = true}},
           {kSmolLm2, partial, {.enable_thinking = false}},
           {kSmolLm2, {{"user", "Hi"}, {"assistant", ""}}, cont},
           {kSmolLm2, {}, cont}}) {
    EXPECT_FALSE(RenderChat(ChatTemplate{.source = source}, messages, options).ok());
  }
}

// Tools, calls and results. The expected strings are what HF transformers renders with the
// published Qwen2.5-Instruct and Llama-3.1-Instruct templates for the same conversation.
const char kQwen25[] =
    "{%- if tools %}{{- '<|im_start|>system\\n' }}... <tool_call> ...{%- else %}{{- "
    "'<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}{%- endif %}... '<|im_start|>' + message.role ... <|im_end|>";
const char kLlama31Tools[] =
    "{{- bos_token }}... Cutting Knowledge Date: December 2023 ... {%- if tools_in_user_message "
    "and not tools is none %}... Given the following functions, please respond with a JSON "
    "... <|start_header_id|> ... <|eot_id|>";

std::vector<nlohmann::ordered_json> WeatherTools() {
  return {
      nlohmann::ordered_json::parse(
          R"({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}})"),
      nlohmann::ordered_json::parse(
          R"({"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}})")};
}

ChatToolCall Call(const std::string& id, const std::string& name, const std::string& args) {
  return {.id = id, .name = name, .arguments = nlohmann::ordered_json::parse(args)};
}

const char kQwenToolsSystem[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": "
    "\"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather in a "
    "city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
    "\"string\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}}, \"required\": "
    "[\"city\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"add\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"number\"}, \"b\": {\"type\": "
    "\"number\"}}}}}\n</tools>\n\nFor each function call, return a json object with function "
    "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";

TEST(ChatTemplateTest, HermesTemplatesRenderToolsCallsAndResults) {
  const ChatRenderOptions with_tools{.tools = WeatherTools()};
  const std::vector<ChatMessage> chat = {
      {"system", "Be brief."},
      {"user", "Weather in Paris? And 2+3?"},
      {.role = "assistant",
       .tool_calls = {Call("c1", "get_weather", R"({"city": "Paris", "unit": "c"})"),
                      Call("c2", "add", R"({"a": 2, "b": 3})")}},
      {.role = "tool", .content = "18 C", .tool_call_id = "c1"},
      {.role = "tool", .content = "5", .tool_call_id = "c2"},
      {"user", "Thanks"}};
  absl::StatusOr<std::string> out = RenderChat(ChatTemplate{.source = kQwen25}, chat, with_tools);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, std::string("<|im_start|>system\nBe brief.\n\n") + kQwenToolsSystem +
                      "<|im_start|>user\nWeather in Paris? And 2+3?<|im_end|>\n<|im_start|>"
                      "assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                      "{\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n"
                      "{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>"
                      "<|im_end|>\n<|im_start|>user\n<tool_response>\n18 C\n</tool_response>\n"
                      "<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>user\n"
                      "Thanks<|im_end|>\n<|im_start|>assistant\n");
  // Without a system message: the template's default system text comes first.
  out = RenderChat(ChatTemplate{.source = kQwen25}, {chat[1]}, with_tools);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, std::string("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You "
                              "are a helpful assistant.\n\n") +
                      kQwenToolsSystem +
                      "<|im_start|>user\nWeather in Paris? And 2+3?<|im_end|>\n"
                      "<|im_start|>assistant\n");
  // A template without the <tool_call> format renders no tools, calls or results.
  for (const std::vector<ChatMessage>& messages :
       {std::vector<ChatMessage>{chat[1]}, std::vector<ChatMessage>(chat.begin(), chat.end())}) {
    for (const char* source : {kSmolLm2, kGemma3, kLlama3, kLlama31, kMistral}) {
      const ChatRenderOptions options = messages.size() == 1 ? with_tools : ChatRenderOptions{};
      absl::StatusOr<std::string> refused =
          RenderChat(ChatTemplate{.source = source}, messages, options);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << source;
      EXPECT_THAT(refused.status().message(), HasSubstr("does not render tools"));
    }
  }
  EXPECT_TRUE(RendersTools(kQwen25));
  EXPECT_FALSE(RendersTools(kSmolLm2));
}

TEST(ChatTemplateTest, Llama31TemplatesRenderToolsInTheFirstUserMessage) {
  const ChatRenderOptions with_tools{.tools = WeatherTools()};
  const std::vector<ChatMessage> chat = {
      {"system", "Be brief."},
      {"user", "Weather in Paris? And 2+3?"},
      {.role = "assistant",
       .tool_calls = {Call("c1", "get_weather", R"({"city": "Paris", "unit": "c"})")}},
      {.role = "tool", .content = "18 C", .tool_call_id = "c1"},
      {"user", "Thanks"}};
  absl::StatusOr<std::string> out =
      RenderChat(ChatTemplate{.source = kLlama31Tools}, chat, with_tools);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(
      *out,
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
      "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please "
      "respond with a JSON for a function call with its proper arguments that best answers the "
      "given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
      "dictionary of argument name and its value}.Do not use variables.\n\n{\n    \"type\": "
      "\"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n        "
      "\"description\": \"Weather in a city\",\n        \"parameters\": {\n            "
      "\"type\": \"object\",\n            \"properties\": {\n                \"city\": {\n"
      "                    \"type\": \"string\"\n                },\n                \"unit\": "
      "{\n                    \"type\": \"string\",\n                    \"enum\": [\n"
      "                        \"c\",\n                        \"f\"\n                    ]\n"
      "                }\n            },\n            \"required\": [\n                "
      "\"city\"\n            ]\n        }\n    }\n}\n\n{\n    \"type\": \"function\",\n    "
      "\"function\": {\n        \"name\": \"add\",\n        \"parameters\": {\n            "
      "\"type\": \"object\",\n            \"properties\": {\n                \"a\": {\n"
      "                    \"type\": \"number\"\n                },\n                \"b\": {\n"
      "                    \"type\": \"number\"\n                }\n            }\n        }\n"
      "    }\n}\n\nWeather in Paris? And 2+3?<|eot_id|><|start_header_id|>assistant"
      "<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", "
      "\"unit\": \"c\"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n\"18 C\""
      "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nThanks<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // The template's own refusals: two calls in one message; tools without a user message.
  std::vector<ChatMessage> two_calls = chat;
  two_calls[2].tool_calls.push_back(Call("c2", "add", R"({"a": 2, "b": 3})"));
  EXPECT_EQ(
      RenderChat(ChatTemplate{.source = kLlama31Tools}, two_calls, with_tools).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      RenderChat(ChatTemplate{.source = kLlama31Tools}, {chat[0]}, with_tools).status().code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace duet::model
