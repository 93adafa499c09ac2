// The flight recorder (parallel/flight_recorder.h), its records in the heartbeat (launch/train/heartbeat.h) and the
// supervisor's naming of a hang from them (launch/supervise/hang_report.h), without MPI: a stand-in communicator of two
// ranks whose operations return at once (their requests complete when the test says), and made-up records of
// larger layouts.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "launch/supervise/hang_report.h"
#include "launch/train/flight_dump.h"
#include "launch/train/heartbeat.h"
#include "parallel/flight_recorder.h"

namespace moe {
namespace {

using json = nlohmann::json;

// A request that completes when `done` is set.
struct ManualRequest final : Request {
  explicit ManualRequest(bool* d) : done(d) {}
  bool test() override { return *done; }
  void wait() override { *done = true; }
  bool* done;
};

// Two ranks, every operation returns at once; nonblocking ones complete when `request_done` is set.
class PairCommunicator final : public Communicator {
 public:
  bool request_done = false;
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "pair"; }
  MOE_COMMUNICATOR_CONVENIENCE_FORMS;
  void allreduce_sum(void*, int64_t, DType) override {}
  std::unique_ptr<Request> iallreduce_sum(void*, int64_t, DType) override { return made(); }
  void reduce_scatter_sum(const void*, void*, int64_t, DType) override {}
  std::unique_ptr<Request> ireduce_scatter_sum(const void*, void*, int64_t, DType) override { return made(); }
  void allgather(const void*, void*, int64_t, DType) override {}
  void alltoall(const void*, void*, int64_t, DType) override {}
  void alltoallv(const void*, const int64_t*, void*, const int64_t*, DType) override {}
  std::unique_ptr<Request> ialltoallv(const void*, const int64_t*, void*, const int64_t*, DType) override {
    return made();
  }
  void send(const void*, int64_t, DType, int, int) override {}
  void recv(void*, int64_t, DType, int, int) override {}
  std::unique_ptr<Request> isend(const void*, int64_t, DType, int, int) override { return made(); }
  std::unique_ptr<Request> irecv(void*, int64_t, DType, int, int) override { return made(); }
  void sendrecv_bytes(const void*, int64_t, int, void*, int64_t, int, int) override {}
  void broadcast(void*, int64_t, DType, int) override {}
  void barrier() override {}

