// The benchmark client for duet's OpenAI-compatible HTTP API (the coordinator's --http_port), or
// any server that speaks it: POST /v1/completions with stream=true, greedy, ignore_eos, and
// logprobs=1 so that every token arrives as its own server-sent event (a token with no text of
// its own, inside a multi-byte character, still carries its logprob entry). The API reports no
// server-side breakdown, so records carry client-side times only.
//
//   std::unique_ptr<Client> c = MakeHttpClient("http://127.0.0.1:8000", /*api_key=*/"");
//   DUET_RETURN_IF_ERROR(c->WaitReady(absl::Seconds(30)));    // GET /health until 200
#pragma once

#include <memory>
#include <string>

#include "bench/serve_bench/client.h"

namespace duet::bench {

std::unique_ptr<Client> MakeHttpClient(const std::string& base_url, const std::string& api_key);

}  // namespace duet::bench
