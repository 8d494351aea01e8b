// What the serving benchmark measures for one request: client-side timestamps of every streamed
// token (steady clock) and the server-side breakdown the cluster reports on the final message.
//
//   RequestRecord r = client.Send(spec, deadline, &scope);
//   if (r.status.ok() && r.token_ns.size() >= 2) double gap = r.FirstToSecondGapMs();
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace duet::bench {

// Server-side times of one request, microseconds (duet.v1.RequestTimings).
struct ServerTimings {
  int64_t queue_us = 0;             // coordinator received -> prefill started
  int64_t reserve_us = 0;           // Reserve round trip to the decode node
  int64_t prefill_compute_us = 0;   // the prefill forward pass
  int64_t transfer_tail_us = 0;     // last layer computed -> all KV landed on the decode node
  int64_t decode_admission_us = 0;  // KV landed -> joined the decode batch
  int64_t ttft_us = 0;              // server's time to first token
  int64_t decode_us = 0;            // first token -> finish
  int prefill_attempts = 0;
  int resumes = 0;        // continued on another decode node (preempted, or its node died)
  int64_t resume_us = 0;  // stream stopped -> next token, summed over the resumes
  // Per layer, compute done on the prefill node -> landed on the decode node: the last layer's
  // and the slowest layer's (-1 when the nodes did not report per-layer times).
  int64_t last_layer_transfer_us = -1;
  int64_t max_layer_transfer_us = -1;
};

// What the prefix cache saved on one request. -1: not reported by the endpoint (the HTTP API
// reports only the prefill side; an endpoint without prefix caching reports nothing).
struct CacheStats {
  int prefill_cached_tokens = -1;  // prompt tokens P (or the colocated server) took from its cache
  int decode_cached_tokens = -1;   // prompt tokens D already held: their KV was not sent
  int64_t kv_bytes_sent = -1;      // KV bytes P wrote to D (0 colocated)
};

struct RequestRecord {
  std::string cls;
  absl::Status status;              // OK, or why the request failed
  bool cut_at_end = false;          // cancelled by the runner when the measured run ended
  int64_t send_ns = 0;              // steady clock when the request was sent
  int64_t end_ns = 0;               // steady clock when the stream finished
  double schedule_lag_ms = 0;       // sent this long after its scheduled arrival (open loop)
  std::vector<int64_t> token_ns;    // steady clock at each streamed token
  int prompt_tokens = 0;            // as the server counted them (0 if not reported)
  int requested_prompt_tokens = 0;  // token ids sent (0 for text prompts)
  int max_tokens = 0;
  std::string finish_reason;  // eos, length, stop, cancelled, error, none
  bool has_server_timings = false;
  ServerTimings server;
  CacheStats cache;
  std::vector<int32_t> output_ids;  // the generated token ids (gRPC; empty over HTTP)
  // Copied from the RequestSpec: which shared prefix / chat session and turn (-1: none), and
  // how many prompt tokens are new (not in the session's previous turn's prompt + output).
  int prefix_group = -1;
  int session = -1;
  int turn = -1;
  int new_tokens = 0;

  // Prompt tokens as the server counted them, else as sent.
  int PromptTokens() const { return prompt_tokens > 0 ? prompt_tokens : requested_prompt_tokens; }
  bool ok() const { return status.ok() && !token_ns.empty(); }
  int output_tokens() const { return static_cast<int>(token_ns.size()); }
  double TtftMs() const { return (token_ns.front() - send_ns) / 1e6; }
  double E2eMs() const { return (end_ns - send_ns) / 1e6; }
  bool HasTpot() const { return token_ns.size() >= 2; }
  // (last - first) / (n - 1): the mean time per output token after the first.
  double TpotMs() const {
    return (token_ns.back() - token_ns.front()) / 1e6 / static_cast<double>(token_ns.size() - 1);
  }
  // TPOT as vLLM's benchmark defines it for SLOs: (end - first token) / (n - 1), the stream's
  // end rather than its last token (the same but for the final message's arrival).
  double SloTpotMs() const {
    return (end_ns - token_ns.front()) / 1e6 / static_cast<double>(token_ns.size() - 1);
  }
  // The first token comes from the prefill node; the second from the decode node once the KV
  // has landed: the transfer shows here, not in TTFT.
  double FirstToSecondGapMs() const { return (token_ns[1] - token_ns[0]) / 1e6; }
  std::vector<double> ItlMs() const {
    std::vector<double> out;
    for (size_t i = 1; i < token_ns.size(); ++i)
      out.push_back((token_ns[i] - token_ns[i - 1]) / 1e6);
    return out;
  }
};

}  // namespace duet::bench