 private:
  std::unique_ptr<Request> made() { return std::make_unique<ManualRequest>(&request_done); }
};

const FlightGroupState* group_state(const FlightSummary& s, const std::string& group) {
  for (const FlightGroupState& g : s.groups)
    if (g.group == group) return &g;
  return nullptr;
}

TEST(FlightRecorder, CountsCollectivesPerGroupAndPointToPointApart) {
  auto recorder = std::make_shared<FlightRecorder>();
  PairCommunicator ep_inner, dp_inner;
  RecordingCommunicator ep(nullptr, ep_inner, recorder, "ep"), dp(nullptr, dp_inner, recorder, "dp");
  float x[4] = {};
  int64_t counts[2] = {1, 3};
  ep.alltoall(x, x, 2);
  dp.allreduce_sum(x, 4);
  ep.send(x, 4, 1, 0);  // point to point: not a collective's number
  ep.alltoallv(x, counts, x, counts);
  const FlightSummary s = recorder->summary();
  ASSERT_NE(group_state(s, "ep"), nullptr);
  EXPECT_EQ(group_state(s, "ep")->seq, 2);
  EXPECT_EQ(group_state(s, "ep")->op, "alltoallv");
  EXPECT_FALSE(group_state(s, "ep")->waiting);
  EXPECT_EQ(group_state(s, "dp")->seq, 1);
  EXPECT_TRUE(s.p2p.empty());
  const std::vector<FlightEntry> ring = recorder->entries();
  ASSERT_EQ(ring.size(), 4u);
  EXPECT_EQ(ring[0].bytes, 2 * 2 * 4);  // count x size x 4 bytes
  EXPECT_EQ(ring[2].op, CommKind::Send);
  EXPECT_EQ(ring[2].seq, 1);
  EXPECT_EQ(ring[2].peer, 1);
  EXPECT_EQ(ring[3].bytes, 4 * 4);
  for (const FlightEntry& e : ring) EXPECT_GT(e.finished, 0.0);
}

TEST(FlightRecorder, NonblockingOperationWaitsUntilItsRequestCompletes) {
  auto recorder = std::make_shared<FlightRecorder>();
  PairCommunicator inner;
  RecordingCommunicator dp(nullptr, inner, recorder, "dp");
  float x[4] = {};
  auto first = dp.iallreduce_sum(x, 4);
  auto second = dp.iallreduce_sum(x, 4);
  auto peer = dp.irecv(x, 4, 1, 7);
  FlightSummary s = recorder->summary();
  // The oldest collective in flight is the one reported.
  EXPECT_EQ(group_state(s, "dp")->seq, 1);
  EXPECT_TRUE(group_state(s, "dp")->waiting);
  ASSERT_EQ(s.p2p.size(), 1u);
  EXPECT_EQ(s.p2p[0].op, "irecv");
  EXPECT_EQ(s.p2p[0].peer, 1);
  EXPECT_FALSE(first->test());
  inner.request_done = true;
  EXPECT_TRUE(first->test());
  second->wait();
  peer.reset();  // destroying a request completes it
  s = recorder->summary();
  EXPECT_EQ(group_state(s, "dp")->seq, 2);
  EXPECT_FALSE(group_state(s, "dp")->waiting);
  EXPECT_TRUE(s.p2p.empty());
}

TEST(FlightRecorder, RingKeepsTheLastOperationsAndGroupsOfOneAreLeftOut) {
  auto recorder = std::make_shared<FlightRecorder>();
  PairCommunicator inner;
  RecordingCommunicator ep(nullptr, inner, recorder, "ep");
  struct Single final : Communicator {
    int rank() const override { return 0; }
    int size() const override { return 1; }
    std::string name() const override { return "one"; }
    MOE_COMMUNICATOR_CONVENIENCE_FORMS;
    void allreduce_sum(void*, int64_t, DType) override {}
    std::unique_ptr<Request> iallreduce_sum(void*, int64_t, DType) override { return nullptr; }
    void reduce_scatter_sum(const void*, void*, int64_t, DType) override {}
    std::unique_ptr<Request> ireduce_scatter_sum(const void*, void*, int64_t, DType) override { return nullptr; }
    void allgather(const void*, void*, int64_t, DType) override {}
    void alltoall(const void*, void*, int64_t, DType) override {}
    void alltoallv(const void*, const int64_t*, void*, const int64_t*, DType) override {}
    std::unique_ptr<Request> ialltoallv(const void*, const int64_t*, void*, const int64_t*, DType) override {
      return nullptr;
    }
    void send(const void*, int64_t, DType, int, int) override {}
    void recv(void*, int64_t, DType, int, int) override {}
    std::unique_ptr<Request> isend(const void*, int64_t, DType, int, int) override { return nullptr; }
    std::unique_ptr<Request> irecv(void*, int64_t, DType, int, int) override { return nullptr; }
    void sendrecv_bytes(const void*, int64_t, int, void*, int64_t, int, int) override {}
    void broadcast(void*, int64_t, DType, int) override {}
    void barrier() override {}
  } single;
  RecordingCommunicator tp(nullptr, single, recorder, "tp");
  for (size_t i = 0; i < FlightRecorder::kRingSize + 10; ++i) ep.barrier();
  tp.barrier();
  const std::vector<FlightEntry> ring = recorder->entries();
  ASSERT_EQ(ring.size(), FlightRecorder::kRingSize);
  EXPECT_EQ(ring.back().op, CommKind::Barrier);
  EXPECT_EQ(ring[ring.size() - 2].seq, int64_t(FlightRecorder::kRingSize + 10));
  const FlightSummary s = recorder->summary();
  EXPECT_EQ(group_state(s, "ep")->seq, int64_t(FlightRecorder::kRingSize + 10));
  EXPECT_EQ(group_state(s, "tp"), nullptr) << "a group of one rank waits for nobody";
}

TEST(FlightRecorder, DumpListsEveryOperationOldestFirst) {
  auto recorder = std::make_shared<FlightRecorder>();
  PairCommunicator inner;
  RecordingCommunicator ep(nullptr, inner, recorder, "ep");
  float x[4] = {};
  ep.alltoall(x, x, 2);
  ep.send(x, 4, 1, 0);
  auto open = ep.irecv(x, 4, 1, 0);
  const std::string text = flight_dump_text(*recorder, 3, "mh3");
  EXPECT_EQ(text.rfind("flight recorder of rank 3 on mh3, 3 operations, oldest first", 0), 0u) << text;
  const size_t first = text.find("ep #1 alltoall bytes=16 peer=- started=-");
  const size_t second = text.find("ep p2p #1 send bytes=16 peer=1 started=-");
  const size_t third = text.find("ep p2p #2 irecv bytes=16 peer=1 started=-");
  ASSERT_NE(first, std::string::npos) << text;
  ASSERT_NE(second, std::string::npos) << text;
  ASSERT_NE(third, std::string::npos) << text;
  EXPECT_LT(first, second);
  EXPECT_LT(second, third);
  EXPECT_NE(text.find("in flight", third), std::string::npos) << text;
  EXPECT_NE(text.substr(first, second - first).find("finished=-"), std::string::npos) << text;
}

// ---- the heartbeat's records

TEST(FlightHeartbeat, RecordsTravelAndComeBack) {
  Heartbeat b{3, 5, 4242, 17, Phase::Step, "mh3", {}};
  b.flight.groups = {{"ep", 412, "alltoall", true, 31.25}, {"dp.data", 9, "iallreduce", false, 0.5}};
  b.flight.p2p = {{"pp", "recv", 1, 2.0}};
  const std::string text = encode_heartbeat("s3cret", b);
  EXPECT_NE(text.find("c=ep,412,alltoall,w,31250"), std::string::npos) << text;
  std::string why;
  const auto back = decode_heartbeat(text, "s3cret", &why);
  ASSERT_TRUE(back) << why;
  ASSERT_EQ(back->flight.groups.size(), 2u);
  EXPECT_EQ(back->flight.groups[0].group, "ep");
  EXPECT_EQ(back->flight.groups[0].seq, 412);
  EXPECT_TRUE(back->flight.groups[0].waiting);
  EXPECT_DOUBLE_EQ(back->flight.groups[0].age_s, 31.25);
  EXPECT_EQ(back->flight.groups[1].group, "dp.data");
  EXPECT_FALSE(back->flight.groups[1].waiting);
  ASSERT_EQ(back->flight.p2p.size(), 1u);
  EXPECT_EQ(back->flight.p2p[0].peer, 1);
  EXPECT_EQ(back->host, "mh3");
}

TEST(FlightHeartbeat, StaysUnderTheLimitKeepingWaitsFirst) {
  Heartbeat b{3, 5, 4242, 17, Phase::Step, std::string(60, 'h'), {}};
  for (int g = 0; g < 16; ++g)
    b.flight.groups.push_back(
        {"group" + std::string(1, char('a' + g)), 1234567 + g, "ireduce_scatter", g == 15, 9999.0});
  const std::string text = encode_heartbeat(std::string(32, 'f'), b);
  EXPECT_LE(text.size(), kMaxHeartbeatBytes);
  EXPECT_NE(text.find("c=groupp,"), std::string::npos) << "the one waited in comes first\n" << text;
  std::string why;
  EXPECT_TRUE(decode_heartbeat(text, std::string(32, 'f'), &why)) << why;
}

TEST(FlightHeartbeat, MalformedRecordsAreRefused) {
  const std::string head = "MOEHB1 k 0 1 99 3 step h ";
  for (const std::string bad : {"c=ep,1,alltoall,x,5", "c=ep,-1,alltoall,w,5", "c=EP,1,alltoall,w,5",
                                "c=ep,1,alltoall,w", "p=pp,recv,1", "q=ep,1,a,w,5", "extra", "c=ep,1,all-to,w,5"}) {
    std::string why;
    EXPECT_FALSE(decode_heartbeat(head + bad, "k", &why)) << bad;
    EXPECT_EQ(why, "malformed") << bad;
  }
}

// ---- naming the hang

RankFlight waiting_in(const std::string& host, const std::string& group, int64_t seq, const std::string& op,
                      double age) {
  return {host, {{{group, seq, op, true, age}}, {}}, 1.0};
}
RankFlight finished(const std::string& host, const std::string& group, int64_t seq, const std::string& op) {
  return {host, {{{group, seq, op, false, 0.5}}, {}}, 1.0};
}

TEST(HangReport, NamesTheRanksThatNeverEnteredTheCollective) {
  // 16 ranks, ep 8: ep groups {0..7} and {8..15}. In ep group 1 ranks 12-15 on host mh3 are one all-to-all behind.
  const RankGrid grid({16, 1, 1, 0, 8, 1}, 8);
  std::map<int64_t, RankFlight> ranks;
  for (int64_t r = 0; r < 8; ++r) ranks[r] = finished("mh0", "ep", 412, "alltoall");
  for (int64_t r = 8; r < 12; ++r) ranks[r] = waiting_in(r < 10 ? "mh2" : "mh2", "ep", 412, "alltoall", 30.0);
  for (int64_t r = 12; r < 16; ++r) ranks[r] = finished("mh3", "ep", 411, "alltoall");
  const std::vector<json> f = hang_findings(grid, ranks);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0]["group"], "ep");
  EXPECT_EQ(f[0]["group_index"], 1);
  EXPECT_EQ(f[0]["seq"], 412);
  EXPECT_FALSE(f[0]["mismatch"].get<bool>());
  EXPECT_EQ(f[0]["not_entered"], json({12, 13, 14, 15}));
  EXPECT_EQ(f[0]["not_entered_hosts"], json({"mh3"}));
  EXPECT_EQ(f[0]["waiting"], json({8, 9, 10, 11}));
  EXPECT_EQ(f[0]["summary"],
            "ep group 1, alltoall #412: ranks 12-15 on host mh3 never entered it; ranks 8-11 wait in it since 31 s");
}

