// EtcdFixture: a gtest fixture that starts a real etcd (EtcdProcess) on loopback for each test
// and connects an EtcdClient to it; skips when the etcd binary is absent, and prints etcd's log
// tail when a test failed. A subclass that sets etcd_tls_ before EtcdFixture::SetUp gets etcd on
// https with --client-cert-auth, and the client presents those files too.
//
//   class MyEtcdTest : public EtcdFixture {};
//   TEST_F(MyEtcdTest, Puts) { ASSERT_TRUE(client().Put("k", "v").ok()); etcd_->Kill(); ... }
#pragma once

#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd_client.h"
#include "gtest/gtest.h"
#include "tests/integration/etcd_process.h"

namespace duet::testing {

class EtcdFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string binary = EtcdProcess::FindBinary();
    if (binary.empty()) GTEST_SKIP() << EtcdProcess::kMissing;
    absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd =
        EtcdProcess::Start(binary, absl::Seconds(20), etcd_tls_);
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    absl::StatusOr<etcd::EtcdClient> client = etcd::EtcdClient::Create(
        {.endpoints = {etcd_->client_url()}, .call_deadline = absl::Seconds(2), .tls = etcd_tls_});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }
  void TearDown() override {
    if (HasFailure() && etcd_ != nullptr) std::cerr << "etcd's log:\n" << etcd_->LogTail();
  }

  etcd::EtcdClient& client() { return *client_; }

  std::optional<tls::TlsFiles> etcd_tls_;  // set before SetUp: etcd on https
  std::unique_ptr<EtcdProcess> etcd_;
  std::optional<etcd::EtcdClient> client_;
};

}  // namespace duet::testing
