// The job's hosts and its spares (launch/supervise/host_pool.h) and probing hosts (launch/supervise/host_probe.h):
// which hosts --np fills and which are spares; a lost host's place taken by the first spare with enough slots, at its
// position and slot count; lost spares dropped; no spare named. Probes through a stand-in remote shell: a healthy host,
// a program missing, a full disk, a shell that fails (as ssh to a host cut off) and one that never answers (bounded
// time), hosts that do not reach each other (fault.probe_peers); mpirun's remote shell found as OpenMPI finds it.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <string>
#include <vector>

#include "launch/supervise/host_pool.h"
#include "launch/supervise/host_probe.h"

namespace moe {
namespace {

std::vector<std::string> names(const std::vector<HostSlots>& hosts) {
  std::vector<std::string> out;
  for (const HostSlots& h : hosts) out.push_back(h.name + ":" + std::to_string(h.slots));
  return out;
}

TEST(HostPool, NpFillsTheFirstHostsSlotBySlotTheRestAreSpares) {
  const std::vector<HostSlots> hosts = {{"a", 2}, {"b", 2}, {"c", 2}, {"d", 4}};
  HostPool pool = split_hosts(hosts, 4);
  EXPECT_EQ(names(pool.active), (std::vector<std::string>{"a:2", "b:2"}));
  EXPECT_EQ(names(pool.spares), (std::vector<std::string>{"c:2", "d:4"}));
  pool = split_hosts(hosts, 3);  // b is partly filled: it runs ranks, it is no spare
  EXPECT_EQ(names(pool.active), (std::vector<std::string>{"a:2", "b:2"}));
  pool = split_hosts(hosts, 20);  // more ranks than slots: every host runs ranks
  EXPECT_EQ(pool.active.size(), 4u);
  EXPECT_TRUE(pool.spares.empty());
}

TEST(HostPool, ALostHostsPlaceGoesToTheFirstSpareWithEnoughSlots) {
  HostPool pool = split_hosts({{"a", 2}, {"b", 2}, {"c", 1}, {"d", 3}, {"e", 2}}, 4);
  std::vector<std::string> unreplaced;
  const auto done = replace_lost_hosts(&pool, {{"a", "cut off"}}, &unreplaced);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].host, "a");
  EXPECT_EQ(done[0].by, "d");  // c has too few slots
  EXPECT_EQ(done[0].slots, 2);
  // d takes a's position and a's slot count: the ranks land where they were.
  EXPECT_EQ(names(pool.active), (std::vector<std::string>{"d:2", "b:2"}));
  EXPECT_EQ(names(pool.spares), (std::vector<std::string>{"c:1", "e:2"}));
  EXPECT_TRUE(unreplaced.empty());
}

TEST(HostPool, LostSparesAreDroppedAndAHostWithoutASpareIsNamed) {
  HostPool pool = split_hosts({{"a", 2}, {"b", 2}, {"c", 2}}, 4);
  std::vector<std::string> unreplaced;
  const auto done = replace_lost_hosts(&pool, {{"b", "frozen"}, {"c", "cut off"}}, &unreplaced);
  EXPECT_TRUE(done.empty());
  EXPECT_EQ(unreplaced, (std::vector<std::string>{"b"}));
  EXPECT_EQ(names(pool.active), (std::vector<std::string>{"a:2", "b:2"}));
  EXPECT_TRUE(pool.spares.empty());
}

// 192.0.2.0/24 (TEST-NET-1) is never this machine: its probe goes through the remote shell.
constexpr const char* kRemote = "192.0.2.7";

// A remote shell that runs the command here: `sh -c 'exec sh -c "$2"' agent HOST COMMAND`.
ProbeSpec spec_with(std::vector<std::string> agent) {
  ProbeSpec spec;
  spec.agent = std::move(agent);
  spec.program = "/bin/sh";
  spec.disk = "/tmp/moe-no-such-dir/below";  // the nearest existing parent counts
  spec.min_free_bytes = 1;
  spec.timeout_s = 5;
  return spec;
}
const std::vector<std::string> kHere = {"sh", "-c", "exec sh -c \"$2\"", "agent"};

TEST(HostProbe, AHealthyHostPasses) {
  const auto probes = probe_hosts({kRemote, "localhost"}, spec_with(kHere));
  ASSERT_EQ(probes.size(), 2u);
  for (const HostProbe& p : probes) EXPECT_TRUE(p.ok) << p.host << ": " << p.reason;
}

TEST(HostProbe, HostsThatDoNotReachEachOtherAreNamedUnlessPeersAreOff) {
  // This machine cannot reach TEST-NET-1 (no answer, or no route): its probe names it; the stand-in remote host
  // reaches this machine (a refusal on port 22 is an answer).
  ProbeSpec spec = spec_with(kHere);
  spec.timeout_s = 3;
  auto probes = probe_hosts({kRemote, "localhost"}, spec);
  EXPECT_TRUE(probes[1].ok) << probes[1].reason;
  EXPECT_EQ(probes[1].unreachable_peers, (std::vector<std::string>{kRemote})) << probes[1].peer_errors;
  spec.check_peers = false;
  probes = probe_hosts({kRemote, "localhost"}, spec);
  EXPECT_TRUE(probes[1].unreachable_peers.empty());
}