TEST(HangReport, RanksNeverHeardAreNamedAsNotEntered) {
  const RankGrid grid({4, 1, 1, 0, 4, 1}, 4);
  std::map<int64_t, RankFlight> ranks;
  for (int64_t r = 0; r < 3; ++r) ranks[r] = waiting_in("a", "ep", 7, "ialltoallv", 5.0);
  const std::vector<json> f = hang_findings(grid, ranks);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0]["not_entered"], json({3}));
  EXPECT_NE(f[0]["summary"].get<std::string>().find("rank 3 on host (never heard) never entered it; ranks 0-2 wait"),
            std::string::npos)
      << f[0]["summary"];
}

TEST(HangReport, DifferentOperationsAtOneSequenceNumberAreAMismatch) {
  const RankGrid grid({2, 1, 1, 0, 2, 1}, 4);
  std::map<int64_t, RankFlight> ranks;
  ranks[0] = waiting_in("a", "ep", 12, "alltoall", 4.0);
  ranks[1] = waiting_in("a", "ep", 12, "barrier", 4.0);
  const std::vector<json> f = hang_findings(grid, ranks);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_TRUE(f[0]["mismatch"].get<bool>());
  EXPECT_EQ(f[0]["summary"],
            "ep group 0: collective mismatch, the ranks are in different collectives: rank 0 in alltoall #12 (waiting "
            "5 s); rank 1 in barrier #12 (waiting 5 s)");
}

