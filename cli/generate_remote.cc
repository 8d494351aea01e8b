// `duet generate --server ADDR`: the same command as the in-process generate, served by a
// cluster: streams tokens from the coordinator and prints the text, or the same JSON (plus the
// server-side timing breakdown).
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cli/commands.h"
#include "common/base/clock.h"
#include "duet/v1/client.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "proto/channel.h"
#include "proto/status_util.h"

ABSL_DECLARE_FLAG(std::string, prompt);
ABSL_DECLARE_FLAG(std::string, prompt_ids);
ABSL_DECLARE_FLAG(int, max_tokens);
ABSL_DECLARE_FLAG(double, temperature);
ABSL_DECLARE_FLAG(double, top_p);
ABSL_DECLARE_FLAG(int, top_k);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(int, logprobs);
ABSL_DECLARE_FLAG(bool, ignore_eos);
ABSL_DECLARE_FLAG(std::string, stop_ids);
ABSL_DECLARE_FLAG(bool, json);
ABSL_FLAG(std::string, server, "", "generate: send the request to this coordinator (host:port)");
ABSL_FLAG(int, timeout_s, 300, "generate --server: deadline of the whole request");

namespace duet::cli {
namespace {

bool ParseIdList(const std::string& text, std::vector<int32_t>* out) {
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id)) return false;
    out->push_back(id);
  }
  return true;
}

}  // namespace

bool GenerateUsesServer() { return !absl::GetFlag(FLAGS_server).empty(); }

int RunGenerateRemote() {
  if (absl::GetFlag(FLAGS_prompt).empty() == absl::GetFlag(FLAGS_prompt_ids).empty()) {
    std::fprintf(stderr, "duet generate: give exactly one of --prompt and --prompt-ids\n");
    return 2;
  }
  v1::GenerateRequest req;
  if (!absl::GetFlag(FLAGS_prompt_ids).empty()) {
    std::vector<int32_t> ids;
    if (!ParseIdList(absl::GetFlag(FLAGS_prompt_ids), &ids)) {
      std::fprintf(stderr, "duet generate: --prompt-ids must be comma-separated token ids\n");
      return 2;
    }
    req.mutable_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
  } else {
    req.set_text(absl::GetFlag(FLAGS_prompt));
  }
  v1::SamplingParams* s = req.mutable_sampling();
  s->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  s->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  s->set_top_k(absl::GetFlag(FLAGS_top_k));
  s->set_seed(absl::GetFlag(FLAGS_seed));
  s->set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
  s->set_logprobs(absl::GetFlag(FLAGS_logprobs));
  s->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  std::vector<int32_t> stop;
  if (!ParseIdList(absl::GetFlag(FLAGS_stop_ids), &stop)) {
    std::fprintf(stderr, "duet generate: --stop-ids must be comma-separated token ids\n");
    return 2;
  }
  s->mutable_stop_token_ids()->Assign(stop.begin(), stop.end());
  req.set_return_text(true);

  auto stub = v1::Generation::NewStub(rpc::MakeChannel(absl::GetFlag(FLAGS_server)));
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, absl::Seconds(absl::GetFlag(FLAGS_timeout_s)));
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
  const bool json = absl::GetFlag(FLAGS_json);
  while (reader->Read(&r)) {
    if (r.has_token()) {
      const double t = sw.ElapsedMs();
      if (generated.empty()) ttft_ms = t; else token_ms.push_back(t);
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
  j["server"] = absl::GetFlag(FLAGS_server);
  j["prompt_tokens"] = prompt_tokens;
  if (req.has_token_ids()) {
    j["prompt_ids"] = std::vector<int32_t>(req.token_ids().ids().begin(), req.token_ids().ids().end());
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
