#include "cli/node_flags.h"

#include <algorithm>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

ABSL_DECLARE_FLAG(std::string, model);            // generate_command.cc
ABSL_DECLARE_FLAG(std::string, device);           // generate_command.cc
ABSL_DECLARE_FLAG(int, threads);                  // generate_command.cc
ABSL_DECLARE_FLAG(std::string, cpu_gemm);         // generate_command.cc
ABSL_DECLARE_FLAG(std::string, cpu_isa);          // generate_command.cc
ABSL_DECLARE_FLAG(std::string, weights_dtype);    // generate_command.cc
ABSL_DECLARE_FLAG(int, block_size);               // generate_command.cc
ABSL_DECLARE_FLAG(std::string, kv_dtype);         // generate_command.cc
ABSL_DECLARE_FLAG(std::string, listen);           // node_commands.cc, as are the rest
ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_DECLARE_FLAG(std::string, node_id);
ABSL_DECLARE_FLAG(std::string, transport);
ABSL_DECLARE_FLAG(std::string, ucx_tls);
ABSL_DECLARE_FLAG(std::string, ucx_net_devices);
ABSL_DECLARE_FLAG(std::string, transfer_write_mode);
ABSL_DECLARE_FLAG(int64_t, transfer_chunk_kib);
ABSL_DECLARE_FLAG(int64_t, transfer_am_chunk_kib);
ABSL_DECLARE_FLAG(absl::Duration, transfer_keepalive);
ABSL_DECLARE_FLAG(int64_t, kv_cache_bytes);
ABSL_DECLARE_FLAG(bool, enable_prefix_caching);
ABSL_DECLARE_FLAG(std::string, kv_staging);
ABSL_DECLARE_FLAG(int, metrics_port);
ABSL_DECLARE_FLAG(std::string, metrics_host);
ABSL_DECLARE_FLAG(int, http_port);
ABSL_DECLARE_FLAG(std::string, http_host);
ABSL_DECLARE_FLAG(std::string, served_model_name);
ABSL_DECLARE_FLAG(std::string, api_key);
ABSL_DECLARE_FLAG(int64_t, max_body_bytes);
ABSL_DECLARE_FLAG(int, max_concurrent_streams);

// The HTTP front's connection limits (http/http_server.h), beside the generation limit above.
ABSL_FLAG(int, http_max_connections, duet::http::HttpFrontOptions{}.max_connections,
          "coordinator/serve --colocated: open HTTP connections, idle or not; more get 503 "
          "(mind the process's file-descriptor limit)");
ABSL_FLAG(double, http_header_timeout_s,
          absl::ToDoubleSeconds(duet::http::HttpFrontOptions{}.header_timeout),
          "coordinator/serve --colocated: seconds a client has to send a request's header; then "
          "408 and close");
ABSL_FLAG(double, http_body_timeout_s,
          absl::ToDoubleSeconds(duet::http::HttpFrontOptions{}.body_timeout),
          "coordinator/serve --colocated: seconds after the header to send the body; then 408");
ABSL_FLAG(double, http_idle_timeout_s,
          absl::ToDoubleSeconds(duet::http::HttpFrontOptions{}.idle_timeout),
          "coordinator/serve --colocated: seconds a kept-alive HTTP connection may idle between "
          "requests");
ABSL_FLAG(double, http_write_timeout_s,
          absl::ToDoubleSeconds(duet::http::HttpFrontOptions{}.write_timeout),
          "coordinator/serve --colocated: seconds a response may wait for a client that reads "
          "none of it (a full send buffer); then the connection is closed and its request "
          "cancelled, as for a disconnect. Must be positive");