TEST(HangReport, WaitingInDifferentSequenceNumbersIsAMismatch) {
  const RankGrid grid({4, 1, 1, 0, 1, 1}, 4);  // dp 4
  std::map<int64_t, RankFlight> ranks;
  for (int64_t r = 0; r < 3; ++r) ranks[r] = waiting_in("a", "dp", 20, "allreduce", 3.0);
  ranks[3] = waiting_in("b", "dp", 19, "allreduce", 3.0);
  const std::vector<json> f = hang_findings(grid, ranks);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_TRUE(f[0]["mismatch"].get<bool>());
  EXPECT_NE(f[0]["summary"].get<std::string>().find("rank 3 in allreduce #19"), std::string::npos) << f[0]["summary"];
}

TEST(HangReport, EveryRankInsideTheSameCollectiveIsSaidSo) {
  const RankGrid grid({2, 1, 1, 0, 2, 1}, 4);
  std::map<int64_t, RankFlight> ranks;
  ranks[0] = waiting_in("a", "ep", 5, "alltoall", 2.0);
  ranks[1] = waiting_in("b", "ep", 5, "alltoall", 1.0);
  const std::vector<json> f = hang_findings(grid, ranks);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_FALSE(f[0]["mismatch"].get<bool>());
  EXPECT_TRUE(f[0]["not_entered"].empty());
  EXPECT_NE(f[0]["summary"].get<std::string>().find("every rank of the group is in it"), std::string::npos);
}