TEST(HostProbe, AMissingProgramAndAFullDiskAreNamed) {
  ProbeSpec spec = spec_with(kHere);
  spec.program = "/tmp/moe-no-such-program";
  auto probes = probe_hosts({kRemote}, spec);
  EXPECT_FALSE(probes[0].ok);
  EXPECT_NE(probes[0].reason.find("the program /tmp/moe-no-such-program is missing"), std::string::npos)
      << probes[0].reason;
  spec = spec_with(kHere);
  spec.min_free_bytes = int64_t(1) << 62;
  probes = probe_hosts({kRemote}, spec);
  EXPECT_FALSE(probes[0].ok);
  EXPECT_NE(probes[0].reason.find("MiB free on /tmp"), std::string::npos) << probes[0].reason;
}

TEST(HostProbe, AShellThatFailsIsNamedWithItsMessage) {
  const auto probes = probe_hosts(
      {kRemote},
      spec_with({"sh", "-c", "echo \"ssh: connect to host $1 port 22: No route to host\" >&2; exit 255", "agent"}));
  EXPECT_FALSE(probes[0].ok);
  EXPECT_NE(probes[0].reason.find("exit code 255"), std::string::npos) << probes[0].reason;
  EXPECT_NE(probes[0].reason.find("No route to host"), std::string::npos) << probes[0].reason;
}

TEST(HostProbe, AHostThatNeverAnswersFailsWithinTheTimeout) {
  ProbeSpec spec = spec_with({"sh", "-c", "sleep 60", "agent"});
  spec.timeout_s = 0.5;
  const auto started = std::chrono::steady_clock::now();
  const auto probes = probe_hosts({kRemote, "localhost"}, spec);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_LT(waited, 30);  // bounded: not the 60 s the shell would take
  EXPECT_FALSE(probes[0].ok);
  EXPECT_NE(probes[0].reason.find("no answer within"), std::string::npos) << probes[0].reason;
  EXPECT_TRUE(probes[1].ok) << probes[1].reason;  // this machine is probed without the remote shell
}

// The daemon check: a stand-in mpirun that fails for one host (its --host HOST:1 is $2) and starts `true` for the
// others; only the hosts that passed the probe are checked.
TEST(HostProbe, AHostWhereMpirunCannotStartItsDaemonIsNamedWithMpirunsMessage) {
  ProbeSpec spec = spec_with(kHere);
  spec.check_peers = false;
  spec.daemon_check = {"sh", "-c",
                       "case $2 in localhost:1) echo 'ORTE was unable to reliably start one or more daemons.' >&2; "
                       "exit 213;; esac; shift 4; exec \"$@\"",
                       "mpirun"};
  auto probes = probe_hosts({kRemote, "localhost"}, spec);
  EXPECT_TRUE(probes[0].ok) << probes[0].reason;
  EXPECT_FALSE(probes[1].ok);
  EXPECT_NE(probes[1].reason.find("mpirun cannot start its daemon or a process there (exit code 213: ORTE was "
                                  "unable to reliably start one or more daemons.)"),
            std::string::npos)
      << probes[1].reason;
  spec.program = "/tmp/moe-no-such-program";  // the probe fails first: no daemon check, the probe's reason
  probes = probe_hosts({"localhost"}, spec);
  EXPECT_NE(probes[0].reason.find("is missing"), std::string::npos) << probes[0].reason;
}

TEST(HostProbe, ADaemonCheckThatNeverEndsFailsWithinTheTimeout) {
  ProbeSpec spec = spec_with(kHere);
  spec.check_peers = false;
  spec.timeout_s = 0.5;
  spec.daemon_check = {"sh", "-c", "sleep 60", "mpirun"};
  const auto started = std::chrono::steady_clock::now();
  const auto probes = probe_hosts({kRemote}, spec);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), 30);
  EXPECT_FALSE(probes[0].ok);
  EXPECT_NE(probes[0].reason.find("mpirun could not start a process there within 1 s"), std::string::npos)
      << probes[0].reason;
}

TEST(HostProbe, TheRemoteShellIsMpirunsAgent) {
  ::unsetenv("OMPI_MCA_plm_rsh_agent");
  EXPECT_EQ(rsh_agent_command({}, 7),
            (std::vector<std::string>{"ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=7"}));
  ::setenv("OMPI_MCA_plm_rsh_agent", "/opt/agent.sh -q : rsh", 1);
  EXPECT_EQ(rsh_agent_command({}, 7), (std::vector<std::string>{"/opt/agent.sh", "-q"}));
  EXPECT_EQ(rsh_agent_command({"--mca", "plm_rsh_agent", "rsh"}, 7), (std::vector<std::string>{"rsh"}));
  ::unsetenv("OMPI_MCA_plm_rsh_agent");
}

}  // namespace
}  // namespace moe
