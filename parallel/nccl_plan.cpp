// The NCCL communicator's plans (see nccl_plan.h).
#include "parallel/nccl_plan.h"

#include "core/error.h"

namespace moe {

std::vector<PeerTransfer> alltoallv_plan(int rank, int size, const int64_t* send_counts, const int64_t* recv_counts) {
  MOE_CHECK(size >= 1 && rank >= 0 && rank < size, "rank " << rank << " of " << size);
  std::vector<int64_t> send_offset(size_t(size) + 1, 0), recv_offset(size_t(size) + 1, 0);
  for (int q = 0; q < size; ++q) {
    MOE_CHECK(send_counts[q] >= 0 && recv_counts[q] >= 0,
              "all-to-all-v counts for rank " << q << ": " << send_counts[q] << " and " << recv_counts[q]);
    send_offset[size_t(q) + 1] = send_offset[size_t(q)] + send_counts[q];
    recv_offset[size_t(q) + 1] = recv_offset[size_t(q)] + recv_counts[q];
  }
  std::vector<PeerTransfer> plan;
  for (int i = 0; i < size; ++i) {
    const int q = (rank + i) % size;
    if (send_counts[q] == 0 && recv_counts[q] == 0) continue;
    plan.push_back({q, send_offset[size_t(q)], send_counts[q], recv_offset[size_t(q)], recv_counts[q]});
  }
  return plan;
}

}  // namespace moe