TEST(HangReport, NamesTheGroupOfEachKindAndAPointToPointWait) {
  // tp 2 x pp 2 x dp 2: pp groups {0,4}, {1,5}, {2,6}, {3,7} (rank = tp + 2 * (dp + 2 * pp)).
  const RankGrid grid({8, 2, 2, 0, 1, 1}, 4);
  std::map<int64_t, RankFlight> ranks;
  for (int64_t r = 0; r < 8; ++r) ranks[r] = finished("h", "dp", 3, "allreduce");
  ranks[5].flight.p2p = {{"pp", "recv", 0, 6.0}};
  ranks[1] = waiting_in("h", "tp", 40, "allgather", 1.0);
  const std::vector<json> f = hang_findings(grid, ranks);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0]["group"], "pp");  // the longest wait first
  EXPECT_EQ(f[0]["group_index"], 1);
  EXPECT_EQ(f[0]["peer"], 1);
  EXPECT_EQ(f[0]["summary"],
            "pp group 1: rank 5 waits in recv with rank 1 since 7 s; rank 1 is in tp allgather #40 (waiting 2 s)");
  EXPECT_EQ(f[1]["group"], "tp");
  EXPECT_EQ(f[1]["group_index"], 0);
  EXPECT_EQ(f[1]["not_entered"], json({0}));
  EXPECT_EQ(hang_suspects(f), std::vector<int64_t>({0})) << "rank 0 waits in none of them";
}

TEST(HangReport, SuspectsAreTheRanksAbsentFromEveryCollectiveWaitedIn) {
  // dp 2 x ep 2 (the test_flight_hangs layout): rank 3 frozen; rank 2 waits for it in ep, ranks 0-1 in dp.
  const RankGrid grid({4, 1, 1, 0, 2, 1}, 4);
  std::map<int64_t, RankFlight> ranks;
  ranks[0] = waiting_in("h", "dp", 10, "iallreduce", 3.0);
  ranks[1] = waiting_in("h", "dp", 10, "iallreduce", 3.0);
  ranks[2] = waiting_in("h", "ep", 52, "ialltoallv", 3.0);
  ranks[2].flight.groups.push_back({"dp", 9, "iallreduce", false, 4.0});
  ranks[3] = finished("h", "ep", 51, "ialltoallv");
  ranks[3].flight.groups.push_back({"dp", 9, "iallreduce", false, 4.0});
  const std::vector<json> f = hang_findings(grid, ranks);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0]["group"], "dp");  // equal waits keep the order found: rank 0's dp wait, then rank 2's ep wait
  EXPECT_EQ(f[0]["not_entered"], json({2, 3}));
  EXPECT_EQ(f[1]["not_entered"], json({3}));
  EXPECT_EQ(hang_suspects(f), std::vector<int64_t>({3}));
  EXPECT_TRUE(hang_suspects({}).empty());
}

TEST(HangReport, RankListsAreRanges) {
  EXPECT_EQ(rank_list_text({3}), "rank 3");
  EXPECT_EQ(rank_list_text({3, 1, 2, 0}), "ranks 0-3");
  EXPECT_EQ(rank_list_text({0, 2, 5, 6}), "ranks 0, 2, 5-6");
}

}  // namespace
}  // namespace moe
