// The four dimensions composed (docs/parallel.md "The rank grid"): tp 2 x pp 2 x ep 2 x dp 2 on 8 ranks with
// ZeRO reproduces the serial run (routing counts identical every step), and so do 4 pipeline stages beside
// ep 2 and dp 2; a run stopped and resumed at the 8-rank layout equals the uninterrupted one bit for bit; a
// checkpoint written at pp 2 x tp 2 x dp 2 resumes on one rank and at pp 4; the trace of a pipelined step
// shows each rank's micro-batches, waits and all-to-alls; under the device memory check (training as on GPUs)
// the 8-rank layout gives the same bits. Runs under mpirun -np 8, oversubscribed.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "layout_runs.h"

namespace moe {
namespace {
using namespace test_support;
namespace fs = std::filesystem;

// The equivalence test's small MoE model (tests/launch/test_parallel_equivalence.cpp) with 4 heads for tp 2,
// `layers` layers (every second one MoE), capacity dropping with rerouting and the balancing bias, and a
// held-out evaluation every 5 steps: 8 sequences of 16 tokens per step, one per micro-batch.
std::vector<std::string> model_overrides(int64_t layers, int64_t steps) {
  return {"train.steps=" + std::to_string(steps),
          "model.layers=" + std::to_string(layers),
          "train.log_every=1",
          "train.eval_every=5",
          "train.eval_sequences=2",
          "train.seq_len=16",
          "train.global_batch=8",
          "train.micro_batch=1",
          "train.threads=1",
          "model.d_model=32",
          "model.heads=4",
          "model.ffn_hidden=48",
          "moe.num_experts=4",
          "moe.top_k=2",
          "moe.every=2",
          "moe.expert_hidden=32",
          "moe.router.noise=gumbel",
          "moe.capacity_factor=0.75",
          "moe.overflow=reroute",
          "moe.router.bias_balance.rate=0.01",
          "optim.per_expert_clip=1.5",
          "optim.lr=1e-3",
          "optim.warmup=2",
          "checkpoint.every=5"};
}

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& extra) {
  base.insert(base.end(), extra.begin(), extra.end());
  return base;
}

const std::vector<std::string> k4d = {"parallel.tp=2", "parallel.pp=2", "parallel.ep=2", "optim.zero=true"};

// The trace of steps 2 and 3 at tp 2 x pp 2 x ep 2 x dp 2: ranks 0-3 are stage 0 (the embedding and the
// dense layer), 4-7 stage 1 (the MoE layer and the head). Every rank forwards and backwards its 4
// micro-batches each step; stage 1 waits for activations, stage 0 for gradients; only stage 1 exchanges
// rows with the other expert-parallel rank; every rank waits for its gradient reduction and steps.
void expect_pipeline_trace(const fs::path& trace_path) {
  const json trace = json::parse(read_text(trace_path));
  std::map<int, std::map<std::string, int>> count;  // per rank, per span name
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    EXPECT_GE(e.at("dur").get<double>(), 0.0);
    ++count[e.at("pid").get<int>()][e.at("name").get<std::string>()];
  }
  ASSERT_EQ(count.size(), 8u);
  for (int rank = 0; rank < 8; ++rank) {
    const bool first = rank < 4;
    std::map<std::string, int>& c = count[rank];
    for (int mb = 0; mb < 4; ++mb) {
      const std::string m = " " + std::to_string(mb);
      EXPECT_EQ(c["forward" + m], 2) << "rank " << rank << " micro-batch " << mb;
      EXPECT_EQ(c["backward" + m], 2) << "rank " << rank << " micro-batch " << mb;
      EXPECT_EQ(c[(first ? "receive gradient (wait)" : "receive activation (wait)") + m], 2) << "rank " << rank;
      EXPECT_EQ(c[(first ? "send activation" : "send gradient") + m], 2) << "rank " << rank;
      EXPECT_EQ(c[(first ? "receive activation (wait)" : "receive gradient (wait)") + m], 0) << "rank " << rank;
    }
    EXPECT_EQ(c["gradient reduction wait"], 2) << "rank " << rank;
    EXPECT_EQ(c["optimizer"], 2) << "rank " << rank;
    if (first)
      EXPECT_EQ(c["all-to-all (rows)"], 0) << "rank " << rank;
    else  // forward and backward of each micro-batch, each with its rows out and back
      EXPECT_GE(c["all-to-all (rows)"], 2 * 4 * 2) << "rank " << rank;
  }
}

