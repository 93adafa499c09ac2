// A run does not depend on the thread count: a model trained for a few steps at 1 thread per rank and at 2 and 3
// (and 4 for the wide one), metrics and final parameters compared bit for bit. Two small shapes take the two
// ways the CPU backend splits work (core/backend/cpu/parallel_kernels.h): many heads and experts (heads
// concurrently, experts one per thread) and few (one head at a time with its rows split, experts too large to
// share on all threads). A wide one has GEMMs OpenBLAS would thread, with reductions well past its K block
// (d_model 256, ffn 1024, 1024 token rows, so the weight gradients reduce over 1024 rows): each GEMM is cut
// into the same single-threaded calls at any thread count.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "layout_runs.h"

namespace moe {
namespace {
using namespace test_support;
namespace fs = std::filesystem;

std::vector<std::string> overrides(int threads, const std::vector<std::string>& shape) {
  // 32 tokens per micro-batch, width 24, hidden 32: the largest GEMM is the head's, 32 x 256 x 24.
  std::vector<std::string> o = {"train.steps=6",           "train.log_every=1",
                                "train.eval_every=3",      "train.eval_sequences=2",
                                "model.layers=2",          "model.d_model=24",
                                "model.ffn_hidden=32",     "moe.expert_hidden=32",
                                "moe.router.noise=gumbel", "train.threads=" + std::to_string(threads)};
  o.insert(o.end(), shape.begin(), shape.end());
  return o;
}

void expect_same_at_any_thread_count(const std::string& name, const std::vector<std::string>& shape,
                                     const std::vector<const char*>& thread_counts = {"2", "3"}) {
  const fs::path root = shared_temp_root("moe_threads_", name);
  const RunOutput one = train_on(1, overrides(1, shape), (root / "1").string());
  for (const char* threads : thread_counts) {
    const RunOutput other = train_on(1, overrides(std::stoi(threads), shape), (root / threads).string());
    expect_bitwise_equal(one, other, name + " at " + threads + " threads");
  }
  fs::remove_all(root.parent_path());
}

// 4 sequences of 8 x 4 heads per micro-batch, 8 experts top-2: concurrent heads, experts one per thread.
TEST(ThreadCounts, ManyHeadsAndExpertsAreTheSameAtAnyThreadCount) {
  expect_same_at_any_thread_count("many", {"train.seq_len=8", "train.micro_batch=4", "model.heads=4"});
}

// 1 sequence of 32 x 1 head per micro-batch, 2 experts top-1 dropless: one head at a time, experts on all threads.
TEST(ThreadCounts, FewHeadsAndExpertsAreTheSameAtAnyThreadCount) {
  expect_same_at_any_thread_count("few", {"train.seq_len=32", "train.micro_batch=1", "model.heads=1",
                                          "moe.num_experts=2", "moe.top_k=1", "moe.capacity_factor=0"});
}

// 4 sequences of 256 x 4 heads of width 256 per step (1024 token rows), dense ffn 1024 and 4 experts of 512
// top-2 (about 512 rows each): 3 steps, evaluated at the last.
TEST(ThreadCounts, WideModelIsTheSameAtAnyThreadCount) {
  expect_same_at_any_thread_count(
      "wide",
      {"train.steps=3", "train.eval_every=3", "train.seq_len=256", "train.micro_batch=4", "train.global_batch=4",
       "model.d_model=256", "model.heads=4", "model.ffn_hidden=1024", "moe.num_experts=4", "moe.expert_hidden=512"},
      {"2", "3", "4"});
}

}  // namespace
}  // namespace moe
