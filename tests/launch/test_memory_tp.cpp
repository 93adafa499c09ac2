// The memory estimate (launch/memory.h) against what a tensor-parallel trainer really allocates: at tp 2,
// with and without sequence parallelism, dense and MoE models, selective and full recompute, each rank's
// parameters, gradients, optimizer state, activations and scratch are exactly the estimate's. Runs under
// mpirun -np 2 (the world is the tp group).
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace moe
