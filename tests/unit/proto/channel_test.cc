#include "proto/channel.h"

#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace duet::rpc {
namespace {

std::string HostName() {
  char name[256] = {0};
  return gethostname(name, sizeof(name) - 1) == 0 && name[0] != 0 ? std::string(name)
                                                                   : "127.0.0.1";
}

TEST(AdvertisedAddressTest, KeepsAConcreteHostAndTakesTheBoundPort) {
  EXPECT_EQ(AdvertisedAddress("127.0.0.1:0", 4321), "127.0.0.1:4321");
  EXPECT_EQ(AdvertisedAddress("10.0.0.21:7100", 7100), "10.0.0.21:7100");
  EXPECT_EQ(AdvertisedAddress("node-3.example:0", 9), "node-3.example:9");
}

// A node listening on every interface must not tell a remote coordinator "127.0.0.1".
TEST(AdvertisedAddressTest, AWildcardHostBecomesThisMachinesName) {
  for (const char* listen : {"0.0.0.0:7200", "[::]:7200", ":7200"}) {
    EXPECT_EQ(AdvertisedAddress(listen, 7200), HostName() + ":7200") << listen;
  }
}

}  // namespace
}  // namespace duet::rpc
