// The conjugate mappings of tensor and sequence parallelism (parallel/tp_mappings.h): each forward against
// a direct computation, and each pair's adjoint property <F(x), dy> = <x, F*(dy)>, exactly (small integers
// in float: every sum is exact), with the pairings of the header: a replicated tensor counted once, a
// partial or split one summed over the ranks. Then the same mappings on the memory-checking backend's buffers,
// whose copies refuse anything but its own memory: every move that is not a collective goes through the backend
// (a device-to-device copy on a GPU), at one rank and at every rank of the job.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend/memory_check.h"
#include "core/error.h"
#include "parallel/mpi_communicator.h"
#include "parallel/plane_check.h"
#include "parallel/self_communicator.h"
#include "parallel/tp_mappings.h"

namespace moe {
namespace {

using Vec = std::vector<float>;

// The backend whose memory the buffers are in: host vectors are the CPU backend's memory.
Backend& cpu() {
  static const std::unique_ptr<Backend> backend = make_cpu_backend(1);
  return *backend;
}

// Small integers that depend on (seed, index) and, unless replicated, on the rank.
Vec values(int64_t n, int seed, int rank) {
  Vec v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(((seed * 131 + rank * 17 + i * 7) % 11) - 5);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

// The sum over ranks of a per-rank inner product.
double summed(Communicator& c, double local) {
  c.allreduce_sum(&local, 1);
  return local;
}

constexpr int64_t kRows = 3, kCols = 5;

TEST(TpMappings, CopyToRegionAndReduceFromRegionAreAdjoint) {
  const auto world = MpiCommunicator::world();  // every rank of the job is the tensor-parallel group here
  Communicator& tp = *world;
  const int64_t n = kRows * kCols;
  // copy_to_region: x replicated, dy partial. <x, sum_r dy_r> = sum_r <x, dy_r>.
  const Vec x = values(n, 1, 0), dy = values(n, 2, tp.rank());
  Vec dx = dy;
  tp::copy_to_region_backward(tp, dx.data(), n);
  EXPECT_EQ(dot(x, dx), summed(tp, dot(x, dy)));
  // reduce_from_region: x partial, dy replicated. <sum_r x_r, dy> = sum_r <x_r, dy>.
  const Vec xp = values(n, 3, tp.rank()), dyr = values(n, 4, 0);
  Vec y = xp;
  tp::reduce_from_region_forward(tp, y.data(), n);
  EXPECT_EQ(dot(y, dyr), summed(tp, dot(xp, dyr)));
  Vec direct(size_t(n), 0.0f);
  for (int r = 0; r < tp.size(); ++r) {
    const Vec v = values(n, 3, r);
    for (int64_t i = 0; i < n; ++i) direct[size_t(i)] += v[size_t(i)];
  }
  EXPECT_EQ(y, direct);
}

TEST(TpMappings, GatherRowsAndReduceScatterRowsAreAdjoint) {
  const auto world = MpiCommunicator::world();  // every rank of the job is the tensor-parallel group here
  Communicator& tp = *world;
  const int64_t P = tp.size(), local = kRows * kCols, full = P * local;
  // gather_rows: x split (rows), dy partial (full rows).
  const Vec x = values(local, 5, tp.rank()), dy = values(full, 6, tp.rank());
  Vec y(static_cast<size_t>(full)), dx(static_cast<size_t>(local));
  tp::gather_rows_forward(cpu(), tp, x.data(), y.data(), kRows, kCols);
  for (int r = 0; r < P; ++r) EXPECT_EQ(Vec(y.begin() + r * local, y.begin() + (r + 1) * local), values(local, 5, r));
  tp::gather_rows_backward(cpu(), tp, dy.data(), dx.data(), kRows, kCols);
  EXPECT_EQ(summed(tp, dot(y, dy)), summed(tp, dot(x, dx)));
  // reduce_scatter_rows: x partial (full rows), dy split.
  const Vec xp = values(full, 7, tp.rank()), dys = values(local, 8, tp.rank());
  Vec ys(static_cast<size_t>(local)), dxp(static_cast<size_t>(full));
  tp::reduce_scatter_rows_forward(cpu(), tp, xp.data(), ys.data(), kRows, kCols);
  tp::reduce_scatter_rows_backward(cpu(), tp, dys.data(), dxp.data(), kRows, kCols);
  EXPECT_EQ(summed(tp, dot(ys, dys)), summed(tp, dot(xp, dxp)));
}

TEST(TpMappings, SplitColumnsAndGatherColumnsAreAdjoint) {
  const auto world = MpiCommunicator::world();  // every rank of the job is the tensor-parallel group here
  Communicator& tp = *world;
  const int64_t P = tp.size(), local = kRows * kCols, full = P * local;
  // split_columns: x replicated (rows, P * cols), dy split.
  const Vec x = values(full, 9, 0), dy = values(local, 10, tp.rank());
  Vec y(static_cast<size_t>(local)), dx(static_cast<size_t>(full));
  tp::split_columns_forward(cpu(), tp, x.data(), y.data(), kRows, kCols);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kCols; ++c)
      EXPECT_EQ(y[size_t(r * kCols + c)], x[size_t(r * P * kCols + tp.rank() * kCols + c)]);
  tp::split_columns_backward(cpu(), tp, dy.data(), dx.data(), kRows, kCols);
  EXPECT_EQ(summed(tp, dot(y, dy)), dot(x, dx));
  // gather_columns: x split, dy replicated: gather then split returns the block.
  const Vec xs = values(local, 11, tp.rank()), dyr = values(full, 12, 0);
  Vec yr(static_cast<size_t>(full)), dxs(static_cast<size_t>(local)), back(static_cast<size_t>(local));
  tp::gather_columns_forward(cpu(), tp, xs.data(), yr.data(), kRows, kCols);
  tp::gather_columns_backward(cpu(), tp, dyr.data(), dxs.data(), kRows, kCols);
  EXPECT_EQ(dot(yr, dyr), summed(tp, dot(xs, dxs)));
  tp::split_columns_forward(cpu(), tp, yr.data(), back.data(), kRows, kCols);
  EXPECT_EQ(back, xs);
}

// Each mapping on backend buffers of the memory-checking backend, over `group` as its data plane, against the
// same mapping on host vectors.
void expect_mappings_through_backend(Communicator& group) {
  const auto checked = make_memory_check_backend(1);
  Backend& b = *checked;
  const auto plane = make_plane_check(Plane::Data, group, memory_view(*checked));
  Communicator& tp = group;
  const int64_t P = tp.size(), local = kRows * kCols, full = P * local;
  const Vec x = values(local, 13, tp.rank()), xf = values(full, 14, tp.rank());
  auto on_backend = [&](const Vec& in, int64_t out_n, auto mapping) {
    Buffer bin = b.upload(in), bout = b.allocate(DType::F32, out_n);
    mapping(b, *plane, bin.data<float>(), bout.data<float>());
    return b.download<float>(bout);
  };
  auto on_host = [&](const Vec& in, int64_t out_n, auto mapping) {
    Vec out(static_cast<size_t>(out_n));
    mapping(cpu(), group, in.data(), out.data());
    return out;
  };
  auto both = [&](const char* what, const Vec& in, int64_t out_n, auto mapping) {
    EXPECT_EQ(on_backend(in, out_n, mapping), on_host(in, out_n, mapping)) << what << " at tp " << P;
  };
  both("gather_rows_forward", x, full, [&](Backend& k, Communicator& c, const float* i, float* o) {
    tp::gather_rows_forward(k, c, i, o, kRows, kCols);
  });
  both("gather_rows_backward", xf, local, [&](Backend& k, Communicator& c, const float* i, float* o) {
    tp::gather_rows_backward(k, c, i, o, kRows, kCols);
  });
  both("split_columns_forward", xf, local, [&](Backend& k, Communicator& c, const float* i, float* o) {
    tp::split_columns_forward(k, c, i, o, kRows, kCols);
  });
  both("split_columns_backward", x, full, [&](Backend& k, Communicator& c, const float* i, float* o) {
    tp::split_columns_backward(k, c, i, o, kRows, kCols);
  });
  both("gather_columns_forward", x, full, [&](Backend& k, Communicator& c, const float* i, float* o) {
    tp::gather_columns_forward(k, c, i, o, kRows, kCols);
  });
  both("gather_columns_backward", xf, local, [&](Backend& k, Communicator& c, const float* i, float* o) {
    tp::gather_columns_backward(k, c, i, o, kRows, kCols);
  });
}

TEST(TpMappings, MoveBackendMemoryThroughTheBackendAtOneRank) {
  SelfCommunicator one("tp");
  expect_mappings_through_backend(one);
}

// At one rank a gather is the backend's copy, which the memory check refuses on host memory: the mapping never
// copies with the host's memcpy.
TEST(TpMappings, AtOneRankCopyThroughTheBackendOnly) {
  SelfCommunicator one("tp");
  const auto checked = make_memory_check_backend(1);
  Vec x(static_cast<size_t>(kRows * kCols)), y(x.size());
  EXPECT_THROW(tp::gather_rows_forward(*checked, one, x.data(), y.data(), kRows, kCols), Error);
  EXPECT_THROW(tp::gather_rows_backward(*checked, one, x.data(), y.data(), kRows, kCols), Error);
  EXPECT_THROW(tp::gather_columns_forward(*checked, one, x.data(), y.data(), kRows, kCols), Error);
}

TEST(TpMappings, MoveBackendMemoryThroughTheBackendAtEveryRank) {
  const auto world = MpiCommunicator::world();
  expect_mappings_through_backend(*world);
}

}  // namespace
}  // namespace moe
