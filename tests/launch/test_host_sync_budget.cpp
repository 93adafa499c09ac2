// The budget of host synchronisations (docs/gpu.md "Host synchronisations"): configs/tiny_moe.json trained at
// ep 1, ep 2 (dp 2) and tp 2 x pp 2, each step's `host_syncs` in metrics.jsonl (rank 0's waits for its backend)
// held to the figure derived below, so that a change that adds a wait fails here; and `d2h_bytes`, the bytes those
// waits read, held to what the layer's plan on the backend reads, so that the router's (N, K) selections, scores
// and gate weights coming back to the host fails here too. Runs under mpirun -np 4.
//
// tiny_moe: 4 layers, every one MoE (8 experts, top-2), global batch 16 of micro-batches of 4, so 4 micro-batches
// per step at dp 1 and 2 per rank at dp 2. The waits of one step on rank 0, by where they are:
//
//   routing   one per MoE layer of the rank and micro-batch, none for routing itself: the layer plans on the
//             backend (Ops::capacity_keep, reroute_overflow, permute_by_expert, permuted_rows, fallback_rows) and
//             reads the expert offsets (the grouped GEMM's row counts, which cuBLAS takes on the host, and at
//             ep > 1 the all-to-all's split sizes) with f and the losses' sums: (E + 1) 8 + E 4 + (E + 2) 8 = 184
//             bytes for E = 8; with overflow rerouted or computed densely, the plan's counts as well (8 bytes for
//             the rerouted slots, 16 for the fallback's tokens and slots). The host plan read the router's
//             preference rows (N, K, or N, E where overflow reroutes), selections, selected scores and gate
//             weights as well: 16 384 more for N = 512 tokens, K = 2, and 28 672 where it rerouted. A routing group
//             split over the tp ranks plans on the backend too (the whole group's capacity, reroute and
//             permutation, then this rank's part of it: Ops::restrict_permutation; the fallback's rows of this
//             rank's tokens), and reads the whole group's offsets besides its own for the statistics:
//             184 + (E + 1) 8 = 256 bytes where the host plan read 16 512 for its 1024 tokens.
//   loss      one per step on the rank holding the head: each micro-batch's per-token losses are staged on the
//             backend (core/loss_staging.h) and read together at the step's end (launch/train/train_step.cpp,
//             parallel/pipeline.cpp), the same bytes. It was one per micro-batch: micro-batches - 1 more.
//   pipeline  none: a stage's send copies its activation (or gradient) into the slot's buffer and hands it to the
//             data plane without waiting (parallel/pipeline.cpp), which takes backend memory after the work
//             queued before it (communicator.h): NCCL's stream follows the compute stream, the CPU backend's
//             copy has run when it returns, and the memory-checking backend's plane check runs its queue first
//             (no wait on a GPU, none counted). It was one host wait per send: 4 per step on each stage here.
//   norm      one: every parameter segment's sum of squares is written to backend memory
//             (Ops::sum_squares_into) and all of them read back in one download (optim/adamw.cpp sum_squares of
//             several segment lists; per-expert clipping the same way). It was one wait per segment: 37 at
//             ep 1, 35 at ep 2, 18 on a tp 2 x pp 2 rank of stage 0.
//
//   ep 1        4 layers x 4 micro-batches + 1 loss read         + 1 norm = 18 (21 with a read per micro-batch)
//   ep 2, dp 2  4 layers x 2 micro-batches + 1 loss read         + 1 norm = 10 (11)
//   tp 2 x pp 2 2 layers x 4 micro-batches                       + 1 norm =  9 (13 with a wait per send) (rank 0:
//               stage 0, no head; the head's ranks, stage 1: 2 x 4 + 1 loss read + 1 norm = 10; 22 while the
//               vocabulary-parallel cross-entropy reduced its row maxima and sums through the host, 3 waits per
//               micro-batch, and 29 with a wait per send and a loss read per micro-batch)
//   tp 2, dp 2  4 layers x 2 micro-batches + 1 loss read         + 1 norm = 10 (16 with the head's 3 per
//               micro-batch) (rank 0 holds the vocabulary-parallel head)
//
// A change that removes waits lowers these figures (and docs/gpu.md's table) with it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "layout_runs.h"

