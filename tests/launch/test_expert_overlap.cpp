// The expert all-to-all overlap (parallel.ep_overlap, docs/parallel.md "Expert all-to-all overlap") changes
// when the rows travel, never what is computed: at ep = 2 a run with the overlap reproduces the blocking run
// bit for bit (every metrics line and every parameter), with shared experts computed beside the exchange,
// with the dense fallback computed beside the combine, and with neither. The exposed all-to-all time
// (a2a_wait_s) is in every training line. Runs under mpirun -np 2.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "layout_runs.h"
#include "parallel/mpi_communicator.h"

namespace moe {
namespace {
using namespace test_support;
namespace fs = std::filesystem;
using json = nlohmann::json;

// The small MoE model (layout_runs.h) at ep 2, 6 steps of 4 sequences.
std::vector<std::string> base_overrides() {
  return small_moe_overrides({"train.steps=6", "train.eval_every=3", "train.global_batch=4", "parallel.ep=2"});
}

// Every training line of `dir`'s metrics.jsonl has a2a_wait_s >= 0 (rank 0 reads).
void expect_a2a_wait(const fs::path& dir, const std::string& what) {
  std::ifstream in(dir / "metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (!j.contains("lm_loss")) continue;
    ASSERT_TRUE(j.contains("a2a_wait_s")) << what << ": " << line;
    EXPECT_GE(j["a2a_wait_s"].get<double>(), 0.0) << what;
    ++lines;
  }
  EXPECT_GT(lines, 0) << what;
}

// `variant` at ep = 2 with the overlap, then blocking: the same bits.
void check_overlap(const std::vector<std::string>& variant, const std::string& name) {
  auto world = MpiCommunicator::world();
  ASSERT_EQ(world->size(), 2) << "run under mpirun -np 2";
  const fs::path tmp = shared_temp_root("moe_overlap_", name);
  std::vector<std::string> overrides = base_overrides();
  overrides.insert(overrides.end(), variant.begin(), variant.end());
  std::vector<RunOutput> runs;
  for (const char* overlap : {"true", "false"}) {
    std::vector<std::string> o = overrides;
    o.push_back(std::string("parallel.ep_overlap=") + overlap);
    runs.push_back(train_on(2, o, (tmp / overlap).string()));
    if (world->rank() == 0) expect_a2a_wait(tmp / overlap, name + " overlap " + overlap);
  }
  if (world->rank() == 0) {
    expect_bitwise_equal(runs[0], runs[1], name + ": overlapped against blocking");
    fs::remove_all(tmp.parent_path());
  }
  world->barrier();
}

TEST(ExpertOverlap, SharedExpertsBesideTheExchangeAreBitwiseTheBlockingRun) {
  check_overlap({"moe.shared_experts=1"}, "shared");
}

TEST(ExpertOverlap, NothingBesideTheExchangeIsBitwiseTheBlockingRun) { check_overlap({}, "plain"); }

TEST(ExpertOverlap, DenseFallbackBesideTheCombineIsBitwiseTheBlockingRun) {
  check_overlap({"moe.capacity_factor=0.75", "moe.overflow=dense", "moe.fallback_hidden=16", "moe.shared_experts=1"},
                "fallback");
}

// With the overflow cascade, ZeRO and data parallelism beside expert parallelism (dp 1 here: 2 ranks).
TEST(ExpertOverlap, RerouteThenFallbackWithZeroIsBitwiseTheBlockingRun) {
  check_overlap({R"(moe.overflow=["reroute", "dense"])", "moe.capacity_factor=0.75", "moe.fallback_hidden=16",
                 "moe.shared_experts=2", "optim.zero=true"},
                "cascade");
}

}  // namespace
}  // namespace moe
