// Interleaved pipeline stages (parallel.vpp, docs/parallel.md "Interleaved stages"): each of pp = 2 ranks holds
// two non-adjacent chunks of a 4-layer model (rank 0 layers 0 and 2, rank 1 layers 1 and 3) and trains by the
// interleaved 1F1B schedule; also four stages of two chunks (8 layers) and two stages of two chunks split over
// tp = 2 ranks. Dropless, every layout reproduces the serial run (losses within the fp32
// reduction-order tolerance, the same routing counts every step); a run stopped and resumed equals the
// uninterrupted one bit for bit; and a checkpoint reshards between vpp 1 and vpp 2 and to one rank, since its
// pieces are in global coordinates. Under mpirun -np 4; layouts with fewer ranks run on a sub-communicator.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "launch/train/trainer.h"
#include "layout_runs.h"
#include "parallel/mpi_communicator.h"
#include "parallel/self_communicator.h"

namespace moe {
namespace {
using namespace test_support;
namespace fs = std::filesystem;

// The small MoE model with 4 layers (MoE layers 1 and 3), dropless, 8 sequences per step: 8 micro-batches of
// one sequence per rank at dp 1, 4 at dp 2, multiples of pp = 2 as the interleaved schedule needs.
std::vector<std::string> base_overrides(int64_t steps) {
  return small_moe_overrides({"model.layers=4", "train.steps=" + std::to_string(steps), "train.eval_every=5",
                              "train.global_batch=8", "moe.capacity_factor=0", "moe.router.bias_balance.rate=0.01",
                              "checkpoint.every=5"});
}

RunOutput train(int ranks, const std::vector<std::string>& extra, const fs::path& dir, int64_t steps,
                int64_t stop_after = 0) {
  std::vector<std::string> overrides = base_overrides(steps);
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return train_on(ranks, overrides, dir.string(), stop_after);
}

const std::vector<std::string> kVpp2 = {"parallel.pp=2", "parallel.vpp=2", "parallel.pp_schedule=interleaved_1f1b"};

std::vector<std::string> with(std::vector<std::string> keys, const std::vector<std::string>& more) {
  keys.insert(keys.end(), more.begin(), more.end());
  return keys;
}

bool four_ranks() {
  const int size = MpiCommunicator::world()->size();
  EXPECT_EQ(size, 4) << "run under mpirun -np 4";
  return size == 4;
}

TEST(InterleavedStages, DroplessLayoutsEqualTheSerialRun) {
  if (!four_ranks()) return;
  const fs::path root = shared_temp_root("moe_vpp_", "equivalence");
  const RunOutput serial = train(1, {}, root / "serial", 10);
  struct Layout {
    const char* name;
    int ranks;
    std::vector<std::string> keys;
  };
  const std::vector<Layout> layouts = {
      {"pp2_vpp2", 2, kVpp2},
      {"pp2_vpp2_dp2_zero", 4, with(kVpp2, {"optim.zero=true"})},
      {"pp2_vpp2_ep2", 4, with(kVpp2, {"parallel.ep=2"})},
  };
  for (const Layout& layout : layouts) {
    const RunOutput run = train(layout.ranks, layout.keys, root / layout.name, 10);
    if (MpiCommunicator::world()->rank() == 0) expect_equivalent(serial, run, layout.name);
  }
  if (MpiCommunicator::world()->rank() == 0) fs::remove_all(root.parent_path());
}

// Four stages of two chunks each (an 8-layer model: rank p holds layers p and p + 4, 8 micro-batches of one
// sequence), and two stages of two chunks whose layers are split over tp = 2 ranks: each equals the serial run of
// its model.
TEST(InterleavedStages, FourStagesAndTensorParallelChunksEqualTheSerialRun) {
  if (!four_ranks()) return;
  const fs::path root = shared_temp_root("moe_vpp_", "pp4_tp2");
  const std::vector<std::string> eight_layers = {"model.layers=8"};
  const RunOutput serial8 = train(1, eight_layers, root / "serial8", 10);
  const RunOutput pp4 =
      train(4, with(eight_layers, {"parallel.pp=4", "parallel.vpp=2", "parallel.pp_schedule=interleaved_1f1b"}),
            root / "pp4_vpp2", 10);
  const RunOutput serial = train(1, {}, root / "serial", 10);
  const RunOutput tp2 = train(4, with(kVpp2, {"parallel.tp=2"}), root / "tp2_pp2_vpp2", 10);
  if (MpiCommunicator::world()->rank() == 0) {
    expect_equivalent(serial8, pp4, "pp4_vpp2");
    expect_equivalent(serial, tp2, "tp2_pp2_vpp2");
    fs::remove_all(root.parent_path());
  }
}

TEST(InterleavedStages, StoppedAndResumedEqualsUninterruptedBitForBit) {
  if (!four_ranks()) return;
  struct Variant {
    const char* name;
    int ranks;
    std::vector<std::string> keys;
  };
  const std::vector<Variant> variants = {
      {"pp2_vpp2_full_sync", 2, with(kVpp2, {"checkpoint.full_every=1", "checkpoint.async=false"})},
      {"pp2_vpp2_dp2_zero_incremental_async", 4, with(kVpp2, {"optim.zero=true", "checkpoint.full_every=3"})},
  };
  for (const Variant& v : variants) {
    const fs::path root = shared_temp_root("moe_vpp_", v.name);
    const RunOutput whole = train(v.ranks, v.keys, root / "whole", 20);
    train(v.ranks, v.keys, root / "resumed", 20, 10);  // stops after step 10
    const RunOutput resumed = train(v.ranks, v.keys, root / "resumed", 20);
    if (MpiCommunicator::world()->rank() == 0) {
      expect_bitwise_equal(whole, resumed, v.name);
      fs::remove_all(root.parent_path());
    }
  }
}

TEST(InterleavedStages, CheckpointsReshardBetweenOneAndTwoChunksPerStage) {
  if (!four_ranks()) return;
  const fs::path root = shared_temp_root("moe_vpp_", "reshard");
  const std::vector<std::string> vpp1 = {"parallel.pp=2"};
  const RunOutput whole = train(1, {}, root / "whole", 20);
  train(2, kVpp2, root / "vpp2_to_vpp1", 20, 10);
  const RunOutput to_vpp1 = train(2, vpp1, root / "vpp2_to_vpp1", 20);
  train(2, vpp1, root / "vpp1_to_vpp2", 20, 10);
  const RunOutput to_vpp2 = train(2, kVpp2, root / "vpp1_to_vpp2", 20);
  train(4, with(kVpp2, {"optim.zero=true"}), root / "vpp2_to_serial", 20, 10);
  const RunOutput to_serial = train(1, {}, root / "vpp2_to_serial", 20);
  if (MpiCommunicator::world()->rank() == 0) {
    expect_close(whole, to_vpp1, "pp2 vpp2 -> pp2 vpp1");
    expect_close(whole, to_vpp2, "pp2 vpp1 -> pp2 vpp2");
    expect_close(whole, to_serial, "pp2 vpp2 dp2 zero -> serial");
    fs::remove_all(root.parent_path());
  }
}

}  // namespace
}  // namespace moe
