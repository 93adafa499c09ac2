// Checkpoints users can trust (docs/design.md, invariants 3 and 4): a run stopped after step 10 and resumed
// equals the uninterrupted 20-step run bit for bit (metrics and parameters), with full and incremental
// chains, written synchronously and asynchronously, on 1 and 4 ranks; a checkpoint taken at one layout
// resumes at another (dp 4 / ep 2 <-> dp 2 / ep 1) within the equivalence tolerance. Runs under
// mpirun -np 4; single-rank cases run on rank 0 while the others wait.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "launch/train/trainer.h"
#include "layout_runs.h"
#include "parallel/mpi_communicator.h"
#include "parallel/self_communicator.h"

namespace moe {
namespace {
using namespace test_support;
namespace fs = std::filesystem;
using json = nlohmann::json;

std::vector<std::string> base_overrides() {
  return small_moe_overrides({"train.steps=20", "train.eval_every=5", "train.global_batch=8", "moe.capacity_factor=1.0",
                              "moe.router.bias_balance.rate=0.01", "optim.per_expert_clip=1.5", "checkpoint.every=5"});
}

// Trains base_overrides() + extra on the first `ranks` ranks (tests/launch/layout_runs.h).
RunOutput train(int ranks, const std::vector<std::string>& extra, const std::string& dir, int64_t stop_after = 0) {
  std::vector<std::string> overrides = base_overrides();
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return train_on(ranks, overrides, dir, stop_after);
}

fs::path temp_root(const std::string& name) { return shared_temp_root("moe_ckpt_", name); }

struct Variant {
  const char* name;
  int ranks;
  std::vector<std::string> extra;
};

TEST(CheckpointResume, StoppedAndResumedEqualsUninterruptedBitForBit) {
  const std::vector<Variant> variants = {
      {"serial_full_sync", 1, {"checkpoint.full_every=1", "checkpoint.async=false"}},
      {"serial_incremental_async", 1, {"checkpoint.full_every=4", "checkpoint.async=true"}},
      {"dp4_ep2_full_async", 4, {"parallel.ep=2", "checkpoint.full_every=1"}},
      {"dp4_ep2_zero_incremental_sync",
       4,
       {"parallel.ep=2", "optim.zero=true", "checkpoint.full_every=3", "checkpoint.async=false"}},
      {"tp2_dp2_zero_incremental_async", 4, {"parallel.tp=2", "optim.zero=true", "checkpoint.full_every=3"}},
      {"pp2_ep2_incremental_async", 4, {"parallel.pp=2", "parallel.ep=2", "checkpoint.full_every=3"}},
  };
  for (const Variant& v : variants) {
    const fs::path root = temp_root(v.name);
    const RunOutput whole = train(v.ranks, v.extra, (root / "whole").string());
    train(v.ranks, v.extra, (root / "resumed").string(), 10);  // stops after step 10
    // The resume below must start from step 10 (a delta in the incremental chains), not an older one.
    if (MpiCommunicator::world()->rank() == 0) {
      EXPECT_TRUE(fs::exists(root / "resumed" / "checkpoints" / "step-00000010" / "manifest.json")) << v.name;
    }
    const RunOutput resumed = train(v.ranks, v.extra, (root / "resumed").string());  // --resume auto
    if (MpiCommunicator::world()->rank() == 0) {
      expect_bitwise_equal(whole, resumed, v.name);
      EXPECT_TRUE(fs::exists(root / "resumed" / "checkpoints" / "step-00000020" / "manifest.json")) << v.name;
      fs::remove_all(root);
    }
  }
}

// The routing techniques' state survives a resume: adaptive capacity (the factor and the runs of steps
// above and below its thresholds, window 3 so that the stop at step 10 falls inside a run), the proportional
// bias, the learned temperature (a parameter with AdamW moments), and a scheduled one (a function of the
// step); with the cascade, the warm-up over the first 3 steps and latent attention.
TEST(CheckpointResume, RoutingTechniquesStoppedAndResumedEqualUninterruptedBitForBit) {
  const std::vector<std::string> techniques = {R"(moe.overflow=["reroute", "dense"])",
                                               "moe.fallback_hidden=16",
                                               "moe.capacity_auto.enabled=true",
                                               "moe.capacity_auto.window=3",
                                               "moe.capacity_auto.min=0.5",
                                               "moe.capacity_auto.step=0.125",
                                               "moe.router.bias_balance.rule=proportional",
                                               "moe.router.warmup.steps=3",
                                               "optim.per_expert_clip_hot=0.5"};
  std::vector<std::string> learned = techniques, scheduled = techniques;
  for (const char* key : {"moe.router.tau_learned=true", "model.attention=mla", "model.mla.kv_rank=8",
                          "model.mla.q_rank=16", "model.mla.rope_dim=4"})
    learned.push_back(key);
  scheduled.push_back(R"(moe.router.tau_schedule=[{"step": 4, "tau": 2.0}, {"step": 16, "tau": 0.5}])");
  scheduled.push_back("parallel.ep=2");
  const std::vector<Variant> variants = {{"techniques_learned_tau_mla_serial", 1, learned},
                                         {"techniques_scheduled_tau_dp4_ep2", 4, scheduled}};
  for (const Variant& v : variants) {
    const fs::path root = temp_root(v.name);
    const RunOutput whole = train(v.ranks, v.extra, (root / "whole").string());
    train(v.ranks, v.extra, (root / "resumed").string(), 10);
    const RunOutput resumed = train(v.ranks, v.extra, (root / "resumed").string());
    if (MpiCommunicator::world()->rank() == 0) {
      expect_bitwise_equal(whole, resumed, v.name);
      std::set<double> factors;
      for (const json& line : whole.training) factors.insert(line["moe"][0]["capacity_factor"].get<double>());
      EXPECT_GT(factors.size(), 1u) << v.name << ": the capacity factor never moved";
      fs::remove_all(root);
    }
  }
}

TEST(CheckpointResume, ReshardsBetweenLayoutsIncludingOptimizerState) {
  const fs::path root = temp_root("reshard");
  const std::vector<std::string> big = {"parallel.ep=2", "optim.zero=true"};
  const std::vector<std::string> small = {"parallel.ep=1"};
  const RunOutput whole = train(1, {}, (root / "whole").string());
  // dp 4, ep 2 (ZeRO) -> dp 2, ep 1
  train(4, big, (root / "down").string(), 10);
  const RunOutput down = train(2, small, (root / "down").string());
  // dp 2, ep 1 -> dp 4, ep 2 (ZeRO)
  train(2, small, (root / "up").string(), 10);
  const RunOutput up = train(4, big, (root / "up").string());
  if (MpiCommunicator::world()->rank() == 0) {
    expect_close(whole, down, "dp4 ep2 zero -> dp2");
    expect_close(whole, up, "dp2 -> dp4 ep2 zero");
    fs::remove_all(root.parent_path());
  }
}

// A checkpoint written at tp 2 x dp 2 (sequence parallel, ZeRO) resumes at tp 1 and at tp 4 (and one
// written at tp 4 at tp 2 x dp 2), and one with the experts split by hidden width (expert_tp 2, ep 2, ZeRO)
// at tp 1 and back: tensors split by heads, hidden units, vocabulary and expert blocks are read in global
// coordinates, their AdamW moments too.
TEST(CheckpointResume, ReshardsAcrossTensorParallelLayouts) {
  const fs::path root = temp_root("reshard_tp");
  const std::vector<std::string> tp1 = {"model.heads=4"}, tp4 = {"model.heads=4", "parallel.tp=4"};
  const std::vector<std::string> tp2dp2 = {"model.heads=4", "parallel.tp=2", "optim.zero=true"};
  const RunOutput whole = train(1, tp1, (root / "whole").string());
  train(4, tp2dp2, (root / "to_tp1").string(), 10);
  const RunOutput to_tp1 = train(1, tp1, (root / "to_tp1").string());
  train(4, tp2dp2, (root / "to_tp4").string(), 10);
  const RunOutput to_tp4 = train(4, tp4, (root / "to_tp4").string());
  train(4, tp4, (root / "from_tp4").string(), 10);
  const RunOutput from_tp4 = train(4, tp2dp2, (root / "from_tp4").string());
  // Experts split over ep on axis 0 and over etp on their hidden width: 2-D blocks and ZeRO slices of them.
  const std::vector<std::string> etp = {"model.heads=4", "parallel.tp=2", "parallel.expert_tp=2", "parallel.ep=2",
                                        "optim.zero=true"};
  train(4, etp, (root / "from_etp").string(), 10);
  const RunOutput from_etp = train(1, tp1, (root / "from_etp").string());
  train(1, tp1, (root / "to_etp").string(), 10);
  const RunOutput to_etp = train(4, etp, (root / "to_etp").string());
  // Pipeline stages: each writes its layers; the optimizer step once for the job.
  const std::vector<std::string> pp2tp2 = {"model.heads=4", "parallel.pp=2", "parallel.tp=2", "optim.zero=true"};
  train(4, pp2tp2, (root / "from_pp").string(), 10);
  const RunOutput from_pp = train(1, tp1, (root / "from_pp").string());
  if (MpiCommunicator::world()->rank() == 0) {
    expect_close(whole, to_tp1, "tp2 dp2 zero -> tp1");
    expect_close(whole, to_tp4, "tp2 dp2 zero -> tp4");
    expect_close(whole, from_tp4, "tp4 -> tp2 dp2 zero");
    expect_close(whole, from_etp, "tp2 etp2 ep2 dp2 zero -> tp1");
    expect_close(whole, to_etp, "tp1 -> tp2 etp2 ep2 dp2 zero");
    expect_close(whole, from_pp, "pp2 tp2 zero -> tp1");
    fs::remove_all(root.parent_path());
  }
}

// Node-local roots (checkpoint.node_local): 4 ranks as 2 simulated hosts of 2 ranks, each host writing to its
// own directory and keeping its peer host's shards. Losing either host's whole directory loses no checkpoint:
// the resumed run still equals the uninterrupted one bit for bit.
TEST(CheckpointResume, NodeLocalRootsSurviveLosingOneHostsDisk) {
  ::setenv("MOE_RANKS_PER_NODE", "2", 1);
  for (int lost : {1, 0}) {
    const fs::path root = temp_root("node_local_" + std::to_string(lost));
    const std::vector<std::string> extra = {"parallel.ep=2", "checkpoint.node_local=true", "checkpoint.peer_copy=true",
                                            "checkpoint.full_every=1", "checkpoint.dir=host{node}"};
    const RunOutput whole = train(4, extra, (root / "whole").string());
    train(4, extra, (root / "resumed").string(), 10);
    if (MpiCommunicator::world()->rank() == 0) {
      const fs::path disk = root / "resumed" / ("host" + std::to_string(lost));
      EXPECT_TRUE(fs::exists(disk / "step-00000010" / "manifest.json"));
      fs::remove_all(disk);  // the host's disk is gone
    }
    MpiCommunicator::world()->barrier();
    const RunOutput resumed = train(4, extra, (root / "resumed").string());
    if (MpiCommunicator::world()->rank() == 0) {
      expect_bitwise_equal(whole, resumed, "node-local, host " + std::to_string(lost) + " lost");
      fs::remove_all(root);
    }
  }
  ::unsetenv("MOE_RANKS_PER_NODE");
}

// Every parameter tensor a checkpoint holds (its chain applied), by the name collect_parameters gives it.
std::map<std::string, std::vector<float>> checkpoint_parameters(const std::string& dir) {
  std::string why;
  const std::optional<ckpt::Resolved> resolved = ckpt::verify_checkpoint(dir, {}, &why);
  EXPECT_TRUE(resolved.has_value()) << why;
  std::map<std::string, std::vector<float>> out;
  if (!resolved) return out;
  std::vector<ckpt::Piece> pieces;
  const std::string prefix = "params/";
  for (const ckpt::FileEntry& f : resolved->chain.back().files)
    for (const ckpt::DatasetEntry& d : f.datasets) {
      if (d.tensor.rfind(prefix, 0) != 0 || out.count(d.tensor.substr(prefix.size()))) continue;
      const ckpt::Slab whole = ckpt::Slab::whole(d.global_shape());
      std::vector<float>& values = out[d.tensor.substr(prefix.size())];
      values.assign(size_t(whole.count), 0.0f);
      pieces.push_back(ckpt::Piece{d.tensor, ckpt::DType::F32, whole, nullptr, values.data()});
    }
  ckpt::load_pieces(*resolved, pieces);
  return out;
}

// An asynchronous save's snapshot is taken by the writer thread while training goes on (docs/checkpoint.md):
// with the writer made to wait 300 ms before it copies, the steps after a save run their forward and backward
// meanwhile and hold their update until it has. The checkpoints of steps 10 (a delta) and 15 (a full one)
// then hold exactly the parameters of steps 10 and 15 of a run without checkpoints, bit for bit, on 1 rank
// and on 4 (ZeRO, whose all-gather rewrites the parameters); synchronous saves likewise.
TEST(CheckpointResume, BackgroundSnapshotHoldsTheStateOfItsStep) {
  const std::vector<Variant> variants = {
      {"snapshot_serial_async", 1, {"checkpoint.async=true"}},
      {"snapshot_serial_sync", 1, {"checkpoint.async=false"}},
      {"snapshot_dp4_ep2_zero_async", 4, {"parallel.ep=2", "optim.zero=true", "checkpoint.async=true"}},
  };
  for (const Variant& v : variants) {
    const fs::path root = temp_root(v.name);
    std::vector<std::string> none = v.extra, saved = v.extra;
    none.push_back("checkpoint.every=0");
    for (const char* o : {"checkpoint.every=5", "checkpoint.full_every=3", "checkpoint.keep=10"}) saved.push_back(o);
    const RunOutput at10 = train(v.ranks, none, (root / "at10").string(), 10);
    const RunOutput at15 = train(v.ranks, none, (root / "at15").string(), 15);
    ::setenv("MOE_TEST_SNAPSHOT_DELAY_MS", "300", 1);
    const RunOutput run = train(v.ranks, saved, (root / "saved").string());
    ::unsetenv("MOE_TEST_SNAPSHOT_DELAY_MS");
    if (MpiCommunicator::world()->rank() == 0) {
      for (const auto& [step, reference] : {std::pair<int, const RunOutput*>{10, &at10}, {15, &at15}}) {
        const std::string dir = (root / "saved" / "checkpoints" / ("step-000000" + std::to_string(step))).string();
        const std::map<std::string, std::vector<float>> held = checkpoint_parameters(dir);
        const auto& expected = reference->result.parameters;
        ASSERT_EQ(held.size(), expected.size()) << v.name << " step " << step;
        for (const auto& [name, values] : expected) {
          ASSERT_TRUE(held.count(name)) << v.name << ": " << name << " not in the checkpoint of step " << step;
          EXPECT_EQ(0, std::memcmp(values.data(), held.at(name).data(), values.size() * sizeof(float)))
              << v.name << ": " << name << " in the checkpoint of step " << step << " is not the step's";
        }
      }
      // A save's step writes its line before the save (a resumed run never starts past the last line); the
      // next line counts the save's stall: its hand-over and, asynchronous, the next update's wait for the
      // snapshot (most of the writer's 300 ms), or, synchronous, the whole save.
      const bool async = v.extra.back() == "checkpoint.async=true";
      std::ifstream metrics(root / "saved" / "metrics.jsonl");
      std::map<int64_t, double> stall;
      for (std::string text; std::getline(metrics, text);) {
        const json line = json::parse(text);
        if (line.contains("ckpt_stall_s")) stall[line["step"].get<int64_t>()] = line["ckpt_stall_s"].get<double>();
      }
      for (const int64_t after : {6, 11, 16}) {
        ASSERT_TRUE(stall.count(after)) << v.name << " step " << after;
        EXPECT_GT(stall[after], async ? 0.1 : 0.0)
            << v.name << ": the save before step " << after << " was not counted";
      }
      EXPECT_EQ(stall[10], 0.0) << v.name << ": the line of a save's step is written before the save";
      EXPECT_EQ(run.training.size(), 20u) << v.name;
      fs::remove_all(root);
    }
    MpiCommunicator::world()->barrier();
  }
}

// Replicated tensors are written once, by one member of their replica group, the bytes spread over its
// members: with dp 4 / ep 2 every rank's file holds dense tensors and expert tensors, none holds much more
// than a quarter of the dense bytes (one tensor's worth of imbalance at most), and the checkpoint verifies
// (each element written exactly once).
TEST(CheckpointResume, ReplicatedTensorsAreWrittenOnceSpreadOverTheReplicaGroup) {
  const fs::path root = temp_root("spread");
  train(4, {"parallel.ep=2", "train.steps=5"}, (root / "run").string());
  if (MpiCommunicator::world()->rank() == 0) {
    const std::string dir = (root / "run" / "checkpoints" / "step-00000005").string();
    std::string why;
    ASSERT_TRUE(ckpt::verify_checkpoint(dir, {}, &why).has_value()) << why;
    const ckpt::Manifest m = ckpt::read_manifest(dir);
    ASSERT_EQ(m.files.size(), 4u);
    std::vector<int64_t> dense(4, 0), expert(4, 0);
    int64_t largest = 0, total = 0;
    for (const ckpt::FileEntry& f : m.files)
      for (const ckpt::DatasetEntry& d : f.datasets) {
        const int64_t bytes = d.count() * (d.dtype == ckpt::DType::F32 ? 4 : 8);
        (d.tensor.find(".experts.") != std::string::npos ? expert : dense)[size_t(f.rank)] += bytes;
        if (d.tensor.find(".experts.") == std::string::npos) largest = std::max(largest, bytes), total += bytes;
      }
    for (size_t r = 0; r < 4; ++r) {
      EXPECT_GT(dense[r], 0) << "rank " << r << " writes no dense tensor";
      EXPECT_GT(expert[r], 0) << "rank " << r << " writes no expert tensor";
      EXPECT_LE(dense[r], total / 4 + largest) << "rank " << r << " writes more than its share";
    }
    fs::remove_all(root);
  }
  MpiCommunicator::world()->barrier();
}

}  // namespace
}  // namespace moe
