// The TLS flag groups (flag_groups.h): mutual TLS of duet's gRPC (every command that runs a
// channel or a server: the cluster's processes, serve, generate --server, bench serve) and HTTPS
// on the OpenAI-compatible HTTP API (vLLM's --ssl-certfile / --ssl-keyfile / --ssl-ca-certs).
// Each file is read and checked once, at startup; a partial set is refused by name.
//
//   DUET_RETURN_IF_ERROR(InstallGrpcTlsFromFlags());  // main.cc, before any channel or server
//   std::optional<http::HttpFrontOptions> http = HttpFrontOptionsFromFlags();
//   DUET_RETURN_IF_ERROR(AddHttpsFromFlags(http));  // refuses --ssl-certfile without the API
#pragma once

#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tls/tls_files.h"
#include "http/http_front.h"

namespace duet::cli {

// --tls-ca-file, --tls-cert-file, --tls-key-file: all three (mutual TLS) or none (nullopt,
// plaintext); INVALID_ARGUMENT naming the flags given and those missing.
absl::StatusOr<std::optional<tls::TlsFiles>> ReadGrpcTlsFlags();
// ReadGrpcTlsFlags, the files loaded and checked (tls_files.h), then rpc::SetProcessTls.
absl::Status InstallGrpcTlsFromFlags();

// --ssl-certfile and --ssl-keyfile (both or neither), --ssl-ca-certs (only with them): nullopt
// for plain HTTP; with --ssl-ca-certs, clients must present a certificate signed by it.
absl::StatusOr<std::optional<tls::TlsFiles>> ReadHttpsFlags();
// Sets http->tls from ReadHttpsFlags, loaded and checked; INVALID_ARGUMENT for an --ssl-* flag
// while the HTTP API is off (http is nullopt).
absl::Status AddHttpsFromFlags(std::optional<http::HttpFrontOptions>& http);

}  // namespace duet::cli
