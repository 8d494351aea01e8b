// gRPC channels and servers for duet's control plane, with the settings every process wants:
// no HTTP proxy (loopback traffic must never leave the box), keepalive, large messages; and, for
// a peer that must be found again soon after it restarts, a short reconnect backoff.
//
//   std::shared_ptr<grpc::Channel> ch = duet::rpc::MakeChannel("127.0.0.1:5000");
//   auto member = duet::rpc::MakeChannel(coordinator, duet::rpc::ReconnectBackoff{});
//   auto stub = duet::v1::DecodeNode::NewStub(ch);
//   grpc::ClientContext ctx;  duet::rpc::SetDeadline(ctx, absl::Seconds(2));
//   DUET_ASSIGN_OR_RETURN(auto server, duet::rpc::StartServer("127.0.0.1:0", {&service}, &port));
//
// Mutual TLS: plaintext by default; once SetProcessTls(identity) has been called (at startup,
// before the first channel or server) every channel presents the identity's certificate and
// verifies the server's against its CA and the host it dials (an IP address must be an IP SAN
// of the server's certificate), and every server requires a client certificate signed by that CA
// (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY). A refused peer fails the TLS
// handshake: gRPC logs the reason on the refusing side ("Handshake failed with fatal error
// SSL_ERROR_SSL: ... certificate verify failed"), and the caller's RPC fails UNAVAILABLE.
//   DUET_ASSIGN_OR_RETURN(tls::TlsIdentity id, tls::LoadTlsIdentity(files));
//   DUET_RETURN_IF_ERROR(duet::rpc::SetProcessTls(std::move(id)));
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls/tls_files.h"
#include "grpcpp/grpcpp.h"

namespace duet::rpc {

// The transport security of every channel and server made after it: `identity` for mutual TLS,
// nullopt for plaintext (the default). INVALID_ARGUMENT for an identity without a CA (it could
// verify no peer).
absl::Status SetProcessTls(std::optional<tls::TlsIdentity> identity);
// What SetProcessTls set; nullptr: plaintext.
std::shared_ptr<const tls::TlsIdentity> ProcessTls();

// Credentials of one channel or server: mutual TLS with `identity`, plaintext for nullptr.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const tls::TlsIdentity* identity);
std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(const tls::TlsIdentity* identity);

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

// How soon a channel tries again after failing to connect. gRPC's defaults (1 s, growing 1.6x
// per failure up to 120 s, a 20 s connect timeout) keep a client away from a restarted server
// for seconds to minutes; these retry every `max` at most, so a call waiting for the channel
// (wait_for_ready) goes out within about `max` of the server's return.
struct ReconnectBackoff {
  absl::Duration initial = absl::Milliseconds(100);  // GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS
  absl::Duration max = absl::Milliseconds(200);      // GRPC_ARG_MAX_RECONNECT_BACKOFF_MS
  // How long one connection attempt may take (GRPC_ARG_MIN_RECONNECT_BACKOFF_MS): a peer that
  // does not answer at all (a lost host) is given up on after this and tried again.
  absl::Duration connect_timeout = absl::Seconds(1);
};
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const ReconnectBackoff& backoff);

// "host:port" that other machines reach a server at: the host of its listen address with the
// port it bound; a wildcard host (empty, 0.0.0.0, ::) becomes this machine's host name, so a
// node listening on every interface never advertises 127.0.0.1 to a remote coordinator.
std::string AdvertisedAddress(const std::string& listen_address, int bound_port);

// Sets ctx's deadline to now + timeout.
void SetDeadline(grpc::ClientContext& ctx, absl::Duration timeout);

// Builds and starts a server on `address` ("host:port"; port 0 picks a free one, written to
// *bound_port). Fails with a clear error when the address cannot be bound.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(const std::string& address,
                                                          const std::vector<grpc::Service*>& services,
                                                          int* bound_port);

}  // namespace duet::rpc
