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

}  // namespace
}  // namespace duet::model
