// The hosts of `moe launch --hostfile` (launch/supervise/hosts.h): which are this machine, and where the heartbeat
// listener binds (fault.listen): loopback for this machine alone, refused (naming the key) with a remote host, an
// address given kept, a host that does not resolve named with its hostfile. The cluster tests (tests/cluster/) bind it
// on a real route between simulated hosts.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/host.h"
#include "launch/supervise/hosts.h"

namespace moe {
namespace {

// 192.0.2.0/24 is TEST-NET-1 (RFC 5737): never an address of this machine, and an address literal needs no DNS.
constexpr const char* kRemote = "192.0.2.1";

std::string bad_input_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.message();
    return e.message();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(Hosts, ThisMachineIsLocal) {
  EXPECT_TRUE(host_is_local("localhost"));
  EXPECT_TRUE(host_is_local(host_name()));
  EXPECT_TRUE(host_is_local("127.0.0.1"));
  EXPECT_TRUE(host_is_local("127.0.0.5"));
  EXPECT_FALSE(host_is_local(kRemote));
}

TEST(Hosts, LoopbackWithoutRemoteHosts) {
  EXPECT_EQ(choose_listen_address("auto", {}, ""), "127.0.0.1");
  EXPECT_EQ(choose_listen_address("auto", {"localhost", host_name()}, "h.txt"), "127.0.0.1");
  EXPECT_EQ(choose_listen_address("127.0.0.1", {"localhost"}, "h.txt"), "127.0.0.1");
}

TEST(Hosts, LoopbackWithARemoteHostIsRefusedNamingTheKey) {
  for (const char* loopback : {"127.0.0.1", "127.0.1.1"}) {
    const std::string message = bad_input_message([&] {
      choose_listen_address(loopback, {"localhost", kRemote}, "h.txt");
    });
    EXPECT_NE(message.find(std::string("fault.listen = \"") + loopback + "\""), std::string::npos) << message;
    EXPECT_NE(message.find(kRemote), std::string::npos) << message;
    EXPECT_NE(message.find("h.txt"), std::string::npos) << message;
  }
}

TEST(Hosts, AnAddressGivenIsKept) { EXPECT_EQ(choose_listen_address("10.1.2.3", {kRemote}, "h.txt"), "10.1.2.3"); }

TEST(Hosts, AHostThatDoesNotResolveIsNamedWithItsHostfile) {
  const std::string message =
      bad_input_message([] { choose_listen_address("auto", {"no-such-host.invalid"}, "hosts.txt"); });
  EXPECT_NE(message.find("--hostfile hosts.txt"), std::string::npos) << message;
  EXPECT_NE(message.find("no-such-host.invalid"), std::string::npos) << message;
  EXPECT_NE(message.find("does not resolve"), std::string::npos) << message;
}

}  // namespace
}  // namespace moe
