#include "bench/serve_bench/http_client.h"

#include <httplib.h>

#include <atomic>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"

namespace duet::bench {
namespace {

using nlohmann::json;

class HttpClient : public Client {
 public:
  HttpClient(std::string base_url, std::string api_key)
      : base_url_(std::move(base_url)), api_key_(std::move(api_key)) {}

  RequestRecord Send(const RequestSpec& spec, absl::Duration timeout, CancelScope* scope) override {
    RequestRecord rec;
    StampRecord(spec, rec);
    json body = {{"max_tokens", spec.max_tokens},
                 {"temperature", 0},
                 {"ignore_eos", true},
                 {"stream", true},
                 {"logprobs", 1},
                 {"stream_options", {{"include_usage", true}}}};
    if (!spec.token_ids.empty()) {
      body["prompt"] = spec.token_ids;
      rec.requested_prompt_tokens = static_cast<int>(spec.token_ids.size());
    } else {
      body["prompt"] = spec.text;
    }

    httplib::Client cli(base_url_);
    const int64_t timeout_us = absl::ToInt64Microseconds(timeout);
    cli.set_connection_timeout(std::chrono::microseconds(timeout_us));
    cli.set_read_timeout(std::chrono::microseconds(timeout_us));
    int64_t key = -1;
    std::atomic<bool> cut{false};
    if (scope != nullptr) {
      key = scope->Add([&cli, &cut] {
        cut = true;
        cli.stop();
      });
      if (key < 0) {
        rec.cut_at_end = true;
        rec.status = absl::CancelledError("not started: the run had ended");
        return rec;
      }
    }
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.headers = {{"Accept", "text/event-stream"}};
    if (!api_key_.empty()) req.headers.emplace("Authorization", "Bearer " + api_key_);
    req.set_header("Content-Type", "application/json");
    req.body = body.dump();
    const absl::Time deadline = absl::Now() + timeout;

    std::string buffer, error_event, raw;
    rec.finish_reason = "none";
    // One SSE event per line pair "data: {...}\n\n"; each completion chunk carries as many
    // logprob entries as it has tokens.
    auto on_event = [&](const std::string& data) {
      if (data == "[DONE]") return;
      json chunk = json::parse(data, nullptr, /*allow_exceptions=*/false);
      if (chunk.is_discarded()) return;
      if (chunk.contains("error")) {
        error_event = chunk["error"].value("message", data);
        return;
      }
      if (auto u = chunk.find("usage"); u != chunk.end() && u->is_object()) {
        rec.prompt_tokens = u->value("prompt_tokens", 0);
        if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object()) {
          if (auto c = d->find("cached_tokens"); c != d->end() && c->is_number_integer()) {
            rec.cache.prefill_cached_tokens = c->get<int>();
          }
        }
      }
      const json& choices = chunk.value("choices", json::array());
      if (choices.empty()) return;
      const json& c = choices[0];
      int tokens = 0;
      if (auto lp = c.find("logprobs"); lp != c.end() && lp->is_object()) {
        tokens = static_cast<int>(lp->value("tokens", json::array()).size());
      }
      const int64_t now = MonotonicNanos();
      for (int i = 0; i < tokens; ++i) rec.token_ns.push_back(now);
      if (auto f = c.find("finish_reason"); f != c.end() && f->is_string()) {
        rec.finish_reason = f->get<std::string>();
      }
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      raw.append(data, std::min<size_t>(n, 4096 - std::min<size_t>(raw.size(), 4096)));
      buffer.append(data, n);
      size_t end;
      while ((end = buffer.find("\n\n")) != std::string::npos) {
        const std::string event = buffer.substr(0, end);
        buffer.erase(0, end + 2);
        if (event.rfind("data: ", 0) == 0) on_event(event.substr(6));
      }
      return !cut.load() && absl::Now() < deadline;
    };
    rec.send_ns = MonotonicNanos();
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    const bool sent = cli.send(req, res, err);
    rec.end_ns = MonotonicNanos();
    if (scope != nullptr) scope->Remove(key);
    if (cut.load()) {
      rec.cut_at_end = true;
      rec.status = absl::CancelledError("cut when the run ended");
    } else if (!sent) {
      rec.status =
          absl::UnavailableError(absl::StrCat("http ", base_url_, ": ", httplib::to_string(err),
                                              absl::Now() >= deadline ? " (deadline)" : ""));
    } else if (res.status != 200) {
      rec.status = absl::UnknownError(absl::StrCat("http ", base_url_, ": status ", res.status,
                                                   ": ", raw.empty() ? res.body : raw));
    } else if (!error_event.empty()) {
      rec.status = absl::InternalError(absl::StrCat("stream error: ", error_event));
    } else if (rec.token_ns.empty()) {
      rec.status = absl::InternalError("stream ended without a token");
    }
    return rec;
  }

  absl::Status WaitReady(absl::Duration timeout) override {
    return PollUntilReady(base_url_, timeout, [this]() -> std::optional<std::string> {
      httplib::Client cli(base_url_);
      cli.set_connection_timeout(std::chrono::seconds(2));
      cli.set_read_timeout(std::chrono::seconds(2));
      httplib::Headers headers;
      if (!api_key_.empty()) headers.emplace("Authorization", "Bearer " + api_key_);
      auto res = cli.Get("/health", headers);
      if (res && res->status == 200) return std::nullopt;
      return res ? absl::StrCat("status ", res->status) : httplib::to_string(res.error());
    });
  }

 private:
  const std::string base_url_;
  const std::string api_key_;
};

}  // namespace

std::unique_ptr<Client> MakeHttpClient(const std::string& base_url, const std::string& api_key) {
  return std::make_unique<HttpClient>(base_url, api_key);
}

}  // namespace duet::bench
