// Training as on GPUs, checked on the CPU (docs/gpu.md "Training on several GPUs"): with
// MOE_CHECK_DEVICE_MEMORY=1 the backend's memory says it is not the host's (so every staging path of the
// CUDA backend runs) and both planes check what they carry: backend memory only over the data plane (NCCL on
// GPUs), host memory only over the control plane (MPI). Data, expert, tensor (with and without sequence
// parallelism, and over the experts' hidden width) and pipeline parallelism with ZeRO, the expert all-to-all's
// overlap, the routing techniques, noise, recompute, bf16 GEMMs and a checkpoint resume run so on 4 ranks, and give the
// same bits as the plain CPU run. tests/launch/test_four_dimensions.cpp composes all four under the check on 8 ranks.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "layout_runs.h"

namespace moe {
namespace {
using namespace test_support;
namespace fs = std::filesystem;

std::vector<std::string> overrides(const std::vector<std::string>& extra) {
  std::vector<std::string> o =
      small_moe_overrides({"train.steps=6", "train.eval_every=3", "train.global_batch=8", "checkpoint.every=3"});
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

void expect_planes_keep_the_bits(const std::vector<std::string>& layout, const std::string& name) {
  const fs::path root = shared_temp_root("moe_planes_", name);
  const RunOutput plain = train_on(4, overrides(layout), (root / "plain").string());
  RunOutput checked;
  {
    const DeviceMemoryCheck check;
    checked = train_on(4, overrides(layout), (root / "checked").string());
  }
  if (MpiCommunicator::world()->rank() == 0) {
    expect_bitwise_equal(plain, checked, name);
    fs::remove_all(root.parent_path());
  }
}

TEST(DevicePlanes, DataAndExpertParallelWithZeroAndOverlap) {
  expect_planes_keep_the_bits({"parallel.ep=2", "optim.zero=true", "parallel.ep_overlap=true"}, "dp2_ep2_zero");
}

TEST(DevicePlanes, ExpertParallelOverEveryRankWithoutZero) {
  expect_planes_keep_the_bits({"parallel.ep=4", "moe.capacity_factor=0.75", "moe.overflow=reroute"}, "ep4");
}

// The routing techniques of docs/moe.md (the overflow cascade to the dense fallback, adaptive capacity, the
// balancing bias, the router warm-up, per-expert clipping, a learned temperature), a shared expert and latent
// attention.
TEST(DevicePlanes, RoutingTechniquesSharedExpertAndLatentAttention) {
  expect_planes_keep_the_bits(
      {"parallel.ep=2", "optim.zero=true", R"(moe.overflow=["reroute", "dense"])", "moe.fallback_hidden=16",
       "moe.capacity_factor=0.75", "moe.capacity_auto.enabled=true", "moe.capacity_auto.window=1",
       "moe.capacity_auto.min=0.5", "moe.router.bias_balance.rate=0.01", "moe.router.warmup.steps=2",
       "optim.per_expert_clip=1.5", "moe.router.tau_learned=true", "moe.shared_experts=1", "model.attention=mla",
       "model.mla.kv_rank=8", "model.mla.q_rank=16", "model.mla.rope_dim=4"},
      "techniques");
}

// The rest of the router's choices (Gumbel noise, sigmoid scores, a scheduled temperature), full recompute and
// bf16 GEMMs; then selective recompute under tensor parallelism.
TEST(DevicePlanes, NoiseSigmoidScoresScheduledTauRecomputeAndBf16) {
  expect_planes_keep_the_bits({"parallel.ep=2", "moe.router.noise=gumbel", "moe.router.score=sigmoid",
                               R"(moe.router.tau_schedule=[{"step": 0, "tau": 1.5}, {"step": 4, "tau": 0.8}])",
                               "train.recompute=full", "train.precision=bf16"},
                              "noise_sigmoid_tau_recompute");
  expect_planes_keep_the_bits({"parallel.tp=2", "train.recompute=selective"}, "tp2_selective");
}

TEST(DevicePlanes, PipelineStagesBesideDataAndExpertParallelism) {
  expect_planes_keep_the_bits({"parallel.pp=2", "parallel.ep=2", "optim.zero=true"}, "pp2_dp2_ep2");
}

// Stopped after step 3 (its checkpoint staged through host copies) and resumed under the check: the same bits
// as the uninterrupted plain run.
TEST(DevicePlanes, ResumesBitForBit) {
  const fs::path root = shared_temp_root("moe_planes_", "resume");
  const std::vector<std::string> layout = {"parallel.ep=2", "optim.zero=true"};
  const RunOutput plain = train_on(4, overrides(layout), (root / "plain").string());
  RunOutput resumed;
  {
    const DeviceMemoryCheck check;
    train_on(4, overrides(layout), (root / "checked").string(), 3);
    resumed = train_on(4, overrides(layout), (root / "checked").string());
  }
  if (MpiCommunicator::world()->rank() == 0) {
    expect_bitwise_equal(plain, resumed, "resumed under the check");
    EXPECT_TRUE(fs::exists(root / "checked" / "checkpoints" / "step-00000003" / "manifest.json"));
    fs::remove_all(root.parent_path());
  }
}

// Tensor parallelism: heads, hidden units and the vocabulary split over 2 ranks with sequence parallelism
// beside expert parallelism; the experts' hidden width split without it; and beside 2 pipeline stages.
TEST(DevicePlanes, TensorParallelWithSequenceParallelismBesideExpertParallelism) {
  expect_planes_keep_the_bits({"parallel.tp=2", "model.heads=4", "parallel.ep=2", "optim.zero=true"}, "tp2_ep2");
}

TEST(DevicePlanes, ExpertTensorParallelWithoutSequenceParallelism) {
  expect_planes_keep_the_bits({"parallel.tp=2", "model.heads=4", "parallel.expert_tp=2",
                               "parallel.sequence_parallel=false", "moe.capacity_factor=0.75"},
                              "tp2_etp2");
}

TEST(DevicePlanes, TensorParallelBesidePipelineStages) {
  expect_planes_keep_the_bits({"parallel.tp=2", "model.heads=4", "parallel.pp=2"}, "tp2_pp2");
}

}  // namespace
}  // namespace moe
