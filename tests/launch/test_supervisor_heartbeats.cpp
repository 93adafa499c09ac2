// `moe launch` and the heartbeats it hears (docs/design.md, invariants 3-5; the real program with 2 ranks, as
// in test_supervisor.cpp): forged, malformed and oversized heartbeats sent to its address are ignored and
// counted while the run ends equal to the uninterrupted reference run, and a launch whose steps end before a
// heartbeat in phase "step" still writes events.log. Part of the test_supervisor program.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "supervisor_harness.h"
#include "supervisor_recovery.h"

namespace {
using namespace moe::test_support;
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

// ---- 7. Forged, malformed and oversized heartbeats -------------------------------------------------------

// mpirun's environment variable `name` (the test runs as the same user, so it may read it): the
// heartbeat address and the job's secret, which lets the test send a well-signed heartbeat from a rank
// that does not exist. mpirun is the child of `moe launch` whose command line starts with "mpirun".
std::string mpirun_env(pid_t launch_pid, const std::string& name) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string stat = read_text_if_any(entry.path() / "stat");
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(stat.substr(paren + 2));
    char state = 0;
    long ppid = 0;
    if (!(rest >> state >> ppid) || ppid != long(launch_pid)) continue;
    const std::string env = read_text_if_any(entry.path() / "environ");
    std::istringstream in(env);
    for (std::string var; std::getline(in, var, '\0');)
      if (var.rfind(name + "=", 0) == 0) return var.substr(name.size() + 1);
  }
  return "";
}

TEST(Supervisor, ForgedMalformedAndOversizedHeartbeatsAreIgnoredAndCounted) {
  reference();
  TempDir dir("heartbeats");
  const fs::path run = dir.path() / "run";
  const int sock = ::socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(sock, 0);
  bool sent = false, sent_bad_rank = false;
  std::string listen, source;
  // Heartbeats every 5 ms instead of 200 (no effect on the training): the supervisor only writes
  // events.log once it hears a heartbeat in phase "step" (see the next test), and the 12 steps here
  // take about 30 ms in all.
  const LaunchResult r =
      run_launch(dir.path(), run, launch_args(run, {"fault.heartbeat_interval_s=0.005"}), [&](const LaunchResult& now) {
        if (sent) return;
        // The address: from events.log's start event; events.log is only written once the supervisor hears
        // a training heartbeat, which in this short run may come late, so mpirun's environment (the same
        // address, handed to the ranks) serves too, whichever comes first.
        for (const json& e : now.events)
          if (e.value("event", "") == "start" && e.contains("listen"))
            listen = e["listen"].get<std::string>(), source = "events.log";
        if (listen.empty()) {
          listen = mpirun_env(now.pid, "MOE_HEARTBEAT_ADDR");
          source = "mpirun's environment";
        }
        if (listen.empty()) return;
        const size_t colon = listen.rfind(':');
        sockaddr_in to{};
        to.sin_family = AF_INET;
        to.sin_port = htons(uint16_t(std::atoi(listen.c_str() + colon + 1)));
        if (colon == std::string::npos || ::inet_pton(AF_INET, listen.substr(0, colon).c_str(), &to.sin_addr) != 1) {
          listen.clear();
          return;
        }
        auto send = [&](const std::string& datagram) {
          ::sendto(sock, datagram.data(), datagram.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
        };
        std::mt19937_64 rng(std::random_device{}());
        char secret[33];
        std::snprintf(secret, sizeof secret, "%016llx%016llx", static_cast<unsigned long long>(rng()),
                      static_cast<unsigned long long>(rng()));
        const std::string pid = std::to_string(::getpid());
        // A heartbeat in the right format with a made-up secret, for a real rank.
        send(std::string("MOEHB1 ") + secret + " 0 1 " + pid + " 3 step forger");
        // Garbage bytes.
        std::string garbage(64, '\0');
        for (char& c : garbage) c = char(rng());
        garbage[0] = '\x01';
        send(garbage);
        // A 4 KB datagram (the format is right but it is far past 512 bytes).
        send(std::string("MOEHB1 ") + secret + " 0 0 " + pid + " 3 step " + std::string(4096, 'h'));
        // A bad rank: negative (malformed whatever the secret) ...
        send(std::string("MOEHB1 ") + secret + " 0 -1 " + pid + " 3 step forger");
        // ... and out of range, signed with the job's real secret.
        const std::string real = mpirun_env(now.pid, "MOE_HEARTBEAT_SECRET");
        if (!real.empty()) {
          send("MOEHB1 " + real + " 0 7 " + pid + " 3 step forger");
          sent_bad_rank = true;
        }
        sent = true;
      });
  ::close(sock);
  ASSERT_TRUE(sent) << "found no heartbeat address while the launch ran\n" << describe(r);
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(events_named(r, "restart").empty()) << "forged heartbeats caused a restart\n" << describe(r);
  std::map<std::string, int64_t> logged, totals;
  for (const json& e : events_named(r, "ignored_heartbeat")) ++logged[e.value("reason", "")];
  for (const json& e : events_named(r, "ignored_heartbeats_total"))
    totals[e.value("reason", "")] += e.value("count", int64_t(0));
  std::cout << "[ figures ] heartbeats sent to " << listen << " (from " << source << "): ignored_heartbeat events";
  for (const auto& [k, v] : logged) std::cout << " '" << k << "' x" << v;
  std::cout << "; totals";
  for (const auto& [k, v] : totals) std::cout << " '" << k << "' " << v;
  std::cout << "\n";
  EXPECT_EQ(logged["wrong secret"], 1) << describe(r);
  EXPECT_EQ(logged["malformed"], 2) << describe(r);
  EXPECT_EQ(logged["oversized"], 1) << describe(r);
  EXPECT_EQ(totals["wrong secret"], 1) << describe(r);
  EXPECT_EQ(totals["malformed"], 2) << describe(r);
  EXPECT_EQ(totals["oversized"], 1) << describe(r);
  if (sent_bad_rank) {
    EXPECT_EQ(logged["rank out of range"], 1) << describe(r);
    EXPECT_EQ(totals["rank out of range"], 1) << describe(r);
  }
  // The oversized datagram is logged as larger than a heartbeat may be (the supervisor reads at most 2 KB
  // of a datagram, so a 4 KB one shows as 2048 bytes).
  for (const json& e : events_named(r, "ignored_heartbeat")) {
    if (e.value("reason", "") == "oversized") {
      EXPECT_GT(e.value("bytes", int64_t(0)), 512) << e.dump();
    }
  }
  expect_same_as_reference(run);
  EXPECT_TRUE(r.left_behind.empty());
}

// events.log of a launch that ran: written whether or not the supervisor heard a heartbeat in phase
// "step" (with heartbeats every 2.5 s, this 12-step run is over before the second one).
TEST(Supervisor, SuccessfulLaunchWritesEventsLogWithoutATrainingHeartbeat) {
  TempDir dir("events");
  const fs::path run = dir.path() / "run";
  const LaunchResult r =
      run_launch(dir.path(), run, launch_args(run, {"fault.heartbeat_interval_s=2.5", "fault.heartbeat_timeout_s=20"}));
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(fs::exists(run / "metrics.jsonl"));
  EXPECT_TRUE(fs::exists(run / "events.log")) << "a launch that trained to the end left no events.log\n" << describe(r);
  EXPECT_EQ(events_named(r, "start").size(), 1u) << describe(r);
  EXPECT_EQ(last_event(r), "finished") << describe(r);
  EXPECT_TRUE(r.left_behind.empty());
}

}  // namespace