namespace duet::cli {
namespace {
// KiB from a flag in bytes; out-of-range values become 0 or UINT64_MAX, which the transport
// refuses by name.
uint64_t KibToBytes(int64_t kib) {
  if (kib <= 0) return 0;
  if (kib > (INT64_MAX >> 10)) return UINT64_MAX;
  return static_cast<uint64_t>(kib) << 10;
}
}  // namespace

cluster::NodeRuntimeOptions NodeRuntimeOptionsFromFlags(const std::string& kind) {
  cluster::NodeRuntimeOptions o;
  const std::string id = absl::GetFlag(FLAGS_node_id);
  o.node_id = id.empty() ? kind + "-0" : id;
  o.listen_address = absl::GetFlag(FLAGS_listen);
  o.coordinator_address = absl::GetFlag(FLAGS_coordinator);
  o.model_dir = absl::GetFlag(FLAGS_model);
  o.device = absl::GetFlag(FLAGS_device);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.cpu_gemm = absl::GetFlag(FLAGS_cpu_gemm);
  o.cpu_isa = absl::GetFlag(FLAGS_cpu_isa);
  o.weights_dtype = absl::GetFlag(FLAGS_weights_dtype);
  o.block_size = absl::GetFlag(FLAGS_block_size);
  o.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  o.kv_dtype = absl::GetFlag(FLAGS_kv_dtype);
  o.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  return o;
}

cluster::NodeTransferOptions NodeTransferOptionsFromFlags() {
  return {.transport = absl::GetFlag(FLAGS_transport),
          .ucx_net_devices = absl::GetFlag(FLAGS_ucx_net_devices),
          .ucx_tls = absl::GetFlag(FLAGS_ucx_tls),
          .write_mode = absl::GetFlag(FLAGS_transfer_write_mode),
          .chunk_bytes = KibToBytes(absl::GetFlag(FLAGS_transfer_chunk_kib)),
          .am_chunk_bytes = KibToBytes(absl::GetFlag(FLAGS_transfer_am_chunk_kib)),
          .keepalive = absl::GetFlag(FLAGS_transfer_keepalive),
          .kv_staging = absl::GetFlag(FLAGS_kv_staging)};
}

std::vector<std::string> NodeFlagsForChild() {
  return {"--model=" + absl::GetFlag(FLAGS_model),
          "--device=" + absl::GetFlag(FLAGS_device),
          absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads)),
          "--cpu_gemm=" + absl::GetFlag(FLAGS_cpu_gemm),
          "--cpu_isa=" + absl::GetFlag(FLAGS_cpu_isa),
          "--weights_dtype=" + absl::GetFlag(FLAGS_weights_dtype),
          absl::StrCat("--block_size=", absl::GetFlag(FLAGS_block_size)),
          absl::StrCat("--kv_cache_bytes=", absl::GetFlag(FLAGS_kv_cache_bytes)),
          "--kv_dtype=" + absl::GetFlag(FLAGS_kv_dtype),
          absl::StrCat("--enable_prefix_caching=", absl::GetFlag(FLAGS_enable_prefix_caching)),
          "--metrics_host=" + absl::GetFlag(FLAGS_metrics_host),
          "--transport=" + absl::GetFlag(FLAGS_transport),
          "--ucx_net_devices=" + absl::GetFlag(FLAGS_ucx_net_devices),
          "--ucx_tls=" + absl::GetFlag(FLAGS_ucx_tls),
          "--transfer_write_mode=" + absl::GetFlag(FLAGS_transfer_write_mode),
          absl::StrCat("--transfer_chunk_kib=", absl::GetFlag(FLAGS_transfer_chunk_kib)),
          absl::StrCat("--transfer_am_chunk_kib=", absl::GetFlag(FLAGS_transfer_am_chunk_kib)),
          "--transfer_keepalive=" + absl::FormatDuration(absl::GetFlag(FLAGS_transfer_keepalive)),
          "--kv_staging=" + absl::GetFlag(FLAGS_kv_staging)};
}

std::optional<http::HttpFrontOptions> HttpFrontOptionsFromFlags() {
  if (absl::GetFlag(FLAGS_http_port) < 0) return std::nullopt;
  std::vector<std::string> names;
  for (absl::string_view n :
       absl::StrSplit(absl::GetFlag(FLAGS_served_model_name), ',', absl::SkipWhitespace())) {
    names.emplace_back(absl::StripAsciiWhitespace(n));
  }
  return http::HttpFrontOptions{
      .host = absl::GetFlag(FLAGS_http_host),
      .port = absl::GetFlag(FLAGS_http_port),
      .api_key = absl::GetFlag(FLAGS_api_key),
      .max_body_bytes =
          static_cast<size_t>(std::max<int64_t>(1, absl::GetFlag(FLAGS_max_body_bytes))),
      .max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams),
      .max_connections = std::max(1, absl::GetFlag(FLAGS_http_max_connections)),
      .header_timeout = absl::Seconds(absl::GetFlag(FLAGS_http_header_timeout_s)),
      .body_timeout = absl::Seconds(absl::GetFlag(FLAGS_http_body_timeout_s)),
      .idle_timeout = absl::Seconds(absl::GetFlag(FLAGS_http_idle_timeout_s)),
      .write_timeout = absl::Seconds(absl::GetFlag(FLAGS_http_write_timeout_s)),
      .served_model_names = names};
}

std::vector<std::string> HttpFrontFlagsForChild() {
  return {absl::StrCat("--http_max_connections=", absl::GetFlag(FLAGS_http_max_connections)),
          absl::StrCat("--http_header_timeout_s=", absl::GetFlag(FLAGS_http_header_timeout_s)),
          absl::StrCat("--http_body_timeout_s=", absl::GetFlag(FLAGS_http_body_timeout_s)),
          absl::StrCat("--http_idle_timeout_s=", absl::GetFlag(FLAGS_http_idle_timeout_s)),
          absl::StrCat("--http_write_timeout_s=", absl::GetFlag(FLAGS_http_write_timeout_s)),
          "--served_model_name=" + absl::GetFlag(FLAGS_served_model_name)};
}

}  // namespace duet::cli
