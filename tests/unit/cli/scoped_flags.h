// ScopedFlags: sets Abseil flags for a test's scope, then puts back what they held.
//
//   ScopedFlags flags({{"tls_ca_file", "/tmp/ca.pem"}, {"port", "0"}});
//   ... read the flags ...
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/flags/reflection.h"
#include "gtest/gtest.h"

namespace duet::cli {

using FlagValues = std::vector<std::pair<std::string, std::string>>;  // Abseil name, value

class ScopedFlags {
 public:
  explicit ScopedFlags(const FlagValues& values) {
    for (const auto& [name, value] : values) {
      absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
      EXPECT_NE(f, nullptr) << name;
      if (f == nullptr) continue;
      saved_.emplace_back(f, f->CurrentValue());
      std::string error;
      EXPECT_TRUE(f->ParseFrom(value, &error)) << name << ": " << error;
    }
  }
  ~ScopedFlags() {
    std::string error;
    for (auto& [flag, value] : saved_) flag->ParseFrom(value, &error);
  }
  ScopedFlags(const ScopedFlags&) = delete;
  ScopedFlags& operator=(const ScopedFlags&) = delete;

 private:
  std::vector<std::pair<absl::CommandLineFlag*, std::string>> saved_;
};

}  // namespace duet::cli
