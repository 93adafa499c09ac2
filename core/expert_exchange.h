// The communication seam of the MoE dispatcher: an all-to-all over the expert-parallel group, counts
// first, then rows. core declares it; parallel/ implements it over a Communicator. A layer without one
// (one expert-parallel rank) exchanges with itself.
#pragma once

#include <cstdint>

namespace moe {

class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // recv[q * n + i] = what rank q sent to this rank as its send[rank * n + i].
  virtual void exchange_counts(const int64_t* send, int64_t* recv, int64_t n) = 0;
  // send_counts[q] floats of send go to rank q, in rank order; recv_counts[q] floats arrive from q.
  virtual void exchange(const float* send, const int64_t* send_counts, float* recv, const int64_t* recv_counts) = 0;
};

}  // namespace moe
