// Tool calling as vLLM's OpenAI-compatible server does it: the request's `tools`, `tool_choice`
// and `parallel_tool_calls` read into a ToolRequest; the grammar that enforces tool_choice
// "required" (a JSON array of {"name", "parameters"} objects, one of the tools each) and a named
// function (its parameters' schema); and the ToolCallExtractor that turns a choice's output text
// into OpenAI tool calls as it streams: the whole output for a named function, the array for
// "required", and with "auto" the parser the server names (vLLM's --tool-call-parser):
// - hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks (Qwen2.5, Qwen3,
//   Hermes); the text before the first block is the content;
// - llama3_json: an output that starts with `{` (or <|python_tag|>) is one or more
//   {"name": ..., "parameters": {...}} objects separated by `;`.
// An output that does not parse as calls stays content, so nothing the model wrote is lost.
//
//   ToolRequest tools;
//   if (std::optional<ApiError> e = ParseTools(ordered_body, &tools)) reply(*e);
//   std::optional<grammar::GrammarSpec> g = ToolGrammar(tools);  // required / named
//   ToolCallExtractor x(tools, ToolCallParser::kHermes, "chatcmpl-tool-7");
//   ChatDelta d = x.Add(piece);   // content and tool-call deltas to send now
//   ChatDelta last = x.Finish();  // at the end of the output
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/grammar/grammar_spec.h"
#include "http/openai_protocol.h"
#include "nlohmann/json.hpp"

namespace duet::http {

enum class ToolCallParser { kNone, kHermes, kLlama3Json };
// "hermes", "llama3_json"; others InvalidArgument naming them.
absl::StatusOr<ToolCallParser> ParseToolCallParser(absl::string_view name);

// Reads `tools` (each {"type": "function", "function": {"name", "description"?, "parameters"?}},
// names distinct), `tool_choice` (none, auto, required, {"type": "function", "function":
// {"name"}}; auto by default when tools are given, as OpenAI) and `parallel_tool_calls` from
// the body, read with its keys in order. A named function that is not among the tools, or a
// tool_choice other than none without tools, is an error.
std::optional<ApiError> ParseTools(const nlohmann::ordered_json& body, ToolRequest* out);

// The grammar that enforces tool_choice required or a named function; nullopt otherwise.
std::optional<grammar::GrammarSpec> ToolGrammar(const ToolRequest& request);

// One call as the response reports it; `arguments` is JSON text.
struct ToolCallOut {
  std::string id;
  std::string name;
  std::string arguments;
};

// What a piece of output adds to a chat message: content, and tool calls (a call's first delta
// carries its id and name; later ones append to its arguments).
struct ToolCallDelta {
  int index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};
struct ChatDelta {
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
};
// The deltas as OpenAI's chunk.choices[].delta.tool_calls (null when there are none).
nlohmann::json ToolCallDeltasJson(const std::vector<ToolCallDelta>& deltas);
// Whole calls as a message's tool_calls.
nlohmann::json ToolCallsJson(const std::vector<ToolCallOut>& calls);

class ToolCallExtractor {
 public:
  // `parser` is used with tool_choice auto; `id_prefix` + "-" + index names each call.
  ToolCallExtractor(const ToolRequest& request, ToolCallParser parser, std::string id_prefix);

  // The next piece of output text; returns what may be sent now.
  ChatDelta Add(const std::string& text);
  // The end of the output: what was held back.
  ChatDelta Finish();

  // Whether the output made tool calls (so far), and the calls and content in whole.
  bool called() const { return !calls_.empty(); }
  const std::vector<ToolCallOut>& calls() const { return calls_; }
  const std::string& content() const { return content_; }
  // The choice's finish reason given the engine's: "tool_calls" when the output made calls, as
  // OpenAI reports it (not for a named function: "stop" there, as OpenAI), unless the output was
  // cut short ("length").
  std::string FinishReason(const std::string& engine_reason) const;

 private:
  enum class Mode { kContent, kNamed, kRequired, kHermes, kLlama3 };
  void Emit(ChatDelta* d, std::string content);
  void Call(ChatDelta* d, std::string name, std::string arguments);
  void HermesScan(ChatDelta* d, bool final);
  bool ParseRequired(ChatDelta* d);
  bool ParseLlama3(ChatDelta* d);

  Mode mode_ = Mode::kContent;
  std::string named_;
  bool parallel_ = true;
  std::string id_prefix_;
  std::string pending_;   // text not yet sent
  bool in_call_ = false;  // hermes: inside a <tool_call> block
  bool llama3_decided_ = false;
  std::vector<ToolCallOut> calls_;
  std::string content_;
};

}  // namespace duet::http
