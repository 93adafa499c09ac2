// The CUDA backend's host-side logic, tested without a GPU: the caching allocator's bookkeeping over a fake
// source of memory, the grouped GEMM's argument plan against the row-major problems it must compute, and the
// kernels' launch configurations. And what a build or machine without CUDA says when asked for the backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <vector>

#include "core/backend/cuda/caching_allocator.h"
#include "core/backend/cuda/grouped_gemm_plan.h"
#include "core/backend/cuda/host_wait.h"
#include "core/backend/cuda/launch_config.h"
#include "core/backend/cuda/sum_segments_plan.h"
#include "core/backend/cuda_backend.h"
#include "core/error.h"

namespace moe {
namespace {

// Host memory standing in for the device's, with a limit, counting what the allocator asks for.
struct FakeSource {
  size_t limit = size_t(64) << 20, held = 0;
  int64_t allocations = 0, releases = 0;
  std::map<void*, size_t> live;
  CachingAllocator::Source source() {
    return {[this](size_t bytes) -> void* {
              if (held + bytes > limit) return nullptr;
              void* p = std::malloc(bytes);
              live[p] = bytes, held += bytes, ++allocations;
              return p;
            },
            [this](void* p, size_t bytes) {
              EXPECT_EQ(live.at(p), bytes);
              live.erase(p), held -= bytes, ++releases;
              std::free(p);
            }};
  }
};

TEST(CachingAllocator, SizeClassesBoundTheWaste) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size((1 << 20) - 1), size_t(1) << 20);
  EXPECT_EQ(CachingAllocator::round_size((1 << 20) + 1), size_t(2) << 20);
  EXPECT_EQ(CachingAllocator::round_size((5 << 20) + 7), size_t(6) << 20);
}

TEST(CachingAllocator, ReusesFreedBlocksOfTheSameClassAndCountsWhatIsAskedFor) {
  FakeSource fake;
  {
    CachingAllocator a(fake.source());
    void* x = a.allocate(1000);
    void* y = a.allocate(3 << 20);
    EXPECT_EQ(a.stats().in_use, 1000 + (3 << 20));
    EXPECT_EQ(a.stats().reserved, 1024 + (4 << 20));
    a.free(x);
    EXPECT_EQ(a.stats().in_use, 3 << 20);
    EXPECT_EQ(a.stats().cached, 1024);
    void* z = a.allocate(900);  // the same class: the cached block, no new source allocation
    EXPECT_EQ(z, x);
    EXPECT_EQ(a.stats().cache_hits, 1);
    EXPECT_EQ(fake.allocations, 2);
    EXPECT_EQ(a.stats().peak_in_use, 1000 + (3 << 20));
    a.free(y), a.free(z);
    EXPECT_EQ(a.stats().in_use, 0);
    EXPECT_EQ(fake.releases, 0);  // kept in the cache
    EXPECT_EQ(a.allocate(0), nullptr);
    a.free(nullptr);
  }
  EXPECT_EQ(fake.releases, 2);  // the cache back to the source on destruction
  EXPECT_TRUE(fake.live.empty());
}

TEST(CachingAllocator, EmptiesItsCacheAndRetriesBeforeFailing) {
  FakeSource fake;
  fake.limit = size_t(8) << 20;
  CachingAllocator a(fake.source());
  void* x = a.allocate(6 << 20);
  a.free(x);                      // 6 MiB cached
  void* y = a.allocate(4 << 20);  // another class: does not fit beside the cache, fits once it is released
  EXPECT_NE(y, nullptr);
  EXPECT_EQ(fake.releases, 1);
  EXPECT_EQ(a.stats().cached, 0);
  try {
    a.allocate(6 << 20);
    FAIL() << "an allocation past the source's memory must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::RunFailed);
    EXPECT_NE(e.message().find("out of device memory"), std::string::npos) << e.message();
  }
  EXPECT_THROW(a.free(reinterpret_cast<void*>(0x1234)), Error);  // not one of its blocks
  a.free(y);
}

