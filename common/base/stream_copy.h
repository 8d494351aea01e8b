// StreamingCopy: memcpy for data that the writer will not read again and the reader will not
// read soon (KV blocks copied into a peer's pool). Large copies use non-temporal stores, which
// skip the read-for-ownership of each destination line and keep the copy out of the caches;
// the stores are fenced before it returns, so a flag written afterwards is seen after them.
//
//   StreamingCopy(peer_base + remote_offset, local_base + local_offset, length);
#pragma once

#include <cstddef>

namespace duet {

void StreamingCopy(void* dst, const void* src, size_t n);

}  // namespace duet
