// Every data- and expert-parallel layout reproduces the serial run (docs/design.md, invariants 2): the same
// config trained for 10 steps on one rank and on dp = 2, dp = 4, ep = 2, ep = 4 and dp = 4 with ep = 2,
// each with ZeRO off and on, with capacity dropping on and off, and with the routing techniques of
// docs/moe.md and latent attention on. Runs under mpirun -np 4; layouts with
// fewer ranks run on a sub-communicator while the other ranks wait.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "launch/train/trainer.h"
#include "layout_runs.h"
#include "parallel/mpi_communicator.h"
#include "parallel/self_communicator.h"

namespace moe {
namespace {
using namespace test_support;
namespace fs = std::filesystem;
using json = nlohmann::json;

// A small MoE model: 2 layers (one dense, one MoE), 4 experts top-2, 8 sequences of 16 tokens per step,
// one sequence per micro-batch so that dp = 4 still accumulates two micro-batches per rank.
std::vector<std::string> base_overrides() {
  return small_moe_overrides({"train.steps=10", "train.eval_every=0", "train.global_batch=8"});
}

// base_overrides() + extra trained on the first `ranks` ranks (tests/launch/layout_runs.h).
RunOutput train(int ranks, const std::vector<std::string>& extra, const fs::path& dir) {
  std::vector<std::string> overrides = base_overrides();
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return train_on(ranks, overrides, dir.string());
}

// A layout: the ranks it runs on and the config keys that make it.
struct Layout {
  std::string name;
  int ranks;
  std::vector<std::string> keys;
};

// The serial run of `variant`, then each layout of it, each against the serial run. Returns the serial run
// (rank 0's; empty elsewhere).
RunOutput check_layouts(const std::vector<std::string>& variant, const std::string& variant_name,
                        const std::vector<Layout>& layouts) {
  auto world = MpiCommunicator::world();
  EXPECT_EQ(world->size(), 4) << "run under mpirun -np 4";
  if (world->size() != 4) return {};
  const fs::path tmp = shared_temp_root("moe_equivalence_", "layouts");
  const RunOutput serial = train(1, variant, tmp / (variant_name + "_serial"));
  for (const Layout& layout : layouts) {
    const std::string name = variant_name + "_" + layout.name;
    std::vector<std::string> extra = variant;
    extra.insert(extra.end(), layout.keys.begin(), layout.keys.end());
    const RunOutput run = train(layout.ranks, extra, tmp / name);
    if (world->rank() == 0) expect_equivalent(serial, run, name);
  }
  if (world->rank() == 0) fs::remove_all(tmp.parent_path());
  return serial;
}

// Data and expert parallelism: dp 2, dp 4, ep 2, ep 4 and dp 4 with ep 2, each with ZeRO off and on.
RunOutput check_all_layouts(const std::vector<std::string>& variant, const std::string& variant_name) {
  std::vector<Layout> layouts;
  for (const auto& [name, ranks, ep] : {std::tuple{"dp2", 2, 1}, std::tuple{"dp4", 4, 1}, std::tuple{"ep2", 2, 2},
                                        std::tuple{"ep4", 4, 4}, std::tuple{"dp4_ep2", 4, 2}})
    for (bool zero : {false, true})
      layouts.push_back(
          {std::string(name) + (zero ? "_zero" : ""),
           ranks,
           {"parallel.ep=" + std::to_string(ep), std::string("optim.zero=") + (zero ? "true" : "false")}});
  return check_layouts(variant, variant_name, layouts);
}

// Tensor parallelism (docs/parallel.md): tp 2 and 4 with sequence parallelism, tp 2 without, tp 2 beside
// dp 2, and tp 2 with ep 2 (the tp ranks are the expert-parallel ranks), with capacity dropping and
// rerouting, and with the dense fallback. The MoE routing group is split over the tp ranks, so the
// per-step routing (tokens per expert, drops) must still be the serial run's. And the experts split by
// hidden width over the tp ranks (parallel.expert_tp = 2), with and without sequence parallelism, and
// beside ep 2 and dp 2 with ZeRO.
RunOutput check_tensor_parallel_layouts(const std::vector<std::string>& variant, const std::string& variant_name) {
  return check_layouts(
      variant, variant_name,
      {
          {"tp2", 2, {"parallel.tp=2"}},
          {"tp4", 4, {"parallel.tp=4"}},
          {"tp2_no_sp", 2, {"parallel.tp=2", "parallel.sequence_parallel=false"}},
          {"tp2_dp2", 4, {"parallel.tp=2"}},
          {"tp2_ep2", 2, {"parallel.tp=2", "parallel.ep=2"}},
          {"tp2_dp2_ep2_zero", 4, {"parallel.tp=2", "parallel.ep=2", "optim.zero=true"}},
          {"tp2_etp2", 2, {"parallel.tp=2", "parallel.expert_tp=2"}},
          {"tp2_etp2_no_sp", 2, {"parallel.tp=2", "parallel.expert_tp=2", "parallel.sequence_parallel=false"}},
          {"tp2_etp2_dp2_ep2_zero", 4, {"parallel.tp=2", "parallel.expert_tp=2", "parallel.ep=2", "optim.zero=true"}},
      });
}

// Pipeline parallelism (docs/parallel.md "Pipeline stages"): two stages of one layer each (the dense layer,
// then the MoE layer), alone and beside dp 2, ep 2 (dp 2) and tp 2, by the 1F1B schedule over each rank's
// micro-batches. Losses, the global norm and every MoE layer's routing (gathered from the last stage to rank
// 0's metrics) must be the serial run's.
RunOutput check_pipeline_layouts(const std::vector<std::string>& variant, const std::string& variant_name) {
  return check_layouts(variant, variant_name,
                       {
                           {"pp2", 2, {"parallel.pp=2"}},
                           {"pp2_dp2", 4, {"parallel.pp=2"}},
                           {"pp2_dp2_zero", 4, {"parallel.pp=2", "optim.zero=true"}},
                           {"pp2_ep2", 4, {"parallel.pp=2", "parallel.ep=2"}},
                           {"pp2_tp2", 4, {"parallel.pp=2", "parallel.tp=2"}},
                       });
}

TEST(ParallelEquivalence, PipelineLayoutsWithCapacityDropping) {
  check_pipeline_layouts({"train.eval_every=5", "moe.capacity_factor=0.75", "moe.router.bias_balance.rate=0.01",
                          "optim.per_expert_clip=1.5"},
                         "pp_capacity");
}

TEST(ParallelEquivalence, TensorParallelLayoutsWithRerouting) {
  check_tensor_parallel_layouts({"model.heads=4", "moe.capacity_factor=0.75", "moe.overflow=reroute",
                                 "moe.router.bias_balance.rate=0.01", "moe.loss.z=0.001", "optim.per_expert_clip=1.5"},
                                "reroute");
}
TEST(ParallelEquivalence, TensorParallelLayoutsWithDenseFallback) {
  check_tensor_parallel_layouts({"model.heads=4", "moe.capacity_factor=0.75", "moe.overflow=dense",
                                 "moe.fallback_hidden=16", "moe.shared_experts=1"},
                                "fallback");
}

// The routing techniques of docs/moe.md, all on: the overflow cascade (reroute, then the dense fallback),
// adaptive capacity moving every step (window 1, from 0.75 within [0.5, 1.5]), the proportional balancing
// bias, the router warm-up with a frozen backbone for the first 3 steps, frequency-aware per-expert clipping;
// with a learned temperature and latent attention on the data- and expert-parallel layouts, a learned one on
// the tensor-parallel layouts (latent attention is not split over tp ranks), a scheduled one on the pipeline.
std::vector<std::string> routing_techniques() {
  return {R"(moe.overflow=["reroute", "dense"])",
          "moe.fallback_hidden=16",
          "moe.capacity_factor=0.75",
          "moe.capacity_auto.enabled=true",
          "moe.capacity_auto.window=1",
          "moe.capacity_auto.min=0.5",
          "moe.capacity_auto.max=1.5",
          "moe.capacity_auto.step=0.125",
          "moe.router.bias_balance.rate=0.01",
          "moe.router.bias_balance.rule=proportional",
          "moe.router.warmup.steps=3",
          "moe.router.warmup.freeze_backbone=true",
          "optim.per_expert_clip=1.5",
          "optim.per_expert_clip_hot=0.5"};
}
// The serial run shows every technique at work: assignments rerouted and sent to the fallback, none dropped,
// the capacity factor moving, the warm-up term only in the first 3 steps, and the temperature `tau` (in
// force at `step`, or learned: moving).
void expect_techniques_at_work(const RunOutput& serial, const std::function<double(int64_t)>& tau) {
  if (MpiCommunicator::world()->rank() != 0) return;
  ASSERT_EQ(serial.training.size(), 10u);
  int64_t rerouted = 0, fallback = 0, dropped = 0;
  std::set<double> factors, taus;
  for (const json& line : serial.training) {
    const int64_t step = line["step"];
    EXPECT_EQ(line["warmup_loss"].get<double>() > 0, step <= 3) << "step " << step;
    const json& layer = line["moe"][0];
    rerouted += layer["rerouted"].get<int64_t>(), fallback += layer["fallback"].get<int64_t>();
    dropped += layer["dropped"].get<int64_t>();
    factors.insert(layer["capacity_factor"].get<double>()), taus.insert(layer["tau"].get<double>());
    if (tau) {
      EXPECT_NEAR(layer["tau"].get<double>(), tau(step - 1), 1e-12) << "step " << step;
    }
  }
  EXPECT_GT(rerouted, 0);
  EXPECT_GT(fallback, 0);
  EXPECT_EQ(dropped, 0);
  EXPECT_GT(factors.size(), 2u);
  EXPECT_GT(taus.size(), 2u);
}

TEST(ParallelEquivalence, RoutingTechniquesAndLatentAttentionEveryLayout) {
  std::vector<std::string> variant = routing_techniques();
  for (const char* key : {"moe.router.tau_learned=true", "model.attention=mla", "model.mla.kv_rank=8",
                          "model.mla.q_rank=16", "model.mla.rope_dim=4"})
    variant.push_back(key);
  expect_techniques_at_work(check_all_layouts(variant, "techniques"), nullptr);
}
TEST(ParallelEquivalence, RoutingTechniquesPipelineLayouts) {
  std::vector<std::string> variant = routing_techniques();
  variant.push_back(R"(moe.router.tau_schedule=[{"step": 0, "tau": 2.0}, {"step": 8, "tau": 0.8}])");
  variant.push_back("model.heads=4");
  const auto scheduled = [](int64_t step) { return step >= 8 ? 0.8 : 2.0 - 1.2 * double(step) / 8.0; };
  expect_techniques_at_work(check_pipeline_layouts(variant, "techniques"), scheduled);
}
// A learned temperature where the routing group is split over the tp ranks (each rank its tokens' share of
// the gradient) and where the experts are (every rank the whole group's).
TEST(ParallelEquivalence, RoutingTechniquesTensorParallelLayouts) {
  std::vector<std::string> variant = routing_techniques();
  variant.push_back("moe.router.tau_learned=true");
  variant.push_back("model.heads=4");
  expect_techniques_at_work(check_tensor_parallel_layouts(variant, "techniques"), nullptr);
}

TEST(ParallelEquivalence, DroplessEveryLayout) { check_all_layouts({"moe.capacity_factor=0"}, "dropless"); }
TEST(ParallelEquivalence, CapacityDroppingEveryLayout) {
  check_all_layouts({"moe.capacity_factor=0.75", "moe.router.bias_balance.rate=0.01", "optim.per_expert_clip=1.5"},
                    "capacity");
}

}  // namespace
}  // namespace moe