namespace moe {
namespace {
using namespace test_support;
namespace fs = std::filesystem;

struct Layout {
  std::string name;
  int ranks;
  std::vector<std::string> overrides;
  int64_t budget;  // host_syncs per step on rank 0, derived above
  int64_t bytes;   // d2h_bytes per step on rank 0, measured (the routing's share derived above)
};

void expect_within_budget(const Layout& layout) {
  const fs::path root = shared_temp_root("moe_sync_budget_", layout.name);
  std::vector<std::string> o = {"train.steps=3", "train.log_every=1", "train.eval_every=1000"};
  o.insert(o.end(), layout.overrides.begin(), layout.overrides.end());
  train_on(layout.ranks, o, root.string());
  if (MpiCommunicator::world()->rank() != 0) return;
  // metrics.jsonl itself: train_on's lines leave out the timing fields, host_syncs among them.
  std::ifstream in(root / "metrics.jsonl");
  int64_t steps = 0;
  for (std::string text; std::getline(in, text);) {
    const json line = json::parse(text);
    if (!line.contains("lm_loss")) continue;
    ++steps;
    ASSERT_TRUE(line.contains("host_syncs")) << line.dump();
    const int64_t syncs = line.at("host_syncs").get<int64_t>();
    EXPECT_LE(syncs, layout.budget) << layout.name << " step " << line.at("step") << " waits more than its budget";
    EXPECT_GE(syncs, 1) << layout.name << " step " << line.at("step") << " counted no wait";
    EXPECT_LE(line.at("d2h_bytes").get<int64_t>(), layout.bytes)
        << layout.name << " step " << line.at("step") << " reads back more than its plan on the backend";
  }
  EXPECT_EQ(steps, 3) << layout.name;
  fs::remove_all(root.parent_path());
}

// Bytes: ep 1 reads 16 x 184 for routing, 4 x 2048 per-token losses and the norm's sums; ep 2 half the routing and
// losses. tp 2 x pp 2 splits each routing group over the tp ranks: 8 x 256 for routing and the norm's sums (it
// read 132 112 when the host planned the split group and cut this rank's part out, restrict_plan).
TEST(HostSyncBudget, Ep1) { expect_within_budget({"ep1", 1, {}, 18, 11432}); }

TEST(HostSyncBudget, Ep2) { expect_within_budget({"ep2", 2, {"parallel.ep=2"}, 10, 5848}); }

// Overflow rerouted, computed densely, and both (the cascade) at ep 1, with a capacity that overflows: the same 18
// waits, each layer's reading its plan's counts beside the offsets (8, 16 and 24 bytes more, 16 layer passes a
// step), and the fallback's 12 parameter segments 8 bytes each in the norm's read. The host plan read 469 032,
// 272 520 and 469 128 bytes a step.
TEST(HostSyncBudget, OverflowLevelsAtEp1) {
  const std::string cf = "moe.capacity_factor=1.0";
  expect_within_budget({"reroute", 1, {"moe.overflow=reroute", cf}, 18, 11432 + 16 * 8});
  expect_within_budget({"dense", 1, {"moe.overflow=dense", cf}, 18, 11432 + 16 * 16 + 96});
  expect_within_budget({"cascade", 1, {R"(moe.overflow=["reroute", "dense"])", cf}, 18, 11432 + 16 * 24 + 96});
}

// tp 2 x dp 2: rank 0 holds the vocabulary-parallel head, whose row maxima and sums are reduced over the tp group in
// the backend's memory (parallel/vocab_parallel.cpp, no wait; it was 3 waits per micro-batch, 16 a step, reading
// 31 016 bytes): 4 layers x 2 micro-batches + 1 loss read + 1 norm.
TEST(HostSyncBudget, Tp2Dp2WithTheHead) { expect_within_budget({"tp2_dp2", 4, {"parallel.tp=2"}, 10, 6440}); }

TEST(HostSyncBudget, Tp2Pp2) { expect_within_budget({"tp2_pp2", 4, {"parallel.tp=2", "parallel.pp=2"}, 9, 2192}); }

// The cascade over split routing groups: the same 9 waits, each of stage 0's 2 layers x 4 micro-batches reading its
// plan's counts (24 bytes), and the fallback's 6 parameter segments of stage 0 in the norm's read (48). The host plan
// (before the losses and sends lost their waits) took 13 waits and read 230 464 bytes.
TEST(HostSyncBudget, Tp2Pp2Cascade) {
  expect_within_budget(
      {"tp2_pp2_cascade",
       4,
       {"parallel.tp=2", "parallel.pp=2", R"(moe.overflow=["reroute", "dense"])", "moe.capacity_factor=1.0"},
       9,
       2192 + 8 * 24 + 48});
}

}  // namespace
}  // namespace moe
