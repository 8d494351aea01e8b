#include "http/connection_stream.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace duet::http::internal {

std::string PeerOf(tcp::socket& socket) {
  error_code ec;
  const tcp::endpoint ep = socket.remote_endpoint(ec);
  return ec ? std::string("?") : absl::StrCat(ep.address().to_string(), ":", ep.port());
}

void Refusal::Start() {
  timer_.expires_after(std::chrono::seconds(2));
  timer_.async_wait([self = shared_from_this()](error_code ec) {
    if (!ec) self->Close();
  });
  if (!stream_.tls()) return Write();
  stream_.async_handshake([self = shared_from_this()](error_code ec) {
    if (ec) return self->Close();
    self->Write();
  });
}

void Refusal::Write() {
  asio::async_write(stream_, asio::buffer(out_),
                    [self = shared_from_this()](error_code ec, size_t) {
                      if (ec) return self->Close();
                      error_code ignored;
                      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
                      self->Discard();
                    });
}

void Refusal::Discard() {
  stream_.async_read_some(asio::buffer(buf_), [self = shared_from_this()](error_code ec, size_t) {
    if (ec) return self->Close();
    self->Discard();
  });
}

void Refusal::Close() {
  error_code ignored;
  timer_.cancel();
  stream_.socket().close(ignored);
}

}  // namespace duet::http::internal
