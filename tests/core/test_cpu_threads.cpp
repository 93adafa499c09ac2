// The CPU backend's ways of splitting work add no dependence on the thread count (core/backend/cpu/
// parallel_kernels.h): GEMMs that OpenBLAS would thread (reductions longer than its K block, sides that its
// threads split off the micro-kernel's tiles), and the ops whose work is split among threads in more than one
// way (the grouped GEMM: large groups on all threads, the rest one per thread; attention: heads concurrently,
// or one head at a time with its rows split) computed at 1, 2, 3 and 4 threads, on shapes that take each
// path, and compared bit for bit with 1 thread.
#include <gtest/gtest.h>
#include <omp.h>

#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/backend/backend.h"
#include "core/backend/cpu/parallel_kernels.h"
#include "core/backend/cpu/thread_policy.h"

namespace moe {
namespace {

template <typename T = float>
std::vector<T> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<T> normal(T(0), T(1));
  std::vector<T> v(n);
  for (T& x : v) x = normal(rng);
  return v;
}

// compute(backend) at each thread count, bit for bit against 1 thread.
template <typename T = float>
void expect_same_bits_at_any_thread_count(
    const std::string& what, const std::type_identity_t<std::function<std::vector<T>(Backend&)>>& compute) {
  const std::vector<T> one = compute(*make_cpu_backend(1));
  for (int threads : {2, 3, 4}) {
    const std::vector<T> got = compute(*make_cpu_backend(threads));
    ASSERT_EQ(got.size(), one.size()) << what;
    EXPECT_EQ(0, std::memcmp(got.data(), one.data(), sizeof(T) * one.size()))
        << what << ": " << threads << " threads differ from 1";
  }
}

// C = 0.5 op(A) op(B) + 0.25 C in every transpose combination, at each thread count.
template <typename T>
void expect_gemm_same_bits_at_any_thread_count(int64_t M, int64_t N, int64_t K) {
  const auto A = random_values<T>(size_t(M * K), 11), B = random_values<T>(size_t(K * N), 12);
  const auto C = random_values<T>(size_t(M * N), 13);
  for (int mode = 0; mode < 4; ++mode) {
    const bool ta = mode & 1, tb = mode & 2;
    const std::string what = std::string(sizeof(T) == 4 ? "sgemm " : "dgemm ") + std::to_string(M) + " x " +
                             std::to_string(N) + " x " + std::to_string(K) + (ta ? " A^T" : " A") +
                             (tb ? " B^T" : " B");
    expect_same_bits_at_any_thread_count<T>(what, [&](Backend& b) {
      std::vector<T> out = C;
      b.ops<T>().gemm({.trans_a = ta,
                       .trans_b = tb,
                       .M = M,
                       .N = N,
                       .K = K,
                       .alpha = T(0.5),
                       .A = A.data(),
                       .lda = ta ? M : K,
                       .B = B.data(),
                       .ldb = tb ? K : N,
                       .beta = T(0.25),
                       .C = out.data(),
                       .ldc = N});
      return out;
    });
  }
}

// Shapes OpenBLAS threads (M N K above 262,144), with reductions of the model's sizes well past its K block
// (GEMM_Q, 128 to 768 on x86_64): the weight gradients' K is the token rows. Sides that are not multiples of a
// micro-kernel's tile, a narrow C with a long K, a 1 x 1 one (one block, still above the threshold), and one
// below OpenBLAS's threading threshold.
const std::vector<std::array<int64_t, 3>> kGemmShapes = {{1024, 1024, 256}, {1024, 256, 1024}, {256, 1024, 1536},
                                                         {333, 77, 700},    {97, 131, 1000},   {12, 20, 4096},
                                                         {1, 1, 300000},    {40, 40, 100}};

TEST(CpuThreads, SgemmIsTheSameAtAnyThreadCount) {
  for (const auto& [M, N, K] : kGemmShapes) expect_gemm_same_bits_at_any_thread_count<float>(M, N, K);
}

TEST(CpuThreads, DgemmIsTheSameAtAnyThreadCount) {
  for (const auto& [M, N, K] : kGemmShapes) expect_gemm_same_bits_at_any_thread_count<double>(M, N, K);
}

// Expert blocks: balanced, skewed with one block larger than a thread's share, empty blocks, one group.
// The last two: groups of the model's sizes (token rows past OpenBLAS's K block in the weight-gradient form).
const std::vector<std::vector<int64_t>> kGroupings = {{0, 40, 80, 120, 160, 200, 240, 280, 320},
                                                      {0, 300, 310, 310, 330, 331, 400},
                                                      {0, 0, 0, 64},
                                                      {0, 200},
                                                      {0, 1100, 1250, 1400},
                                                      {0, 300, 600, 900, 1200, 1500, 1800, 2100, 2400}};

TEST(CpuThreads, GroupedGemmIsTheSameAtAnyThreadCount) {
  for (size_t c = 0; c < kGroupings.size(); ++c) {
    const int64_t N = c < 4 ? 48 : 256, K = c < 4 ? 40 : 128;
    const std::vector<int64_t>& off = kGroupings[c];
    const int64_t G = int64_t(off.size()) - 1, rows = off.back();
    for (int mode = 0; mode < 3; ++mode) {  // A B, A B^T, A^T B
      const bool ta = mode == 2, tb = mode == 1;
      const auto A = random_values(size_t(rows * K), 1), B = random_values(size_t(ta ? rows * N : G * K * N), 2);
      const auto C = random_values(size_t(ta ? G * K * N : rows * N), 3);
      expect_same_bits_at_any_thread_count("grouping " + std::to_string(c) + " mode " + std::to_string(mode),
                                           [&](Backend& b) {
                                             std::vector<float> out = C;
                                             b.ops<float>().grouped_gemm({.trans_a = ta,
                                                                          .trans_b = tb,
                                                                          .groups = G,
                                                                          .row_offset = off.data(),
                                                                          .N = N,
                                                                          .K = K,
                                                                          .alpha = 0.5f,
                                                                          .A = A.data(),
                                                                          .B = B.data(),
                                                                          .beta = 0.25f,
                                                                          .C = out.data()});
                                             return out;
                                           });
    }
  }
}

// Forward then backward of causal attention: out, probs, dq, dk, dv one after the other.
std::vector<float> attention_both_ways(Backend& b, int64_t B, int64_t T, int64_t H, int64_t Dh) {
  const size_t n = size_t(B * T * H * Dh);
  const auto q = random_values(n, 4), k = random_values(n, 5), v = random_values(n, 6), dout = random_values(n, 7);
  std::vector<float> result(5 * n + size_t(B * H * T * T)), scratch(size_t(T * T));
  float *out = result.data(), *dq = out + n, *dk = dq + n, *dv = dk + n, *probs = dv + n;
  Ops<float>& o = b.ops<float>();
  o.attention_forward(
      {.shape = {B, T, H, Dh}, .q = q.data(), .k = k.data(), .v = v.data(), .out = out, .probs = probs});
  o.attention_backward({.shape = {B, T, H, Dh},
                        .q = q.data(),
                        .k = k.data(),
                        .v = v.data(),
                        .probs = probs,
                        .dout = dout.data(),
                        .dq = dq,
                        .dk = dk,
                        .dv = dv,
                        .scratch = scratch.data()});
  return result;
}

// B x H heads: 1 (one head at a time at every thread count) up to 12 (concurrent from 2 threads on).
TEST(CpuThreads, AttentionIsTheSameAtAnyThreadCount) {
  for (const auto& [B, H] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 3}, {3, 4}})
    expect_same_bits_at_any_thread_count("attention B " + std::to_string(B) + " H " + std::to_string(H),
                                         [&](Backend& b) { return attention_both_ways(b, B, 37, H, 8); });
}