// A block freed while a communicator's stream may still use it (side work outstanding) is not handed out again
// until that work has ended; blocks freed before the side work began, or after it ended, are reused at once.
TEST(CachingAllocator, ParksBlocksFreedWhileSideWorkIsOutstanding) {
  FakeSource fake;
  CachingAllocator a(fake.source());
  void* before = a.allocate(1000);
  a.free(before);  // no side work: cached at once
  const uint64_t send = a.begin_side_work();
  void* buffer = a.allocate(1000);
  EXPECT_EQ(buffer, before);
  a.free(buffer);  // freed while the send may still read it
  EXPECT_EQ(a.stats().parked, 1024);
  EXPECT_EQ(a.stats().cached, 0);
  void* other = a.allocate(1000);  // must not be the parked block
  EXPECT_NE(other, buffer);
  EXPECT_EQ(fake.allocations, 2);
  const uint64_t later = a.begin_side_work();  // began after the free: does not hold the parked block
  a.end_side_work(send);
  EXPECT_EQ(a.stats().parked, 0);
  EXPECT_EQ(a.allocate(1000), buffer);  // reusable now
  a.free(other);                        // `later` is outstanding: parked again
  EXPECT_EQ(a.stats().parked, 1024);
  a.end_side_work(later);
  EXPECT_EQ(a.stats().parked, 0);
  EXPECT_EQ(a.stats().cached, 1024);
  EXPECT_THROW(a.end_side_work(later), Error);  // a ticket ends once
  a.free(buffer);
}

// Overlapping side work: a block waits for every piece outstanding at its free, in whatever order they end.
TEST(CachingAllocator, AParkedBlockWaitsForAllSideWorkOutstandingAtItsFree) {
  FakeSource fake;
  CachingAllocator a(fake.source());
  const uint64_t first = a.begin_side_work(), second = a.begin_side_work();
  void* x = a.allocate(600);
  a.free(x);
  a.end_side_work(second);
  EXPECT_EQ(a.stats().parked, 1024);  // `first` still runs
  EXPECT_NE(a.allocate(600), x);
  a.end_side_work(first);
  EXPECT_EQ(a.stats().parked, 0);
  EXPECT_EQ(a.allocate(600), x);
}

// Out of memory with communication in flight: the cache is kept (giving it back would wait for the whole device),
// the allocation fails with a message that says why; once the side work ends the cache is emptied and retried.
// Parked blocks are given back on destruction like cached ones.
TEST(CachingAllocator, KeepsItsCacheWhenOutOfMemoryDuringSideWork) {
  FakeSource fake;
  fake.limit = size_t(8) << 20;
  {
    CachingAllocator a(fake.source());
    void* x = a.allocate(6 << 20);
    a.free(x);  // 6 MiB cached
    const uint64_t ticket = a.begin_side_work();
    try {
      a.allocate(4 << 20);
      FAIL() << "the cache must not be emptied while side work is outstanding";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::RunFailed);
      EXPECT_NE(e.message().find("communication in flight"), std::string::npos) << e.message();
    }
    EXPECT_EQ(fake.releases, 0);
    void* small = a.allocate(1000);
    a.free(small);  // parked
    a.end_side_work(ticket);
    void* y = a.allocate(4 << 20);  // now the cache goes back and the retry fits
    EXPECT_NE(y, nullptr);
    EXPECT_GE(fake.releases, 1);
    a.begin_side_work();  // left outstanding: destruction gives everything back regardless
    a.free(y);
    EXPECT_EQ(a.stats().parked, 4 << 20);
  }
  EXPECT_TRUE(fake.live.empty());
}

// A host wait polls until the work is done, running the check between polls; a check that throws (NCCL's
// asynchronous error found) ends the wait with its error instead of leaving it blocked.
TEST(HostWait, ChecksBetweenPollsAndEndsWhenACheckThrows) {
  int polls = 0, checks = 0;
  cuda::wait_polling([&] { return ++polls > 5; }, [&] { ++checks; });
  EXPECT_EQ(polls, 6);
  EXPECT_EQ(checks, 5);
  polls = 0, checks = 0;
  cuda::wait_polling([&] { return ++polls > 0; }, [&] { ++checks; });
  EXPECT_EQ(checks, 0);  // done at once: nothing checked
  polls = 0, checks = 0;
  auto never_done = [&] {
    ++polls;
    return false;
  };
  auto peer_died = [&] {
    if (++checks == 3) MOE_RUN_FAILED("communicator 'dp' failed while its work ran");
  };
  try {
    cuda::wait_polling(never_done, peer_died);
    FAIL() << "a wait whose check throws must end";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("'dp'"), std::string::npos) << e.message();
  }
  EXPECT_EQ(polls, 3);  // no poll after the check gave up
}

