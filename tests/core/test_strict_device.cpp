// The memory-checking backend as a device the host cannot touch (core/backend/memory_check.h,
// core/backend/shadow_memory.h): a host read or write of its memory faults at once, naming the buffer, the
// offset, where it was allocated and the access; a freed buffer's addresses fault too; its ops refuse host
// memory and extents past a buffer's end, naming the op; its copies and ops reach the storage and compute what
// the CPU backend computes (the conformance suites run every op on it: tests/core/conformance.h, "strict").
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/backend/memory_check.h"
#include "core/error.h"

// Not in an anonymous namespace: the fault report names functions from the dynamic symbol table, which holds
// only those with external linkage (the test bodies here must be among them for the allocation-site check).
namespace moe::strict_device_test {

std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(StrictDevice, HostReadOfBackendMemoryFaultsNamingTheBufferAndItsAllocationSite) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        const auto backend = make_memory_check_backend(1);
        Buffer first = backend->allocate(DType::F32, 4);
        Buffer b = backend->allocate(DType::F32, 16);
        volatile float x = b.data<float>()[3];
        (void)x;
      },
      "host code read backend memory at 0x[0-9a-f]+.*byte 12 of buffer #2 \\(64 bytes\\), allocated at:.*"
      "moe::Backend::allocate.*StrictDevice_HostReadOfBackendMemory.*the "
      "access:.*StrictDevice_HostReadOfBackendMemory");
}

TEST(StrictDevice, HostWriteFaultsAsAWrite) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        const auto backend = make_memory_check_backend(1);
        Buffer b = backend->allocate(DType::I32, 8);
        b.data<int32_t>()[7] = 1;
      },
      "host code wrote to backend memory.*byte 28 of buffer #1 \\(32 bytes\\)");
}

TEST(StrictDevice, AFreedBuffersAddressesFault) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        const auto backend = make_memory_check_backend(1);
        const double* stale = nullptr;
        {
          Buffer b = backend->allocate(DType::F64, 2);
          stale = b.data<double>();
        }
        Buffer later = backend->allocate(DType::F64, 2);  // a fresh range: the freed one is never handed out again
        volatile double x = stale[0];
        (void)x;
      },
      "host code read backend memory.*in no live buffer: a freed buffer's address");
}

TEST(StrictDevice, OpsRefuseHostMemoryAndExtentsPastABufferNamingTheOp) {
  const auto backend = make_memory_check_backend(1);
  Ops<float>& ops = backend->ops<float>();
  Buffer b = backend->allocate(DType::F32, 16), c = backend->allocate(DType::F32, 16);
  std::vector<float> host(16);
  std::string m = refusal([&] { ops.fill(host.data(), 1.0f, 16); });
  EXPECT_NE(m.find("fill: 64 bytes at"), std::string::npos) << m;
  EXPECT_NE(m.find("host memory given to a backend op"), std::string::npos) << m;
  m = refusal([&] { ops.copy(b.data<float>() + 4, c.data<float>(), 16); });
  EXPECT_NE(m.find("copy: 64 bytes at"), std::string::npos) << m;
  EXPECT_NE(m.find("past a buffer's end"), std::string::npos) << m;
  m = refusal([&] {
    ops.gemm({.M = 4,
              .N = 4,
              .K = 5,
              .A = b.data<float>(),
              .lda = 5,
              .B = c.data<float>(),
              .ldb = 4,
              .C = c.data<float>(),
              .ldc = 4});
  });
  EXPECT_NE(m.find("gemm: 80 bytes"), std::string::npos) << "A is (4, 5) at lda 5: 20 floats, past 16: " << m;
  EXPECT_NO_THROW(ops.fill(b.data<float>() + 4, 2.0f, 12)) << "an extent that ends at the buffer's end";
}

// The segments' sums check each segment's read and the sums' write: a segment past the buffer's end, one at a
// negative offset and too short an output are refused, naming the op; a segment that ends at the buffer's end runs.
TEST(StrictDevice, SegmentSumsRefuseASegmentOutsideTheBuffer) {
  const auto backend = make_memory_check_backend(1);
  Ops<float>& ops = backend->ops<float>();
  const std::vector<float> values = {1, 2, 3, 4, 5, 6, 7, 8};
  Buffer x = backend->upload(values), sums = backend->allocate(DType::F64, 2);
  std::vector<SumSegment> segments = {{0, 2}, {5, 4}, {1, 1}};
  auto sum = [&](int64_t count) {
    return refusal(
        [&] { ops.sum_squares_segments_into(x.data<float>(), segments.data(), count, sums.data<double>()); });
  };
  std::string m = sum(2);
  EXPECT_NE(m.find("sum_squares_segments_into: 16 bytes at"), std::string::npos) << m;
  EXPECT_NE(m.find("past a buffer's end"), std::string::npos) << m;
  segments[1] = {-1, 2};
  m = sum(2);
  EXPECT_NE(m.find("sum_squares_segments_into: a segment at offset -1"), std::string::npos) << m;
  segments[1] = {5, 3};
  m = sum(3);
  EXPECT_NE(m.find("sum_squares_segments_into: 24 bytes at"), std::string::npos) << "3 sums into 2 doubles: " << m;
  EXPECT_EQ(sum(2), "") << "a segment that ends at the buffer's end";
  EXPECT_EQ(backend->download<double>(sums), (std::vector<double>{5, 36 + 49 + 64}));
}