// The fused form (the cuDNN reference): out, stats, dq, dk, dv, with fp32 and with bf16 GEMMs.
std::vector<float> fused_attention_both_ways(Backend& b, int64_t B, int64_t T, int64_t H, int64_t Dh,
                                             GemmPrecision precision) {
  const size_t n = size_t(B * T * H * Dh);
  const auto q = random_values(n, 4), k = random_values(n, 5), v = random_values(n, 6), dout = random_values(n, 7);
  std::vector<float> result(4 * n + size_t(B * H * T));
  float *out = result.data(), *dq = out + n, *dk = dq + n, *dv = dk + n, *stats = dv + n;
  Ops<float>& o = b.ops<float>();
  o.attention_forward_fused(
      {.shape = {B, T, H, Dh, precision}, .q = q.data(), .k = k.data(), .v = v.data(), .out = out, .stats = stats});
  o.attention_backward_fused({.shape = {B, T, H, Dh, precision},
                              .q = q.data(),
                              .k = k.data(),
                              .v = v.data(),
                              .out = out,
                              .stats = stats,
                              .dout = dout.data(),
                              .dq = dq,
                              .dk = dk,
                              .dv = dv});
  return result;
}

TEST(CpuThreads, FusedAttentionIsTheSameAtAnyThreadCount) {
  for (GemmPrecision p : {GemmPrecision::Fp32, GemmPrecision::Bf16})
    for (const auto& [B, H] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 3}, {3, 4}})
      expect_same_bits_at_any_thread_count(std::string(p == GemmPrecision::Bf16 ? "bf16 " : "") + "fused attention B " +
                                               std::to_string(B) + " H " + std::to_string(H),
                                           [&](Backend& b) { return fused_attention_both_ways(b, B, 37, H, 8, p); });
}

