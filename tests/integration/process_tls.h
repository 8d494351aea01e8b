// ScopedProcessTls: this test process's gRPC channels (rpc::MakeChannel) use `identity` (mutual
// TLS) for the scope, plaintext again after it. Shared by the TLS integration tests.
//
//   ScopedProcessTls tls(identity);   // or std::nullopt: plaintext
#pragma once

#include <optional>
#include <utility>

#include "common/tls/tls_files.h"
#include "gtest/gtest.h"
#include "proto/channel.h"

namespace duet::testing {

class ScopedProcessTls {
 public:
  explicit ScopedProcessTls(std::optional<tls::TlsIdentity> identity) {
    EXPECT_TRUE(rpc::SetProcessTls(std::move(identity)).ok());
  }
  ~ScopedProcessTls() { EXPECT_TRUE(rpc::SetProcessTls(std::nullopt).ok()); }
  ScopedProcessTls(const ScopedProcessTls&) = delete;
  ScopedProcessTls& operator=(const ScopedProcessTls&) = delete;
};

}  // namespace duet::testing
