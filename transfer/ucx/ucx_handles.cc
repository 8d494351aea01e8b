#include "transfer/ucx/ucx_handles.h"

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/logging.h"

namespace duet::transfer::ucx {

absl::Status UcxError(ucs_status_t status, const char* call, const char* file, int line) {
  std::string msg =
      absl::StrCat(call, " failed at ", file, ":", line, ": ", ucs_status_string(status), " (UCS ",
                   static_cast<int>(status), ")");
  switch (status) {
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
      return absl::UnavailableError(msg);
    case UCS_ERR_CANCELED:
      return absl::CancelledError(msg);
    case UCS_ERR_TIMED_OUT:
      return absl::DeadlineExceededError(msg);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
      return absl::ResourceExhaustedError(msg);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_UNSUPPORTED:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

void EpDeleter::operator()(ucp_ep* ep) const noexcept {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &param);
  if (req == nullptr || UCS_PTR_IS_ERR(req)) return;
  const absl::Time deadline = DeadlineIn(absl::Seconds(2));
  while (ucp_request_check_status(req) == UCS_INPROGRESS) {
    ucp_worker_progress(worker);
    if (absl::Now() > deadline) {
      DUET_LOG(WARNING) << "ucx: endpoint close did not finish within 2 s; abandoning it";
      break;
    }
  }
  ucp_request_free(req);
}

}  // namespace duet::transfer::ucx
