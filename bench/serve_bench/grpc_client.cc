#include "bench/serve_bench/grpc_client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "duet/v1/client.grpc.pb.h"
#include "proto/channel.h"

namespace duet::bench {
namespace {

const char* FinishName(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_EOS:
      return "eos";
    case v1::FINISH_REASON_MAX_TOKENS:
      return "length";
    case v1::FINISH_REASON_STOP_TOKEN:
      return "stop";
    case v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    case v1::FINISH_REASON_ERROR:
      return "error";
    default:
      return "none";
  }
}

class GrpcClient : public Client {
 public:
  explicit GrpcClient(const std::string& address)
      : address_(address), stub_(v1::Generation::NewStub(rpc::MakeChannel(address))) {}

  RequestRecord Send(const RequestSpec& spec, absl::Duration timeout, CancelScope* scope) override {
    RequestRecord rec;
    StampRecord(spec, rec);
    v1::GenerateRequest req;
    if (!spec.token_ids.empty()) {
      req.mutable_token_ids()->mutable_ids()->Assign(spec.token_ids.begin(), spec.token_ids.end());
      rec.requested_prompt_tokens = static_cast<int>(spec.token_ids.size());
    } else {
      req.set_text(spec.text);
    }
    v1::SamplingParams* s = req.mutable_sampling();
    s->set_temperature(0);  // greedy; with ignore_eos every request yields exactly max_tokens
    s->set_max_tokens(spec.max_tokens);
    s->set_ignore_eos(true);

    grpc::ClientContext ctx;
    rpc::SetDeadline(ctx, timeout);
    int64_t key = -1;
    if (scope != nullptr) {
      key = scope->Add([&ctx] { ctx.TryCancel(); });
      if (key < 0) {
        rec.cut_at_end = true;
        rec.status = absl::CancelledError("not started: the run had ended");
        return rec;
      }
    }
    rec.send_ns = MonotonicNanos();
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse r;
    rec.finish_reason = "none";
    while (reader->Read(&r)) {
      if (r.has_token()) {
        rec.token_ns.push_back(MonotonicNanos());
        rec.output_ids.push_back(r.token_id());
      }
      if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
        rec.finish_reason = FinishName(r.finish_reason());
        rec.prompt_tokens = r.prompt_tokens();
        if (r.has_timings()) {
          const v1::RequestTimings& t = r.timings();
          rec.has_server_timings = true;
          rec.server = {.queue_us = t.queue_us(),
                        .reserve_us = t.reserve_us(),
                        .prefill_compute_us = t.prefill_compute_us(),
                        .transfer_tail_us = t.transfer_tail_us(),
                        .decode_admission_us = t.decode_admission_us(),
                        .ttft_us = t.time_to_first_token_us(),
                        .decode_us = t.decode_us(),
                        .prefill_attempts = t.prefill_attempts(),
                        .resumes = t.resumes(),
                        .resume_us = t.resume_us()};
          rec.cache = {.prefill_cached_tokens = t.prefill_cached_tokens(),
                       .decode_cached_tokens = t.decode_cached_tokens(),
                       .kv_bytes_sent = t.kv_bytes_sent()};
          for (int64_t us : t.layer_transfer_us()) {
            rec.server.max_layer_transfer_us = std::max(rec.server.max_layer_transfer_us, us);
          }
          if (t.layer_transfer_us_size() > 0) {
            rec.server.last_layer_transfer_us = t.layer_transfer_us(t.layer_transfer_us_size() - 1);
          }
        }
      }
    }
    const grpc::Status st = reader->Finish();
    rec.end_ns = MonotonicNanos();
    if (scope != nullptr) scope->Remove(key);
    if (!st.ok()) {
      if (st.error_code() == grpc::StatusCode::CANCELLED && scope != nullptr &&
          scope->cancelled()) {
        rec.cut_at_end = true;
      }
      rec.status = absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                                absl::StrCat("grpc ", address_, ": ", st.error_message()));
    } else if (rec.finish_reason == "error" || rec.finish_reason == "cancelled") {
      rec.status =
          absl::InternalError(absl::StrCat("stream ended with finish_reason ", rec.finish_reason));
    } else if (rec.token_ns.empty()) {
      rec.status = absl::InternalError("stream ended without a token");
    }
    return rec;
  }

  absl::Status WaitReady(absl::Duration timeout) override {
    return PollUntilReady(address_, timeout, [this]() -> std::optional<std::string> {
      grpc::ClientContext ctx;
      rpc::SetDeadline(ctx, absl::Seconds(2));
      v1::HealthResponse h;
      const grpc::Status st = stub_->Health(&ctx, v1::HealthRequest(), &h);
      if (st.ok() && h.ready()) return std::nullopt;
      return st.ok() ? std::string("not ready") : st.error_message();
    });
  }

 private:
  const std::string address_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

}  // namespace

std::unique_ptr<Client> MakeGrpcClient(const std::string& address) {
  return std::make_unique<GrpcClient>(address);
}

}  // namespace duet::bench
