// The flag groups of `duet generate` (flag_groups.h), read into typed options: the request
// (prompt, sampling, output), the seed and EOS handling (which `duet bench serve` shares), the
// prompt text options of the in-process engine, and the server and deadline of `generate
// --server` (which `duet bench serve` shares too).
//
//   absl::StatusOr<RequestFlags> r = ReadRequestFlags();  // exactly one of --prompt, --prompt-ids
//   ClientFlags c = ReadClientFlags();                   // c.server, c.timeout
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace duet::cli {

struct RequestFlags {
  std::optional<std::string> prompt;               // --prompt, or
  std::optional<std::vector<int32_t>> prompt_ids;  // --prompt-ids
  int max_tokens = 0;
  double temperature = 0;
  double top_p = 1;
  int top_k = 0;
  int logprobs = 0;
  std::vector<int32_t> stop_ids;
  bool json = false;
};

struct SamplingFlags {
  uint64_t seed = 0;
  bool ignore_eos = false;
};

struct PromptTextFlags {
  bool add_bos = true;
  bool chat = false;
};

struct ClientFlags {
  std::string server;      // host:port (gRPC) or, for bench serve, http://host:port
  absl::Duration timeout;  // --timeout-s: one request's deadline
};

// INVALID_ARGUMENT naming the flag unless exactly one of --prompt and --prompt-ids is given, or
// for an id list that is not comma-separated token ids.
absl::StatusOr<RequestFlags> ReadRequestFlags();
SamplingFlags ReadSamplingFlags();
PromptTextFlags ReadPromptTextFlags();
ClientFlags ReadClientFlags();

}  // namespace duet::cli