TEST(StrictDevice, CopiesAndOpsReachTheStorage) {
  const auto backend = make_memory_check_backend(1);
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  Buffer a = backend->upload(x), b = backend->allocate(DType::F32, 6);
  backend->copy(b.data<float>(), a.data<float>(), 6 * sizeof(float));
  backend->ops<float>().scale(b.data<float>(), 2.0f, 6);
  backend->ops<float>().add_inplace(b.data<float>(), a.data<float>(), 6);
  EXPECT_EQ(backend->download<float>(b), (std::vector<float>{3, 6, 9, 12, 15, 18}));
  EXPECT_EQ(backend->ops<float>().sum_squares(a.data<float>(), 6), 91.0);
  std::vector<float> part(2);
  backend->copy_to_host(part.data(), a.data<float>() + 4, 2);
  backend->synchronize();
  EXPECT_EQ(part, (std::vector<float>{5, 6}));
  EXPECT_THROW(backend->copy_to_host(part.data(), a.data<float>() + 5, 2), Error) << "past the buffer's end";
}

// Ops and copies run in order on the backend's stream when the host synchronises: a read of a copy's destination
// before that sees the bytes of before; a host source is read at the call; a buffer freed with work queued on it
// keeps its storage until that work has run.
TEST(StrictDevice, TheHostSeesResultsOnlyAfterSynchronising) {
  const auto backend = make_memory_check_backend(1);
  std::vector<float> source = {1, 2, 3, 4};
  Buffer a = backend->upload(source);
  source.assign(4, -1.0f);  // after the call: the copy took the bytes of before
  backend->ops<float>().scale(a.data<float>(), 10.0f, 4);
  std::vector<float> seen(4, 0.0f);
  backend->copy_to_host(seen.data(), a.data<float>(), 4);
  EXPECT_EQ(seen, std::vector<float>(4, 0.0f)) << "nothing has run before the host synchronises";
  backend->synchronize();
  EXPECT_EQ(seen, (std::vector<float>{10, 20, 30, 40}));
  {
    Buffer scratch = backend->upload(std::vector<float>{7, 8});
    backend->copy(a.data<float>(), scratch.data<float>(), 2 * sizeof(float));
  }  // freed with the copy still queued
  EXPECT_EQ(backend->download<float>(a), (std::vector<float>{7, 8, 30, 40}));
}

// Backend::host_traffic counts the host's waits (synchronisations, downloads, ops that return a value) and the
// bytes read back alike on the CPU backend and the checked one: what the host-synchronisation budget measures.
TEST(StrictDevice, HostTrafficCountsWaitsAndBytesAlikeOnEveryBackend) {
  for (const auto& backend : {make_cpu_backend(1), std::unique_ptr<Backend>(make_memory_check_backend(1))}) {
    Buffer a = backend->upload(std::vector<float>{1, 2, 3});
    const Backend::HostTraffic before = backend->host_traffic();
    EXPECT_EQ(backend->download<float>(a).size(), 3u);
    EXPECT_EQ(backend->ops<float>().sum_squares(a.data<float>(), 3), 14.0);
    std::vector<double> part(1);
    Buffer d = backend->upload(std::vector<double>{5});
    backend->copy_to_host(part.data(), d.data<double>(), 1);
    backend->synchronize();
    const Backend::HostTraffic after = backend->host_traffic();
    EXPECT_EQ(after.syncs - before.syncs, 3) << backend->name() << ": a download, a sum of squares, a synchronisation";
    EXPECT_EQ(after.d2h_bytes - before.d2h_bytes, 3 * 4 + 8) << backend->name();
  }
}

TEST(StrictDevice, TwoBackendsAtOnceKeepTheirOwnMemory) {
  const auto one = make_memory_check_backend(1), two = make_memory_check_backend(1);
  Buffer a = one->upload(std::vector<float>{1, 2}), b = two->upload(std::vector<float>{3, 4});
  EXPECT_TRUE(one->owns(a.data<float>(), 8));
  EXPECT_FALSE(one->owns(b.data<float>(), 8));
  EXPECT_THROW(one->ops<float>().copy(b.data<float>(), a.data<float>(), 2), Error) << "another backend's memory";
  EXPECT_EQ(two->download<float>(b), (std::vector<float>{3, 4}));
}

}  // namespace moe::strict_device_test
