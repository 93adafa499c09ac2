// Training as on GPUs, checked on the CPU (docs/gpu.md "Training on several GPUs"): with
// MOE_CHECK_DEVICE_MEMORY=1 the backend's memory says it is not the host's (so every staging path of the
// CUDA backend runs) and both planes check what they carry: backend memory only over the data plane (NCCL on
// GPUs), host memory only over the control plane (MPI). Data, expert and pipeline parallelism with ZeRO, the
// expert all-to-all's overlap and a checkpoint resume run so on 4 ranks, and give the same bits as the plain
// CPU run. Tensor parallelism, whose layers still move activations through host memory, is refused.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "layout_runs.h"

namespace moe {
namespace {
using namespace test_support;
namespace fs = std::filesystem;

// While it lives, `moe train` in this process trains on the memory-checking backend.
struct DeviceMemoryCheck {
  DeviceMemoryCheck() { ::setenv("MOE_CHECK_DEVICE_MEMORY", "1", 1); }
  ~DeviceMemoryCheck() { ::unsetenv("MOE_CHECK_DEVICE_MEMORY"); }
};

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

TEST(DevicePlanes, TensorParallelismIsRefusedOnDeviceMemory) {
  const fs::path root = shared_temp_root("moe_planes_", "tp");
  const DeviceMemoryCheck check;
  auto world = MpiCommunicator::world();
  std::unique_ptr<Communicator> two = world->split(world->rank() < 2 ? 0 : -1, world->rank(), "world");
  if (two) {
    TrainOptions o;
    o.config_path = std::string(MOE_SOURCE_DIR) + "/configs/tiny_moe.json";
    o.overrides = overrides({"parallel.tp=2"});
    o.run_dir = (root / "run").string();
    o.quiet = true;
    try {
      run_train(o, std::move(two));
      ADD_FAILURE() << "tp 2 on device memory trained";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::BadInput);
      EXPECT_NE(std::string(e.what()).find("parallel.tp = 2 with MOE_CHECK_DEVICE_MEMORY=1"), std::string::npos)
          << e.what();
    }
    EXPECT_FALSE(fs::exists(root / "run" / "metrics.jsonl")) << "nothing written";
  }
  world->barrier();
  if (world->rank() == 0) fs::remove_all(root.parent_path());
}

}  // namespace
}  // namespace moe