// Runs a plan on the host as column-major GEMMs (what cuBLAS computes) and compares with the row-major
// definition of grouped_gemm (core/backend/ops.h).
std::vector<double> run_plan_column_major(const GroupedGemmPlan& p, const std::vector<double>& A,
                                          const std::vector<double>& B, std::vector<double> C) {
  for (size_t i = 0; i < p.problems(); ++i) {
    const double* X = B.data() + p.first_offset[i];
    const double* Y = A.data() + p.second_offset[i];
    double* Z = C.data() + p.c_offset[i];
    auto x = [&](int r, int c) { return p.trans_first[i] ? X[c + r * p.ld_first[i]] : X[r + c * p.ld_first[i]]; };
    auto y = [&](int r, int c) { return p.trans_second[i] ? Y[c + r * p.ld_second[i]] : Y[r + c * p.ld_second[i]]; };
    for (int r = 0; r < p.m[i]; ++r)
      for (int c = 0; c < p.n[i]; ++c) {
        double s = 0;
        for (int k = 0; k < p.k[i]; ++k) s += x(r, k) * y(k, c);
        Z[r + c * p.ld_c[i]] = s;  // alpha 1, beta 0
      }
  }
  return C;
}

TEST(GroupedGemmPlan, ComputesTheRowMajorGroupsAsColumnMajorProblems) {
  const int64_t groups = 4, N = 3, K = 5;
  const std::vector<int64_t> offsets = {0, 2, 2, 7, 8};  // group 1 empty
  const int64_t rows = offsets.back();
  std::vector<double> A(size_t(rows * K));
  for (size_t i = 0; i < A.size(); ++i) A[i] = double(i % 7) - 3;
  for (bool trans_b : {false, true}) {  // C_g = A_g op(B_g)
    std::vector<double> B(size_t(groups * K * N));
    for (size_t i = 0; i < B.size(); ++i) B[i] = double(i % 5) * 0.5 - 1;
    const GroupedGemmPlan p = plan_grouped_gemm(false, trans_b, groups, offsets.data(), N, K);
    EXPECT_EQ(p.expert, (std::vector<int64_t>{0, 2, 3}));
    const std::vector<double> C = run_plan_column_major(p, A, B, std::vector<double>(size_t(rows * N), 0));
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r)
        for (int64_t c = 0; c < N; ++c) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k)
            s += A[r * K + k] * (trans_b ? B[g * K * N + c * K + k] : B[g * K * N + k * N + c]);
          EXPECT_EQ(C[r * N + c], s) << "trans_b " << trans_b << " group " << g << " row " << r;
        }
  }
  // The weight gradients: C_g (K, N) = A_g^T B_g with B row-blocked (rows, N).
  std::vector<double> B(size_t(rows * N));
  for (size_t i = 0; i < B.size(); ++i) B[i] = double(i % 3) - 1;
  const GroupedGemmPlan p = plan_grouped_gemm(true, false, groups, offsets.data(), N, K);
  const std::vector<double> C = run_plan_column_major(p, A, B, std::vector<double>(size_t(groups * K * N), -9));
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t c = 0; c < N; ++c) {
        double s = 0;
        for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r) s += A[r * K + k] * B[r * N + c];
        EXPECT_EQ(C[g * K * N + k * N + c], g == 1 ? -9 : s) << "group " << g;  // empty groups untouched
      }
  EXPECT_THROW(plan_grouped_gemm(true, true, groups, offsets.data(), N, K), Error);
}

