// The address gloo binds across nodes: the local one the kernel routes from towards the master. Beyond this
// machine it is checked where it matters, between two network namespaces (tests/launch/multi_host_test.cpp).
#include <gtest/gtest.h>

#include "tandem/comm/local_address.h"

namespace tandem::comm {
namespace {

TEST(LocalAddress, TowardsLoopbackIsLoopback) {
  EXPECT_EQ(local_address_toward("127.0.0.1"), "127.0.0.1");
  // Every 127/8 address is reached from lo's own address.
  EXPECT_EQ(local_address_toward("127.0.0.2"), "127.0.0.1");
}

}  // namespace
}  // namespace tandem::comm
