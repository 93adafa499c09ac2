// How the NCCL communicator (nccl_communicator.h) runs what NCCL has no single call for, as plain data
// tested without a GPU: the all-to-all-v as one group of point-to-point sends and receives, one per peer
// with something to move, at the displacements the Communicator seam defines (prefix sums of the counts).
#pragma once

#include <cstdint>
#include <vector>

namespace moe {

struct PeerTransfer {
  int peer = 0;
  int64_t send_offset = 0, send_count = 0;  // elements of the send buffer for the peer
  int64_t recv_offset = 0, recv_count = 0;  // elements of the receive buffer from the peer
};

// One entry per rank q (this rank included: its own block is a local copy) with send_counts[q] or
// recv_counts[q] nonzero, in the order rank, rank + 1, ... (mod size): each rank starts with itself and its
// next neighbour, so the transfers spread over the links. Inside an NCCL group the order does not decide
// completion; it decides which transfers are issued first.
std::vector<PeerTransfer> alltoallv_plan(int rank, int size, const int64_t* send_counts, const int64_t* recv_counts);

}  // namespace moe
