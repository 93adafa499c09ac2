// The dispatcher (moe.dispatcher, docs/parallel.md "Dispatchers") changes how rows travel, never what is
// computed: training with the all-gather dispatcher reproduces the all-to-all run bit for bit (every metrics line
// and every parameter, so every forward and backward), at ep 4 with capacity drops and at ep 2 x dp 2 dropless
// with the exchange overlapped, and on the memory-checking backend (MOE_CHECK_DEVICE_MEMORY=1) with the overflow
// cascade at ep 4; a checkpoint of one resumes with the other. Runs under mpirun -np 4.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "layout_runs.h"
#include "parallel/mpi_communicator.h"

namespace moe {
namespace {
using namespace test_support;
namespace fs = std::filesystem;
using json = nlohmann::json;

std::vector<std::string> overrides(const std::vector<std::string>& layout, const std::string& dispatcher) {
  std::vector<std::string> o = small_moe_overrides({"train.steps=4", "train.eval_every=2", "train.global_batch=8"});
  o.insert(o.end(), layout.begin(), layout.end());
  o.push_back("moe.dispatcher=" + dispatcher);
  return o;
}

// Assignments capacity dropped over a run (every MoE layer, every step).
int64_t dropped(const RunOutput& run) {
  int64_t n = 0;
  for (const json& line : run.training)
    for (const json& layer : line.at("moe")) n += layer.at("dropped").get<int64_t>();
  return n;
}

// `layout` with each dispatcher (both on the memory-checking backend when `checked`): the same bits; `drops`:
// whether capacity dropped assignments (unset: not checked).
void check_dispatchers(const std::vector<std::string>& layout, const std::string& name, std::optional<bool> drops,
                       bool checked = false) {
  auto world = MpiCommunicator::world();
  ASSERT_EQ(world->size(), 4) << "run under mpirun -np 4";
  const fs::path root = shared_temp_root("moe_dispatchers_", name);
  std::vector<RunOutput> runs;
  for (const char* dispatcher : {"alltoall", "allgather"}) {
    std::optional<DeviceMemoryCheck> check;
    if (checked) check.emplace();
    runs.push_back(train_on(4, overrides(layout, dispatcher), (root / dispatcher).string()));
  }
  if (world->rank() == 0) {
    EXPECT_EQ(runs[0].training.size(), 4u) << name;
    if (drops) {
      EXPECT_EQ(dropped(runs[0]) > 0, *drops) << name << ": capacity drops " << dropped(runs[0]);
    }
    expect_bitwise_equal(runs[0], runs[1], name + ": allgather against alltoall");
    fs::remove_all(root.parent_path());
  }
  world->barrier();
}

TEST(Dispatchers, AllGatherIsBitwiseTheAllToAllAtEp4WithDrops) {
  check_dispatchers({"parallel.ep=4", "moe.capacity_factor=0.75", "moe.overflow=drop"}, "ep4_drops", true);
}

TEST(Dispatchers, AllGatherIsBitwiseTheAllToAllAtEp2Dp2DroplessOverlapped) {
  check_dispatchers({"parallel.ep=2", "moe.capacity_factor=0", "moe.shared_experts=1", "parallel.ep_overlap=true"},
                    "ep2_dropless", false);
}

// The strict device: every row either dispatcher moves is backend memory over the data plane, and the host
// touches none of it. The cascade reroutes or sends to the fallback what capacity would drop.
TEST(Dispatchers, AllGatherOnTheStrictDeviceIsBitwiseTheAllToAllWithTheCascade) {
  check_dispatchers({"parallel.ep=4", R"(moe.overflow=["reroute", "dense"])", "moe.capacity_factor=0.75",
                     "moe.fallback_hidden=16", "optim.zero=true"},
                    "ep4_cascade_checked", std::nullopt, true);
}

// The dispatcher is not part of what a checkpoint means (a resume may change it without permission): a run
// checkpointed with the all-to-all and resumed with the all-gather is the uninterrupted all-to-all run, bit for bit.
TEST(Dispatchers, AnAllToAllCheckpointResumedWithTheAllGatherIsBitwiseTheUninterruptedRun) {
  auto world = MpiCommunicator::world();
  const std::vector<std::string> layout = {"parallel.ep=4", "moe.capacity_factor=0.75", "checkpoint.every=2"};
  const fs::path root = shared_temp_root("moe_dispatchers_", "switched");
  const RunOutput whole = train_on(4, overrides(layout, "alltoall"), (root / "whole").string());
  train_on(4, overrides(layout, "alltoall"), (root / "switched").string(), 2);  // stops after step 2
  const RunOutput switched = train_on(4, overrides(layout, "allgather"), (root / "switched").string());
  if (world->rank() == 0) {
    EXPECT_TRUE(fs::exists(root / "switched" / "checkpoints" / "step-00000002" / "manifest.json"));
    expect_bitwise_equal(whole, switched, "alltoall resumed with allgather");
    fs::remove_all(root.parent_path());
  }
  world->barrier();
}

}  // namespace
}  // namespace moe