TEST(FourDimensions, EveryCompositionEqualsTheSerialRun) {
  auto world = MpiCommunicator::world();
  ASSERT_EQ(world->size(), 8) << "run under mpirun -np 8";
  const fs::path tmp = shared_temp_root("moe_4d_", "equivalence");
  const RunOutput serial = train_on(1, model_overrides(2, 10), (tmp / "serial").string());
  const RunOutput four = train_on(
      8, with(model_overrides(2, 10), with(k4d, {"train.trace=true", "train.trace_from=2", "train.trace_steps=2"})),
      (tmp / "tp2_pp2_ep2_dp2_zero").string());
  if (world->rank() == 0) {
    expect_equivalent(serial, four, "tp2 pp2 ep2 dp2 zero");
    expect_pipeline_trace(tmp / "tp2_pp2_ep2_dp2_zero" / "trace.json");
  }
  // Four stages of one layer each (dense, MoE, dense, MoE), alone and beside ep 2 and dp 2 with ZeRO.
  const RunOutput serial4 = train_on(1, model_overrides(4, 10), (tmp / "serial4").string());
  const RunOutput pp4 = train_on(4, with(model_overrides(4, 10), {"parallel.pp=4"}), (tmp / "pp4").string());
  const RunOutput pp4_ep2 =
      train_on(8, with(model_overrides(4, 10), {"parallel.pp=4", "parallel.ep=2", "optim.zero=true"}),
               (tmp / "pp4_ep2_dp2_zero").string());
  if (world->rank() == 0) {
    expect_equivalent(serial4, pp4, "pp4");
    expect_equivalent(serial4, pp4_ep2, "pp4 ep2 dp2 zero");
    if (!::testing::Test::HasFailure()) fs::remove_all(tmp.parent_path());
  }
}

// The four dimensions as on GPUs (MOE_CHECK_DEVICE_MEMORY=1, docs/gpu.md): backend memory only over the data
// plane, host memory only over the control plane, and the same bits as the plain CPU run.
TEST(FourDimensions, UnderTheDeviceMemoryCheckTheSameBits) {
  const fs::path tmp = shared_temp_root("moe_4d_", "planes");
  const std::vector<std::string> config = with(model_overrides(2, 6), k4d);
  const RunOutput plain = train_on(8, config, (tmp / "plain").string());
  RunOutput checked;
  {
    const DeviceMemoryCheck check;
    checked = train_on(8, config, (tmp / "checked").string());
  }
  if (MpiCommunicator::world()->rank() == 0) {
    expect_bitwise_equal(plain, checked, "tp2 pp2 ep2 dp2 zero under the device memory check");
    if (!::testing::Test::HasFailure()) fs::remove_all(tmp.parent_path());
  }
}

TEST(FourDimensions, StoppedAndResumedAtEightRanksEqualsUninterruptedBitForBit) {
  const fs::path tmp = shared_temp_root("moe_4d_", "resume");
  const std::vector<std::string> config = with(model_overrides(2, 20), with(k4d, {"checkpoint.full_every=3"}));
  const RunOutput whole = train_on(8, config, (tmp / "whole").string());
  train_on(8, config, (tmp / "resumed").string(), 10);
  const RunOutput resumed = train_on(8, config, (tmp / "resumed").string());
  if (MpiCommunicator::world()->rank() == 0) {
    EXPECT_TRUE(fs::exists(tmp / "resumed" / "checkpoints" / "step-00000010" / "manifest.json"));
    expect_bitwise_equal(whole, resumed, "tp2 pp2 ep2 dp2 zero");
    if (!::testing::Test::HasFailure()) fs::remove_all(tmp.parent_path());
  }
}

// Stages write their layers in global coordinates: a checkpoint of pp 2 x tp 2 x dp 2 (ZeRO) resumes on one
// rank, where one model holds every layer, and at pp 4, where each layer moves to another stage.
TEST(FourDimensions, PipelineCheckpointResumesOnOneRankAndAtFourStages) {
  const fs::path tmp = shared_temp_root("moe_4d_", "reshard");
  const std::vector<std::string> config = model_overrides(4, 20);
  const std::vector<std::string> pp2tp2dp2 = {"parallel.pp=2", "parallel.tp=2", "optim.zero=true"};
  const RunOutput whole = train_on(1, config, (tmp / "whole").string());
  train_on(8, with(config, pp2tp2dp2), (tmp / "to_one").string(), 10);
  const RunOutput to_one = train_on(1, config, (tmp / "to_one").string());
  train_on(8, with(config, pp2tp2dp2), (tmp / "to_pp4").string(), 10);
  const RunOutput to_pp4 = train_on(4, with(config, {"parallel.pp=4"}), (tmp / "to_pp4").string());
  if (MpiCommunicator::world()->rank() == 0) {
    expect_close(whole, to_one, "pp2 tp2 dp2 zero -> 1 rank");
    expect_close(whole, to_pp4, "pp2 tp2 dp2 zero -> pp4");
    if (!::testing::Test::HasFailure()) fs::remove_all(tmp.parent_path());
  }
}

}  // namespace
}  // namespace moe
