// `duet generate --server ADDR`: the same command as the in-process generate, served by a
// cluster: streams tokens from the coordinator and prints the text, or the same JSON (plus the
// server-side timing breakdown).
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/generate_flags.h"
#include "common/base/clock.h"
#include "duet/v1/client.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "proto/channel.h"
#include "proto/status_util.h"

namespace duet::cli {

int RunGenerateRemote() {
  absl::StatusOr<RequestFlags> request = ReadRequestFlags();
  if (!request.ok()) {
    std::fprintf(stderr, "duet generate: %s\n", std::string(request.status().message()).c_str());
    return 2;
  }
  const ClientFlags client = ReadClientFlags();
  v1::GenerateRequest req;
  if (request->prompt_ids) {
    req.mutable_token_ids()->mutable_ids()->Assign(request->prompt_ids->begin(),
                                                   request->prompt_ids->end());
  } else {
    req.set_text(*request->prompt);
  }
  v1::SamplingParams* s = req.mutable_sampling();
  s->set_temperature(static_cast<float>(request->temperature));
  s->set_top_p(static_cast<float>(request->top_p));
  s->set_top_k(request->top_k);
  const SamplingFlags sampling = ReadSamplingFlags();
  s->set_seed(sampling.seed);
  s->set_max_tokens(request->max_tokens);
  s->set_logprobs(request->logprobs);
  s->set_ignore_eos(sampling.ignore_eos);
  s->mutable_stop_token_ids()->Assign(request->stop_ids.begin(), request->stop_ids.end());
  req.set_return_text(true);

  auto stub = v1::Generation::NewStub(rpc::MakeChannel(client.server));
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, client.timeout);
  Stopwatch sw;
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse r;
  std::vector<int32_t> generated;
  std::string text;
  nlohmann::json logprobs = nlohmann::json::array();
  std::string finish = "none";
  double ttft_ms = 0;
  std::vector<double> token_ms;
  v1::RequestTimings timings;
  int32_t prompt_tokens = 0;
  const bool json = request->json;
  while (reader->Read(&r)) {
    if (r.has_token()) {
      const double t = sw.ElapsedMs();
      if (generated.empty())
        ttft_ms = t;
      else
        token_ms.push_back(t);
      generated.push_back(r.token_id());
      text += r.text();
      if (!json) {
        std::cout << r.text() << std::flush;
      }
      nlohmann::json e{{"id", r.token_id()}, {"logprob", r.logprob()}};
      nlohmann::json top = nlohmann::json::array();
      for (const v1::TopLogprob& tl : r.top_logprobs()) {
        top.push_back({{"id", tl.token_id()}, {"logprob", tl.logprob()}});
      }
      e["top"] = top;
      logprobs.push_back(e);
    }
    if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      finish = r.finish_reason() == v1::FINISH_REASON_EOS          ? "eos"
               : r.finish_reason() == v1::FINISH_REASON_STOP_TOKEN ? "stop"
               : r.finish_reason() == v1::FINISH_REASON_MAX_TOKENS ? "length"
                                                                   : "error";
      timings = r.timings();
      prompt_tokens = r.prompt_tokens();
    }
  }
  absl::Status st = rpc::FromGrpcStatus(reader->Finish());
  if (!st.ok()) {
    if (!json) std::cout << std::endl;
    std::fprintf(stderr, "duet generate: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  if (!json) {
    std::cout << std::endl;
    return 0;
  }
  nlohmann::json j;
  j["server"] = client.server;
  j["prompt_tokens"] = prompt_tokens;
  if (req.has_token_ids()) {
    j["prompt_ids"] =
        std::vector<int32_t>(req.token_ids().ids().begin(), req.token_ids().ids().end());
  }
  j["generated_ids"] = generated;
  j["text"] = text;
  j["finish_reason"] = finish;
  j["logprobs"] = logprobs;
  j["timings"] = {{"ttft_ms", ttft_ms},
                  {"token_ms", token_ms},
                  {"server_queue_us", timings.queue_us()},
                  {"server_prefill_compute_us", timings.prefill_compute_us()},
                  {"server_transfer_tail_us", timings.transfer_tail_us()},
                  {"server_decode_admission_us", timings.decode_admission_us()},
                  {"server_ttft_us", timings.time_to_first_token_us()},
                  {"prefill_attempts", timings.prefill_attempts()},
                  {"prefill_cached_tokens", timings.prefill_cached_tokens()},
                  {"decode_cached_tokens", timings.decode_cached_tokens()},
                  {"kv_bytes_sent", timings.kv_bytes_sent()},
                  {"layer_transfer_us", std::vector<int64_t>(timings.layer_transfer_us().begin(),
                                                             timings.layer_transfer_us().end())}};
  std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  return 0;
}

}  // namespace duet::cli