TEST(LaunchConfig, ElementwiseGridsCoverAnySizeByStriding) {
  using cuda::elementwise_launch;
  EXPECT_EQ(elementwise_launch(0).blocks, 1u);
  EXPECT_EQ(elementwise_launch(1).blocks, 1u);
  EXPECT_EQ(elementwise_launch(256).blocks, 1u);
  EXPECT_EQ(elementwise_launch(257).blocks, 2u);
  EXPECT_EQ(elementwise_launch(int64_t(1) << 40).blocks, cuda::kMaxBlocks);
  EXPECT_EQ(elementwise_launch(1000).threads, cuda::kThreads);
}

TEST(LaunchConfig, RowBlocksArePowersOfTwoNoWiderThanNeeded) {
  using cuda::row_launch;
  EXPECT_EQ(row_launch(10, 8).threads, 32u);
  EXPECT_EQ(row_launch(10, 33).threads, 64u);
  EXPECT_EQ(row_launch(10, 100000).threads, 256u);
  EXPECT_EQ(row_launch(0, 8).blocks, 1u);
  EXPECT_EQ(row_launch(int64_t(1) << 20, 8).blocks, cuda::kMaxBlocks);  // the kernels loop over the rest
}

// The segments' sums' plan: chunks of 4096 up to 16 384 of them, longer beyond, so a segment never has more; the
// chunks of all segments numbered in order, and every chunk found in the segment whose elements it covers.
TEST(SumSegmentsPlan, CutsEverySegmentIntoChunksAndFindsEachChunksSegment) {
  using namespace cuda;
  const int64_t most = kMostPartials * kSumChunk;
  EXPECT_EQ(sum_chunk_count(0), 0);
  EXPECT_EQ(sum_chunk_length(most), kSumChunk);
  EXPECT_EQ(sum_chunk_count(most), kMostPartials);
  EXPECT_EQ(sum_chunk_length(most + 1), 2 * kSumChunk);
  EXPECT_EQ(sum_chunk_count(most + 1), kMostPartials / 2 + 1);
  EXPECT_LE(sum_chunk_count(int64_t(6.2e9)), kMostPartials);
  const std::vector<SumSegment> segments = {{0, 0}, {3, 1}, {4, 4097}, {0, 0}, {0, 0}, {9, 3 * most + 5}, {1, 4096}};
  const std::vector<SumChunks> plan = sum_chunks_plan(segments.data(), int64_t(segments.size()));
  ASSERT_EQ(plan.size(), segments.size() + 1);
  int64_t chunk = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    EXPECT_EQ(plan[s].first, chunk);
    int64_t covered = 0;
    for (int64_t c = 0; c < sum_chunk_count(segments[s].length); ++c, ++chunk) {
      EXPECT_EQ(segment_of_chunk(plan.data(), int64_t(segments.size()), chunk), int64_t(s)) << "chunk " << chunk;
      covered += std::min(plan[s].chunk, segments[s].length - c * plan[s].chunk);
    }
    EXPECT_EQ(covered, segments[s].length) << "segment " << s;
  }
  EXPECT_EQ(plan.back().first, chunk);
  const SumSegment negative{0, -1};
  EXPECT_THROW(sum_chunks_plan(&negative, 1), Error);
}

TEST(CudaBackend, WithoutADeviceItIsRefusedByName) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  try {
    make_cuda_backend(0);
    FAIL() << "no device, yet a CUDA backend was made";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput);
    EXPECT_NE(e.message().find("cuda"), std::string::npos) << e.message();
  }
}

// The op conformance suites (test_core_ops, test_core_moe_ops) run every op on every backend of
// conformance.h's backends(): the CUDA backend joins when there is a device. Said here when it does not.
TEST(CudaBackend, ConformanceRunsOnTheDeviceWhenThereIsOne) {
  if (!cuda_backend_built())
    GTEST_SKIP() << "this build has no CUDA backend (no nvcc): the conformance suites run on the CPU only";
  if (cuda_device_count() == 0)
    GTEST_SKIP() << "the CUDA backend is built but this machine has no device: the conformance suites run on the CPU "
                    "only (bench/device_check.sh runs them on a GPU)";
  SUCCEED() << cuda_device_count() << " CUDA devices: the conformance suites include the cuda backend";
}

}  // namespace
}  // namespace moe
