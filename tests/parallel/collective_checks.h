// Helpers of the multi-rank tests: inputs that encode their source, exact comparison, and the count of
// wrong elements summed over raw MPI_COMM_WORLD, so every rank reaches the same verdict and a
// communicator is never checked only by itself.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

#include "parallel/communicator.h"

namespace moe::comm_test {

// Sum over every rank of MPI_COMM_WORLD, independent of the communicator under test.
inline int64_t sum_over_world(int64_t local) {
  int64_t global = 0;
  MPI_Allreduce(&local, &global, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return global;
}

#define EXPECT_NONE_WRONG(wrong_local)                                              \
  do {                                                                              \
    const int64_t wrong_local_ = (wrong_local);                                     \
    EXPECT_EQ(::moe::comm_test::sum_over_world(wrong_local_), 0)                    \
        << "wrong elements, summed over ranks (this rank: " << wrong_local_ << ")"; \
  } while (0)

inline float encode(int rank, int64_t index) { return static_cast<float>(rank * 1000 + index); }

// Exact dot product of integer-valued floats.
inline int64_t dot(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += static_cast<int64_t>(a[i]) * static_cast<int64_t>(b[i]);
  return sum;
}

// Small integer values, a different pattern per rank and per seed, exact under any sum of a few.
inline std::vector<float> small_integers(int64_t count, int rank, int seed) {
  std::vector<float> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = static_cast<float>((rank * 7 + i * 13 + seed * 5) % 19 - 9);
  return v;
}

// Element k of the segment src sends to dst: src * 1e6 + dst * 1e5 + k (k < 1e5), exact in float.
inline float alltoallv_value(int src, int dst, int64_t k) {
  return static_cast<float>(src * 1000000 + dst * 100000 + k);
}

enum class Mode { Blocking, Nonblocking };

// Runs alltoallv (or ialltoallv, then test() until done) with send counts count_of(src, dst) known to
// every rank; the receive counts come from alltoall of the send counts, the way the dispatcher learns
// them. Returns this rank's wrong elements.
inline int64_t check_alltoallv(Communicator& comm, const std::function<int64_t(int, int)>& count_of,
                               Mode mode = Mode::Blocking) {
  const int n = comm.size(), me = comm.rank();
  std::vector<int64_t> send_counts(n), recv_counts(n, -1);
  for (int dst = 0; dst < n; ++dst) send_counts[dst] = count_of(me, dst);
  comm.alltoall(send_counts.data(), recv_counts.data(), 1);
  int64_t wrong = 0;
  for (int src = 0; src < n; ++src) wrong += recv_counts[src] != count_of(src, me);
  std::vector<float> send;
  for (int dst = 0; dst < n; ++dst)
    for (int64_t k = 0; k < send_counts[dst]; ++k) send.push_back(alltoallv_value(me, dst, k));
  const int64_t recv_total = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  std::vector<float> recv(recv_total + 1, -1.0f);  // one guard element past the end
  if (mode == Mode::Blocking) {
    comm.alltoallv(send.data(), send_counts.data(), recv.data(), recv_counts.data());
  } else {
    auto request = comm.ialltoallv(send.data(), send_counts.data(), recv.data(), recv_counts.data());
    // The counts are read before ialltoallv returns: overwriting them now must change nothing.
    std::fill(send_counts.begin(), send_counts.end(), -7);
    while (!request->test()) {
    }
    request->wait();  // a finished request: no-op
    send_counts.clear();
  }
  int64_t offset = 0;
  for (int src = 0; src < n; ++src)
    for (int64_t k = 0; k < recv_counts[src]; ++k) wrong += recv[offset++] != alltoallv_value(src, me, k);
  wrong += recv[recv_total] != -1.0f;
  return wrong;
}

}  // namespace moe::comm_test
