// The memory estimate (launch/config/memory.h) against what a parallel trainer really allocates: at tp 2 (with and
// without sequence parallelism, dense and MoE models, selective and full recompute, expert_tp), at ep 2 (with and
// without ZeRO) and on pipeline stages, each rank's parameters, gradients, optimizer state, activations and scratch
// are exactly the estimate's. Runs under mpirun -np 2 (the world is the tp group, the pp group, or the dp group of
// an ep 2 layout).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "memory_harness.h"
#include "parallel/mpi_communicator.h"

namespace moe {
namespace {
using namespace test_support;

TEST(MemoryEstimate, TensorParallelTrainerAllocatesExactlyTheEstimate) {
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"parallel.sequence_parallel=false"},
      {"train.recompute=selective"},
      {"moe.num_experts=4", "moe.every=2", "moe.shared_experts=1", "train.recompute=full"},
      {"moe.num_experts=4", "parallel.sequence_parallel=false", "optim.zero=true"},
      {"moe.num_experts=4", "moe.every=2", "moe.shared_experts=1", "parallel.expert_tp=2"},
      {"moe.num_experts=4", "parallel.expert_tp=2", "parallel.sequence_parallel=false", "moe.overflow=dense",
       "moe.fallback_hidden=16"},
      // bf16: the attention keeps its input held (without sequence parallelism), the MLPs and the head hold theirs
      {"train.precision=bf16"},
      {"train.precision=bf16", "parallel.sequence_parallel=false"},
      {"train.precision=bf16", "moe.num_experts=4", "moe.every=2", "moe.shared_experts=1",
       "parallel.sequence_parallel=false"},
  };
  for (const std::vector<std::string>& extra : cases) {
    std::vector<std::string> keys = {"parallel.tp=2"};
    keys.insert(keys.end(), extra.begin(), extra.end());
    const Config config = small_config(keys);
    SCOPED_TRACE(config.resolved.at("parallel").dump() + " " + config.resolved.at("train").at("recompute").dump());
    const MemoryEstimate e = estimate_memory(config, 2, 1, 1);
    const Measured m = measure(config, MpiCommunicator::world());
    EXPECT_EQ(e.parameters, 4 * m.parameters);
    EXPECT_EQ(allocated_at_construction(e), m.constructed);
  }
  // Sequence parallelism keeps less: the residual stream's rows are split, nothing gathered is kept.
  const MemoryEstimate sp = estimate_memory(small_config({"parallel.tp=2"}), 2, 1, 1);
  const MemoryEstimate whole =
      estimate_memory(small_config({"parallel.tp=2", "parallel.sequence_parallel=false"}), 2, 1, 1);
  EXPECT_LT(sp.activations, whole.activations);
}

// Expert parallelism (the world the dp and ep group, parallel.ep = 2): each rank holds half the experts, and with
// ZeRO half of every bucket's moments; what the model and the optimizer allocate is exactly the estimate's.
TEST(MemoryEstimate, ExpertParallelTrainerAllocatesExactlyTheEstimate) {
  const std::vector<std::vector<std::string>> cases = {
      {"moe.num_experts=4"},
      {"moe.num_experts=4", "moe.every=2", "moe.shared_experts=1", "train.recompute=selective"},
      {"moe.num_experts=8", "moe.overflow=dense", "moe.fallback_hidden=16", "train.recompute=full"},
      {"moe.num_experts=4", "optim.zero=true"},
  };
  for (const std::vector<std::string>& extra : cases) {
    std::vector<std::string> keys = {"parallel.ep=2"};
    keys.insert(keys.end(), extra.begin(), extra.end());
    Config config = small_config(keys);
    config.parallel.dp = 2;
    SCOPED_TRACE(testing::PrintToString(extra));
    const MemoryEstimate e = estimate_memory(config, 1, 2, 2);
    const Measured m = measure(config, MpiCommunicator::world());
    EXPECT_EQ(e.parameters, 4 * m.parameters);
    EXPECT_EQ(allocated_at_construction(e), m.constructed);
  }
}

