// Hangs named by the flight recorder, end to end: the real `moe launch` runs mpirun with 2 ranks of a tiny MoE
// model at ep 2, and one rank is made to freeze at the entry of an all-to-all of the ep group, or to call a
// barrier where its peer calls the all-to-all (fault.inject freeze_alltoall, mismatch_alltoall). The watchdogs end
// the job; the supervisor's failure event in events.log (and its console) must name the collective from the
// ranks' last heartbeats: the rank that never entered it and the one waiting in it, or the mismatch. The
// restarted job then trains to the end (each fault fires once).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "supervisor_harness.h"
#include "supervisor_recovery.h"

namespace {

using namespace moe::test_support;

// The first failure event (a crash when the watchdogs ended the job, a hang when the supervisor found it first).
json first_failure(const LaunchResult& r) {
  for (const json& e : r.events)
    if (e.value("event", "") == "crash" || e.value("event", "") == "hang") return e;
  return {};
}

json ep_finding(const json& failure) {
  for (const json& f : failure.value("collectives", json::array()))
    if (f.value("group", "") == "ep") return f;
  return {};
}

LaunchResult launch_with(const TempDir& dir, const std::string& kind, int rank = 1, int np = 2) {
  const fs::path run = dir.path() / "run";
  return run_launch(dir.path(), run,
                    with_np(launch_args(run, {inject(kind, rank, 3), "parallel.ep=2", "fault.step_timeout_s=3",
                                              "fault.max_restarts=1"}),
                            np));
}

TEST(FlightHangs, RankFrozenAtAnAllToAllIsNamedAsNeverEnteringIt) {
  TempDir dir("flight-freeze");
  const LaunchResult r = launch_with(dir, "freeze_alltoall");
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  const json failure = first_failure(r);
  ASSERT_FALSE(failure.empty()) << describe(r);
  const json f = ep_finding(failure);
  ASSERT_FALSE(f.empty()) << "no finding for the ep group\n" << describe(r);
  EXPECT_FALSE(f.value("mismatch", true)) << describe(r);
  EXPECT_EQ(f["not_entered"], json({1})) << describe(r);
  EXPECT_EQ(f["waiting"], json({0})) << describe(r);
  EXPECT_EQ(f["group_index"], 0);
  const std::string op = f.value("op", "");
  EXPECT_TRUE(op == "alltoall" || op == "ialltoallv") << op;
  const std::string summary = f.value("summary", "");
  EXPECT_NE(summary.find("ep group 0, " + op + " #"), std::string::npos) << summary;
  EXPECT_NE(summary.find("rank 1 on host"), std::string::npos) << summary;
  EXPECT_NE(summary.find("never entered it; rank 0 waits in it since"), std::string::npos) << summary;
  EXPECT_NE(r.stderr_text.find(summary), std::string::npos) << "the console says it too\n" << describe(r);
  EXPECT_NE(r.stderr_text.find("freezes at the entry of its all-to-all"), std::string::npos) << describe(r);
  EXPECT_EQ(failure.value("suspects", json()), json({1})) << describe(r);
  EXPECT_NE(r.stderr_text.find("rank 1 in none of the collectives the others wait in"), std::string::npos);
  // The watchdog that ended rank 0 left its whole ring in the run directory, the all-to-all still in flight.
  const fs::path dump = r.run_dir / "flight" / "rank-00000.txt";
  ASSERT_TRUE(fs::exists(dump)) << describe(r);
  std::ifstream in(dump);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("ep #" + std::to_string(f.value("seq", 0)) + " " + op), std::string::npos) << text;
  EXPECT_NE(text.find("in flight"), std::string::npos) << text;
}

// 4 ranks, dp 2 x ep 2 (ep groups {0, 1} and {2, 3}): rank 3 frozen. Rank 2 waits for it in ep group 1; ranks 0
// and 1 wait for both in their gradients' reduction; rank 3 alone is in none of those collectives.
TEST(FlightHangs, FrozenRankOfTheSecondExpertGroupIsTheOneSuspect) {
  TempDir dir("flight-freeze4");
  const LaunchResult r = launch_with(dir, "freeze_alltoall", 3, 4);
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  const json failure = first_failure(r);
  ASSERT_FALSE(failure.empty()) << describe(r);
  const json f = ep_finding(failure);
  ASSERT_FALSE(f.empty()) << "no finding for the ep group\n" << describe(r);
  EXPECT_EQ(f["group_index"], 1) << describe(r);
  EXPECT_EQ(f["ranks"], json({2, 3})) << describe(r);
  EXPECT_EQ(f["not_entered"], json({3})) << describe(r);
  EXPECT_EQ(f["waiting"], json({2})) << describe(r);
  EXPECT_FALSE(f.value("mismatch", true)) << describe(r);
  EXPECT_EQ(failure.value("suspects", json()), json({3})) << describe(r);
  for (const json& g : failure["collectives"]) EXPECT_FALSE(g.value("mismatch", true)) << g.dump();
}

TEST(FlightHangs, RankCallingAnotherCollectiveIsNamedAsAMismatch) {
  TempDir dir("flight-mismatch");
  const LaunchResult r = launch_with(dir, "mismatch_alltoall");
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  const json failure = first_failure(r);
  ASSERT_FALSE(failure.empty()) << describe(r);
  const json f = ep_finding(failure);
  ASSERT_FALSE(f.empty()) << "no finding for the ep group\n" << describe(r);
  EXPECT_TRUE(f.value("mismatch", false)) << describe(r);
  ASSERT_EQ(f["ops"].size(), 2u) << describe(r);
  EXPECT_EQ(f["ops"][1]["op"], "barrier") << describe(r);
  EXPECT_NE(f["ops"][0]["op"], "barrier") << describe(r);
  EXPECT_EQ(f["ops"][0]["seq"], f["ops"][1]["seq"]) << "the same collective of the group\n" << describe(r);
  const std::string summary = f.value("summary", "");
  EXPECT_NE(summary.find("ep group 0: collective mismatch"), std::string::npos) << summary;
  EXPECT_NE(summary.find("rank 1 in barrier #"), std::string::npos) << summary;
  EXPECT_NE(r.stderr_text.find(summary), std::string::npos) << "the console says it too\n" << describe(r);
  EXPECT_EQ(failure.value("suspects", json()), json::array()) << "both ranks wait, in different collectives";
}

}  // namespace