// The routed experts' MLPs, forward then backward (ops.h expert_mlp_forward / expert_mlp_backward): ab, h, dh, dab,
// y, dx and the accumulated dw13, dw2 one after the other. `fused`: the backend's own (the CPU backend runs each
// expert's whole sequence at once, on one thread or all); otherwise Ops' default, op after op.
template <typename T>
std::vector<T> expert_mlps_both_ways(Backend& be, const std::vector<int64_t>& off, int64_t D, int64_t F, bool fused,
                                     GemmPrecision precision) {
  const int64_t G = int64_t(off.size()) - 1, R = off.back();
  const auto w13 = random_values<T>(size_t(G * D * 2 * F), 21), w2 = random_values<T>(size_t(G * F * D), 23);
  const auto x = random_values<T>(size_t(R * D), 24), dy = random_values<T>(size_t(R * D), 25);
  const auto dw = random_values<T>(size_t(3 * G * D * F), 26);
  std::vector<T> out(size_t(6 * R * F + 2 * R * D), T(0));
  out.insert(out.end(), dw.begin(), dw.end());
  T *ab = out.data(), *h = ab + 2 * R * F, *dh = h + R * F, *dab = dh + R * F;
  T *y = dab + 2 * R * F, *dx = y + R * D, *dw13 = dx + R * D;
  const typename Ops<T>::ExpertMlp e{G, off.data(), D, F, w13.data(), w2.data(), dw13, dw13 + 2 * G * D * F, precision};
  Ops<T>& o = be.ops<T>();
  if (fused) {
    o.expert_mlp_forward(e, x.data(), ab, h, y);
    o.expert_mlp_backward(e, x.data(), ab, h, dy.data(), dh, dab, dx);
  } else {
    o.Ops<T>::expert_mlp_forward(e, x.data(), ab, h, y);
    o.Ops<T>::expert_mlp_backward(e, x.data(), ab, h, dy.data(), dh, dab, dx);
  }
  return out;
}

// Expert blocks: small ones (the small-GEMM kernels) with empty ones, at the small-GEMM limit, no rows at all, one
// block too large to share (alone on all threads, then the rest one per thread), blocks above the small-GEMM
// limit that still share the threads (OpenBLAS, one expert per thread), two small ones of unequal size (they
// share), and one alone then a lone one (run on the calling thread, its ops on all threads).
const std::vector<std::vector<int64_t>> kExpertBlocks = {
    {0, 5, 5, 6, 19, 19, 40}, {0, 64, 64, 128, 130},       {0, 0, 0},   {0, 0, 1, 3},
    {0, 100, 103, 110},       {0, 90, 180, 270, 360, 450}, {0, 40, 64}, {0, 100, 110}};

template <typename T>
void expect_expert_mlps_as_op_after_op(GemmPrecision precision) {
  for (size_t c = 0; c < kExpertBlocks.size(); ++c) {
    const std::string what = std::string(sizeof(T) == 4 ? "float" : "double") +
                             (precision == GemmPrecision::Bf16 ? " bf16" : "") + " blocks " + std::to_string(c);
    const auto reference = [&](Backend& b) {
      return expert_mlps_both_ways<T>(b, kExpertBlocks[c], 24, 40, false, precision);
    };
    const auto fused = [&](Backend& b) {
      return expert_mlps_both_ways<T>(b, kExpertBlocks[c], 24, 40, true, precision);
    };
    const std::vector<T> want = reference(*make_cpu_backend(1));
    for (int threads : {1, 2}) {
      const std::vector<T> got = fused(*make_cpu_backend(threads));
      ASSERT_EQ(got.size(), want.size()) << what;
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), sizeof(T) * want.size()))
          << what << ": one expert at a time on " << threads << " threads differs from op after op";
    }
    expect_same_bits_at_any_thread_count<T>(what, fused);
  }
}

