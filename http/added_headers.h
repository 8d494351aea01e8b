// WithHeaders: a responder that puts `extra` headers on the head of whatever response its
// handler sends (a whole reply or a chunked stream), so the headers every response of a request
// carries (CORS, the client's X-Request-Id) are added once, where the request comes in. An extra
// header replaces one of the same name (case-insensitive) that the handler set.
//
//   res = WithHeaders(std::move(res), {{"X-Request-Id", id}});
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "http/http_server.h"

namespace duet::http {

class AddedHeadersResponder : public HttpResponder {
 public:
  AddedHeadersResponder(std::shared_ptr<HttpResponder> inner, HttpHeaders extra)
      : inner_(std::move(inner)), extra_(std::move(extra)) {}

  void Reply(int status, const HttpHeaders& headers, absl::string_view content_type,
             std::string body) override {
    inner_->Reply(status, With(headers), content_type, std::move(body));
  }
  void StartChunked(int status, const HttpHeaders& headers, absl::string_view content_type,
                    std::string idle_chunk) override {
    inner_->StartChunked(status, With(headers), content_type, std::move(idle_chunk));
  }
  bool WriteChunk(std::string data) override { return inner_->WriteChunk(std::move(data)); }
  void EndChunked() override { inner_->EndChunked(); }
  bool gone() const override { return inner_->gone(); }

 private:
  HttpHeaders With(const HttpHeaders& headers) const {
    HttpHeaders all;
    for (const auto& h : headers) {
      bool replaced = false;
      for (const auto& e : extra_) replaced = replaced || absl::EqualsIgnoreCase(h.first, e.first);
      if (!replaced) all.push_back(h);
    }
    all.insert(all.end(), extra_.begin(), extra_.end());
    return all;
  }

  const std::shared_ptr<HttpResponder> inner_;
  const HttpHeaders extra_;
};

inline std::shared_ptr<HttpResponder> WithHeaders(std::shared_ptr<HttpResponder> inner,
                                                  HttpHeaders extra) {
  if (extra.empty()) return inner;
  return std::make_shared<AddedHeadersResponder>(std::move(inner), std::move(extra));
}

}  // namespace duet::http
