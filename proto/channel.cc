#include "proto/channel.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace duet::rpc {

namespace {

grpc::ChannelArguments CommonArgs() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetMaxReceiveMessageSize(64 << 20);
  return args;
}

int Millis(absl::Duration d) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, 1 << 30));
}

struct ProcessSecurity {
  absl::Mutex mu;
  std::shared_ptr<const tls::TlsIdentity> identity ABSL_GUARDED_BY(mu);
};

ProcessSecurity& Security() {
  static ProcessSecurity* const security = new ProcessSecurity;
  return *security;
}

std::shared_ptr<grpc::ChannelCredentials> ProcessChannelCredentials() {
  return ChannelCredentialsFor(ProcessTls().get());
}

}  // namespace

absl::Status SetProcessTls(std::optional<tls::TlsIdentity> identity) {
  if (identity && identity->ca_pem.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mutual TLS needs a CA file to verify peers against (certificate file ",
                     identity->files.cert_file, ")"));
  }
  ProcessSecurity& s = Security();
  absl::MutexLock lock(&s.mu);
  s.identity = identity ? std::make_shared<const tls::TlsIdentity>(*std::move(identity)) : nullptr;
  return absl::OkStatus();
}

std::shared_ptr<const tls::TlsIdentity> ProcessTls() {
  ProcessSecurity& s = Security();
  absl::MutexLock lock(&s.mu);
  return s.identity;
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const tls::TlsIdentity* identity) {
  if (identity == nullptr) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = identity->ca_pem;
  ssl.pem_private_key = identity->key_pem;
  ssl.pem_cert_chain = identity->cert_pem;
  return grpc::SslCredentials(ssl);
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(const tls::TlsIdentity* identity) {
  if (identity == nullptr) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = identity->ca_pem;
  ssl.pem_key_cert_pairs.push_back({identity->key_pem, identity->cert_pem});
  return grpc::SslServerCredentials(ssl);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  return grpc::CreateCustomChannel(address, ProcessChannelCredentials(), CommonArgs());
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const ReconnectBackoff& backoff) {
  grpc::ChannelArguments args = CommonArgs();
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, Millis(backoff.initial));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, Millis(backoff.max));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, Millis(backoff.connect_timeout));
  return grpc::CreateCustomChannel(address, ProcessChannelCredentials(), args);
}

std::string AdvertisedAddress(const std::string& listen_address, int bound_port) {
  std::string host = listen_address.substr(0, listen_address.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
    char name[256] = {0};
    host = gethostname(name, sizeof(name) - 1) == 0 && name[0] != 0 ? std::string(name)
                                                                      : "127.0.0.1";
  }
  return absl::StrCat(host, ":", bound_port);
}

void SetDeadline(grpc::ClientContext& ctx, absl::Duration timeout) {
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::microseconds(absl::ToInt64Microseconds(timeout)));
}

absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(const std::string& address,
                                                          const std::vector<grpc::Service*>& services,
                                                          int* bound_port) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, ServerCredentialsFor(ProcessTls().get()), &port);
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  // The server pings its clients too, so a long-lived server stream (NodeStatusStream.Watch)
  // to a peer that vanished ends within keepalive time + timeout instead of hours.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  for (grpc::Service* s : services) builder.RegisterService(s);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address,
                                               " (address in use or invalid?)"));
  }
  if (bound_port != nullptr) *bound_port = port;
  return server;
}

}  // namespace duet::rpc
