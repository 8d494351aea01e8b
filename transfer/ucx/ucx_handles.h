// RAII owners for UCX C handles and the one checking macro for UCX calls (records the call site).
//
//   ucp_config_t* raw;
//   DUET_UCX_RETURN_IF_ERROR(ucp_config_read(nullptr, nullptr, &raw));
//   ucx::ConfigPtr config(raw);
#pragma once

#include <ucp/api/ucp.h>

#include <memory>

#include "absl/status/status.h"

namespace duet::transfer::ucx {

// "ucp_ep_create(...) failed at file.cc:42: Destination is unreachable (UCS -6)".
absl::Status UcxError(ucs_status_t status, const char* call, const char* file, int line);

#define DUET_UCX_RETURN_IF_ERROR(call)                                                     \
  do {                                                                                     \
    const ucs_status_t duet_ucs_status_ = (call);                                          \
    if (duet_ucs_status_ != UCS_OK) {                                                      \
      return ::duet::transfer::ucx::UcxError(duet_ucs_status_, #call, __FILE__, __LINE__); \
    }                                                                                      \
  } while (false)

struct ConfigDeleter {
  void operator()(ucp_config_t* c) const noexcept { ucp_config_release(c); }
};
using ConfigPtr = std::unique_ptr<ucp_config_t, ConfigDeleter>;

struct ContextDeleter {
  void operator()(ucp_context* c) const noexcept { ucp_cleanup(c); }
};
using ContextPtr = std::unique_ptr<ucp_context, ContextDeleter>;

struct WorkerDeleter {
  void operator()(ucp_worker* w) const noexcept { ucp_worker_destroy(w); }
};
using WorkerPtr = std::unique_ptr<ucp_worker, WorkerDeleter>;

struct RkeyDeleter {
  void operator()(ucp_rkey* k) const noexcept { ucp_rkey_destroy(k); }
};
using RkeyPtr = std::unique_ptr<ucp_rkey, RkeyDeleter>;

struct MemDeleter {
  ucp_context_h context = nullptr;
  void operator()(ucp_mem* m) const noexcept { ucp_mem_unmap(context, m); }
};
using MemPtr = std::unique_ptr<ucp_mem, MemDeleter>;

// Closes an endpoint, progressing its worker (so: only on the worker's thread) for at most
// ~2 s; `force` when the peer is gone (outstanding requests complete with UCS_ERR_CANCELED).
struct EpDeleter {
  ucp_worker_h worker = nullptr;
  bool force = false;
  void operator()(ucp_ep* ep) const noexcept;
};
using EpPtr = std::unique_ptr<ucp_ep, EpDeleter>;

}  // namespace duet::transfer::ucx
