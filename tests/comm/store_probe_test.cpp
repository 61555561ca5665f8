// The probe that tells a c10d TCPStore from another service before c10d's client meets it (store_probe.h):
// every kind of TCPStore server this LibTorch runs answers it and keeps no key of it; a service that greets, at
// once or half a second late, is no store; a port that accepts and never answers is silent; a closed port is no
// connection.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "support/listening_sockets.h"
#include "support/processes.h"
#include "tandem/comm/store_probe.h"
#include "tandem/util/compat.h"

namespace tandem::comm {
namespace {

using namespace std::chrono_literals;
using Verdict = StoreProbe::Verdict;

constexpr auto kProbeTimeout = 5s;
const std::string kBanner = "SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n";

TEST(StoreProbe, EveryKindOfTcpStoreServerAnswersAndKeepsNoKeyOfIt) {
  for (const auto& [kind, options] : compat::tcp_store_server_kinds()) {
    auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
    server->set("job/key", {'1'});
    const int64_t keys = server->getNumKeys();
    const StoreProbe probe = probe_store("127.0.0.1", server->getPort(), kProbeTimeout);
    EXPECT_EQ(probe.verdict, Verdict::kStore) << kind << " server: " << probe.why;
    EXPECT_EQ(server->getNumKeys(), keys) << kind << " server";
    // The server serves c10d's own clients as before.
    c10d::TCPStoreOptions client_options;
    client_options.port = server->getPort();
    client_options.waitWorkers = false;
    client_options.timeout = kProbeTimeout;
    c10d::TCPStore client("127.0.0.1", client_options);
    EXPECT_EQ(client.get("job/key"), std::vector<uint8_t>{'1'}) << kind << " server";
  }
}

TEST(StoreProbe, AServiceThatGreetsAtOnceIsNoStore) {
  testing::GreetingPort ssh(kBanner);
  const StoreProbe probe = probe_store("127.0.0.1", ssh.port(), kProbeTimeout);
  EXPECT_EQ(probe.verdict, Verdict::kNotAStore) << probe.why;
  EXPECT_EQ(probe.why, "it answered as no c10d store does (\"SSH-2.0-OpenSSH_9.2p1 De...\"): another service listens "
                       "there");
}

// A greeting later than any window a client could wait for before it speaks: only an answer to a request tells.
TEST(StoreProbe, AServiceThatGreetsHalfASecondLateIsNoStore) {
  testing::GreetingPort ssh(kBanner, 500ms);
  const StoreProbe probe = probe_store("127.0.0.1", ssh.port(), kProbeTimeout);
  EXPECT_EQ(probe.verdict, Verdict::kNotAStore) << probe.why;
  EXPECT_NE(probe.why.find("(\"SSH-2.0-OpenSSH_9.2p1 De...\")"), std::string::npos) << probe.why;
}

TEST(StoreProbe, APortThatAcceptsAndNeverAnswersIsSilent) {
  testing::HeldPort silent;
  const StoreProbe probe = probe_store("127.0.0.1", silent.port(), 300ms);
  EXPECT_EQ(probe.verdict, Verdict::kSilent) << probe.why;
  EXPECT_EQ(probe.why, "it accepted the connection but did not answer within 0.3 s");
}

TEST(StoreProbe, APortWhereNothingListensIsNoConnection) {
  const StoreProbe probe = probe_store("127.0.0.1", testing::free_port(), kProbeTimeout);
  EXPECT_EQ(probe.verdict, Verdict::kNoConnection) << probe.why;
  EXPECT_EQ(probe.why, "Connection refused");
}

}  // namespace
}  // namespace tandem::comm
