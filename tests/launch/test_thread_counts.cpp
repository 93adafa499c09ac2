// The CPU backend's ways of splitting work among threads add no dependence on the thread count: a small model
// trained for 6 steps at 1, 2 and 3 threads per rank, metrics and final parameters compared bit for bit. Two
// shapes take the two ways the CPU backend splits work (core/backend/cpu/parallel_kernels.h): many heads and
// experts (heads concurrently, experts one per thread) and few (one head at a time with its rows split, experts
// too large to share on all threads). The model is small enough that every GEMM stays under OpenBLAS's
// threading threshold (M N K <= 262,144): OpenBLAS's own threaded driver can round reductions longer than its K
// block differently from its serial one (docs/design.md "Conventions"), which this test does not measure.
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

void expect_same_at_any_thread_count(const std::string& name, const std::vector<std::string>& shape) {
  const fs::path root = shared_temp_root("moe_threads_", name);
  const RunOutput one = train_on(1, overrides(1, shape), (root / "1").string());
  for (const char* threads : {"2", "3"}) {
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

}  // namespace
}  // namespace moe
