// The HTTP API flag groups (flag_groups.h): the OpenAI-compatible API of the processes that
// serve clients (`duet coordinator`, `duet serve`), and its key, which `duet bench serve`
// sends as a client.
//
//   std::optional<http::HttpFrontOptions> h = HttpFrontOptionsFromFlags();  // nullopt: API off
//   DUET_RETURN_IF_ERROR(AddChatFromFlags(h));  // the chat template and tool calling
//   std::string key = ReadApiKeyFlag();
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "http/http_front.h"

namespace duet::cli {

// --http-port (-1: nullopt, the API is off), --http-host, --served-model-name, --api-key,
// --max-body-bytes, --max-concurrent-streams, --http-max-connections, the CORS flags
// (--allowed-origins, --allowed-methods, --allowed-headers: JSON lists, as vLLM's;
// --allow-credentials) and the --http-{header,body,idle,write}-timeout-s deadlines (a non-positive
// --http-write-timeout-s is refused by HttpFront::Start, naming it).
std::optional<http::HttpFrontOptions> HttpFrontOptionsFromFlags();
// --chat_template (the file is read here), --enable_auto_tool_choice and --tool_call_parser into
// the API's options; InvalidArgument naming the flag when one is wrong or given without the API.
absl::Status AddChatFromFlags(std::optional<http::HttpFrontOptions>& http);
std::string ReadApiKeyFlag();

}  // namespace duet::cli
