// The benchmark client for duet's Generation gRPC service (coordinator of `duet serve
// --loopback`, or `duet serve --colocated`). One blocking stream per Send; thread-safe.
//
//   std::unique_ptr<Client> c = MakeGrpcClient("127.0.0.1:7000");
//   DUET_RETURN_IF_ERROR(c->WaitReady(absl::Seconds(30)));
#pragma once

#include <memory>
#include <string>

#include "bench/serve_bench/client.h"

namespace duet::bench {

std::unique_ptr<Client> MakeGrpcClient(const std::string& address);

}  // namespace duet::bench
