// The HTTP front's test rig: HttpFront on 127.0.0.1 over a scripted GenerationBackend
// (FakeBackend: byte tokens of `text`, or `ids`, recording what the front asked) and the byte
// tokenizer with a chat template; shared by http_front_test.cc and http_front_routes_test.cc.
//
//   TEST_F(HttpFrontTest, X) { StartFront({.api_key = "k"}); Reply r = Post("/v1/completions", b);
//   }
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/tokenizer/byte_tokenizer.h"
#include "http/http_front.h"
#include "nlohmann/json.hpp"
#include "tests/integration/http_exchange.h"

namespace duet::http {

using nlohmann::json;

// Emits `text` one byte-token at a time (every `gap`), then finishes with max_tokens, unless
// told to fail first. Records what the front did to it.
class FakeBackend : public GenerationBackend {
 public:
  absl::Status GenerateTo(const v1::GenerateRequest& req, const GenerateSink& sink) override {
    ++calls;
    {
      absl::MutexLock lock(&mu);
      last_request = req;
      requests[req.request_id()] = req;
      started.push_back({req.request_id(), absl::Now()});
    }
    if (!fail.ok()) return fail;
    if (!fail_suffix.empty() && absl::EndsWith(req.request_id(), fail_suffix)) {
      return absl::ResourceExhaustedError("no room for " + req.request_id());
    }
    if (schedule_after != nullptr) {
      schedule_after->WaitForNotification();
      if (sink.scheduled) sink.scheduled(true);
    }
    if (block_until != nullptr) block_until->WaitForNotification();
    std::vector<int32_t> out = ids;
    if (out.empty()) {
      for (unsigned char c : text) out.push_back(c);
    }
    for (size_t i = 0; i < out.size(); ++i) {
      v1::GenerateResponse r;
      r.set_has_token(true);
      r.set_token_id(out[i]);
      r.set_index(static_cast<int>(i));
      r.set_logprob(-0.5f);
      if (i + 1 == out.size()) {
        r.set_finish_reason(finish);
        r.set_prompt_tokens(req.token_ids().ids_size());
        r.mutable_timings()->set_queue_us(2000);
        r.mutable_timings()->set_decode_us(40000);
        r.mutable_timings()->set_prefill_attempts(1);
        r.mutable_timings()->set_prefill_cached_tokens(2);
        r.mutable_timings()->set_resumes(1);
      }
      if (i == 1) {
        absl::MutexLock lock(&mu);
        second_token[req.request_id()] = absl::Now();
      }
      if (sink.cancelled() || !sink.write(r)) {
        cancelled = true;
        satisfied = sink.satisfied && sink.satisfied();
        return absl::CancelledError("the client went away");
      }
      absl::SleepFor(gap);
    }
    return absl::OkStatus();
  }
  v1::HealthResponse Health() override {
    v1::HealthResponse h;
    h.set_ready(ready);
    // A decode pool 60 % used, and a prefill pool (not counted as the KV cache's usage).
    v1::NodeStatus* d = h.add_nodes();
    d->set_kind(v1::NODE_KIND_DECODE);
    d->set_node_id("decode-0");
    d->set_epoch(5);
    d->set_metrics_address("10.0.0.4:9100");  // the prefill node serves no /metrics
    d->mutable_load()->set_total_blocks(10);
    d->mutable_load()->set_free_blocks(4);
    v1::NodeStatus* p = h.add_nodes();
    p->set_kind(v1::NODE_KIND_PREFILL);
    p->mutable_load()->set_total_blocks(100);
    p->mutable_load()->set_free_blocks(0);
    return h;
  }

  std::string text = "Hello";
  std::vector<int32_t> ids;  // set: these token ids instead of text's bytes
  v1::FinishReason finish = v1::FINISH_REASON_MAX_TOKENS;  // the last token's
  absl::Duration gap = absl::ZeroDuration();
  absl::Status fail;
  bool ready = true;
  // Set: the request waits for it, then says it runs (GenerateSink::scheduled), before
  // block_until.
  absl::Notification* schedule_after = nullptr;
  absl::Notification* block_until = nullptr;
  std::atomic<int> calls{0};
  std::atomic<bool> cancelled{false};
  std::atomic<bool> satisfied{false};  // the front said why it cancelled: it has what it wants
  std::string fail_suffix;             // requests whose id ends so fail with ResourceExhausted
  absl::Mutex mu;
  v1::GenerateRequest last_request ABSL_GUARDED_BY(mu);
  std::vector<std::pair<std::string, absl::Time>> started ABSL_GUARDED_BY(mu);  // id, when
  std::map<std::string, absl::Time> second_token ABSL_GUARDED_BY(mu);  // id: its index-1 write
  std::map<std::string, v1::GenerateRequest> requests ABSL_GUARDED_BY(mu);
};

// The byte tokenizer with a chat template.
class TemplatedTokenizer : public model::Tokenizer {
 public:
  explicit TemplatedTokenizer(std::string tmpl)
      : inner_(*model::ByteTokenizer::Create(320)), tmpl_(std::move(tmpl)) {}
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text,
                                              bool add_bos) const override {
    return inner_->Encode(text, add_bos);
  }
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override {
    return inner_->Decode(ids);
  }
  int32_t vocab_size() const override { return inner_->vocab_size(); }
  int32_t bos_id() const override { return inner_->bos_id(); }
  std::vector<int32_t> eos_ids() const override { return inner_->eos_ids(); }
  std::string name() const override { return "templated"; }
  std::string chat_template() const override { return tmpl_; }

 private:
  std::unique_ptr<model::ByteTokenizer> inner_;
  std::string tmpl_;
};

using testing::Exchange;
using testing::Reply;

class HttpFrontTest : public ::testing::Test {
 protected:
  void StartFront(HttpFrontOptions o = {}, const std::string& chat_template = "") {
    tokenizer_ = std::make_unique<TemplatedTokenizer>(chat_template);
    o.host = "127.0.0.1";
    o.port = 0;
    o.context_length = 64;
    auto f = HttpFront::Start(o, &backend_, tokenizer_.get(), &registry_);
    ASSERT_TRUE(f.ok()) << f.status();
    front_ = *std::move(f);
  }
  Reply Post(const std::string& path, const json& body, const std::string& headers = "") {
    return Exchange(front_->port(), "POST", path, body.dump(), headers);
  }
  static json Error(const Reply& r) { return json::parse(r.body)["error"]; }
  // Each of `lines` appears in /metrics' registry within 5 s (a generation's thread updates the
  // counters just after the backend returns).
  void ExpectMetricsSoon(const std::vector<std::string>& lines) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    std::string m;
    while (absl::Now() < deadline) {
      m = registry_.Render();
      bool all = true;
      for (const std::string& l : lines) all = all && m.find(l) != std::string::npos;
      if (all) return;
      absl::SleepFor(absl::Milliseconds(10));
    }
    for (const std::string& l : lines) EXPECT_NE(m.find(l), std::string::npos) << l << "\n" << m;
  }

  FakeBackend backend_;
  std::unique_ptr<model::Tokenizer> tokenizer_;
  metrics::Registry registry_;
  std::unique_ptr<HttpFront> front_;
};

}  // namespace duet::http