TEST(CpuThreads, ExpertMlpsOneAtATimeAreOpAfterOp) {
  expect_expert_mlps_as_op_after_op<float>(GemmPrecision::Fp32);
  expect_expert_mlps_as_op_after_op<float>(GemmPrecision::Bf16);
  expect_expert_mlps_as_op_after_op<double>(GemmPrecision::Fp32);
}

// Which groups run alone on all threads and which share them, at 2 threads; and where they run: a lone group on
// the calling thread outside any region (inside an inactive one its ops would open nested teams), several in one
// region, one per thread.
TEST(CpuThreads, GroupsShareTheThreadsUnlessTooLargeAndNeverNest) {
  const int threads_before = omp_get_max_threads();
  omp_set_num_threads(2);
  auto schedule = [](std::vector<int64_t> offset) {
    return cpu::schedule_groups(int64_t(offset.size()) - 1, offset.data());
  };
  const cpu::GroupSchedule small = schedule({0, 40, 64});  // both within the small-group kernels: side by side
  EXPECT_TRUE(small.alone.empty());
  EXPECT_EQ(small.shared, (std::vector<int64_t>{0, 1}));
  const cpu::GroupSchedule large = schedule({0, 100, 100, 110});  // 100 rows of 110: alone, then the 10 (no empty one)
  EXPECT_EQ(large.alone, (std::vector<int64_t>{0}));
  EXPECT_EQ(large.shared, (std::vector<int64_t>{2}));
  const cpu::GroupSchedule even = schedule({0, 90, 180, 270});  // none above an even share
  EXPECT_TRUE(even.alone.empty());
  EXPECT_EQ(even.shared.size(), 3u);

  std::vector<int> levels(8, -1);
  cpu::run_groups({3}, [&](int64_t g) { levels[size_t(g)] = omp_get_level(); });
  EXPECT_EQ(levels[3], 0) << "a lone group runs outside any parallel region";
  cpu::run_groups({1, 2}, [&](int64_t g) { levels[size_t(g)] = omp_get_level(); });
  EXPECT_EQ(levels[1], 1);
  EXPECT_EQ(levels[2], 1);
  omp_set_num_threads(threads_before);
}

// The governor (core/backend/cpu/thread_policy.h): the whole cores this process used or nobody used, within
// [1, max], after the same decision twice in a row.
TEST(ThreadGovernor, FollowsTheCoresOtherProcessesLeave) {
  cpu::ThreadGovernor g(2);
  EXPECT_EQ(g.decide(2, {2.0, 0.0}), 2);   // quiet: both cores ours
  EXPECT_EQ(g.decide(2, {1.3, 0.0}), 2);   // another process took 0.7 of a core: noted once
  EXPECT_EQ(g.decide(2, {1.35, 0.0}), 1);  // and again: down to 1
  EXPECT_EQ(g.decide(1, {1.0, 0.0}), 1);   // one core each
  EXPECT_EQ(g.decide(1, {1.0, 0.95}), 1);  // the other process left: noted once
  EXPECT_EQ(g.decide(1, {0.9, 0.0}), 1);   // a busy moment in between resets it
  EXPECT_EQ(g.decide(1, {1.0, 0.9}), 1);
  EXPECT_EQ(g.decide(1, {1.0, 0.8}), 2);  // twice in a row: back to 2
  EXPECT_EQ(g.decide(2, {1.9, 0.1}), 2);
  // Never above max, never below 1.
  cpu::ThreadGovernor one(1);
  EXPECT_EQ(one.decide(1, {1.0, 7.0}), 1);
  EXPECT_EQ(one.decide(1, {1.0, 7.0}), 1);
  cpu::ThreadGovernor four(4);
  EXPECT_EQ(four.decide(4, {0.2, 0.0}), 4);
  EXPECT_EQ(four.decide(4, {0.2, 0.0}), 1);
}

// The meter reads this process's CPU time and its cores' idle time: a busy interval counts about one core ours.
TEST(CoreUseMeter, CountsThisProcessCpuTime) {
  cpu::CoreUseMeter meter;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  volatile double sink = 0;
  while (std::chrono::steady_clock::now() < until) sink = sink + 1.0;
  const cpu::CoreUse use = meter.sample();
  EXPECT_GT(use.ours, 0.3);  // one spinning thread; other processes may take some of its core
  EXPECT_LT(use.ours, 1.5);
  EXPECT_GE(use.idle, 0.0);
  EXPECT_GE(cpu::usable_cores(), 1);
}

}  // namespace
}  // namespace moe