// Pipeline stages (parallel.pp = 2, the world the pp group): each stage allocates exactly the estimate of its
// part (its layers, the embedding or the head, the 1F1B slots it keeps and the executor's buffers), and the
// largest stage's estimate is what every rank is checked against.
TEST(MemoryEstimate, PipelineStageAllocatesExactlyItsEstimate) {
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"moe.num_experts=4", "moe.every=2", "train.recompute=selective"},
      {"model.layers=3", "parallel.pp_layers=[1, 2]", "train.global_batch=16", "train.recompute=full",
       "train.recompute_layers=2"},
  };
  auto world = MpiCommunicator::world();
  const int64_t stage = world->rank();
  for (const std::vector<std::string>& extra : cases) {
    std::vector<std::string> keys = {"parallel.pp=2"};
    keys.insert(keys.end(), extra.begin(), extra.end());
    const Config config = small_config(keys);
    SCOPED_TRACE(testing::PrintToString(extra) + " stage " + std::to_string(stage));
    const int64_t micro_batches = config.train.global_batch / config.train.micro_batch;
    const StagePart part = pipeline_stage_part(config, stage, micro_batches);
    EXPECT_EQ(part.slots, std::min<int64_t>(2 - stage, micro_batches));
    const MemoryEstimate e = estimate_memory(config, 1, 1, 1, part);
    const Measured m = measure(config, MpiCommunicator::world());
    EXPECT_EQ(e.parameters, 4 * m.parameters);
    EXPECT_EQ(allocated_at_construction(e), m.constructed);
    const StageEstimate largest = largest_stage_estimate(config, 1, 1, 1);
    EXPECT_GE(largest.memory.total(), e.total());
  }
}

// Interleaved stages (parallel.vpp = 2 over pp = 2, 4 layers: rank 0 holds layers 0 and 2, rank 1 layers 1 and 3):
// each rank's chunks allocate exactly the sum of their parts' estimates (each chunk's layers, slots, scratch and
// executor buffers; the parameters, gradients and moments in the rank's one shared table), and that sum is the
// largest stage's estimate or less.
TEST(MemoryEstimate, InterleavedChunksAllocateExactlyTheSumOfTheirEstimates) {
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"moe.num_experts=4", "moe.every=2", "train.recompute=selective", "train.global_batch=16"},
  };
  auto world = MpiCommunicator::world();
  const int64_t stage = world->rank();
  for (const std::vector<std::string>& extra : cases) {
    std::vector<std::string> keys = {"parallel.pp=2", "parallel.vpp=2", "parallel.pp_schedule=interleaved_1f1b",
                                     "model.layers=4"};
    keys.insert(keys.end(), extra.begin(), extra.end());
    const Config config = small_config(keys);
    SCOPED_TRACE(testing::PrintToString(extra) + " stage " + std::to_string(stage));
    const int64_t micro_batches = config.train.global_batch / config.train.micro_batch;
    const std::vector<StagePart> parts = pipeline_chunk_parts(config, stage, micro_batches);
    ASSERT_EQ(parts.size(), 2u);
    EXPECT_EQ(parts[0].first, stage);
    EXPECT_EQ(parts[1].first, 2 + stage);
    EXPECT_TRUE(parts[0].embedding == (stage == 0) && !parts[1].embedding);
    EXPECT_TRUE(parts[1].head == (stage == 1) && !parts[0].head);
    int64_t parameters = 0, constructed = 0, total = 0;
    for (const StagePart& part : parts) {
      const MemoryEstimate e = estimate_memory(config, 1, 1, 1, part);
      parameters += e.parameters, constructed += allocated_at_construction(e), total += e.total();
    }
    const Measured m = measure(config, MpiCommunicator::world());
    EXPECT_EQ(parameters, 4 * m.parameters);
    EXPECT_EQ(constructed, m.constructed);
    EXPECT_GE(largest_stage_estimate(config, 1, 1, 1).memory.total(), total);
  }
}

}  // namespace
}  // namespace moe
