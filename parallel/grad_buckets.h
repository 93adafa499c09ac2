// Data-parallel gradient synchronisation: gradients live in contiguous buckets, each reduced with a
// nonblocking collective as soon as backward has produced all of it, so communication overlaps the rest
// of backward. Dense gradients are reduced over the data-parallel group, expert gradients over the
// expert-data-parallel group. With ZeRO (Megatron's distributed optimizer) a bucket is reduce-scattered
// instead: each rank owns one slice of every bucket, updates only that slice, then the parameters are
// all-gathered. Buckets follow backward order (reverse registration in the parameter table). Gradients,
// parameters and ZeRO's staging are backend memory: the communicators are the data plane's.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend/backend.h"
#include "core/params.h"
#include "parallel/communicator.h"

namespace moe {

struct Segment {
  int64_t offset = 0, length = 0;  // a range of the flat buffers
};

class GradBuckets {
 public:
  GradBuckets(Backend& backend, const ParamTable& table, Communicator& dense_comm, Communicator& expert_comm,
              int64_t bucket_elems, bool zero);
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // A new step: nothing ready, nothing in flight.
  void start(float* grads);
  // The gradients of specs [spec_begin, spec_end) of the table are final: launches every bucket that is
  // now complete and lets those in flight progress.
  void mark_ready(int64_t spec_begin, int64_t spec_end);
  // Launches what is left and waits for everything. Afterwards the gradients hold their sums over the
  // group: everywhere without ZeRO, on the owned slices with it.
  void finish();
  // The slices this rank updates: dense and expert ones (the whole regions without ZeRO).
  const std::vector<Segment>& owned_dense() const { return owned_dense_; }
  const std::vector<Segment>& owned_expert() const { return owned_expert_; }
  // ZeRO: after the owned slices of params were updated, every rank gets every bucket's slices.
  void allgather_params(float* params);
  int64_t num_buckets() const { return int64_t(buckets_.size()); }
  bool zero() const { return zero_; }
  // Seconds finish() spent waiting for communication in the last step.
  double last_wait_seconds() const { return last_wait_s_; }

 private:
  struct Bucket {
    bool expert = false;
    int64_t lo = 0, hi = 0;  // [lo, hi) of the flat buffers
    int64_t shard = 0;       // ZeRO: elements per rank (the bucket padded to a multiple of the group)
    std::vector<int64_t> specs;
    int64_t pending = 0;  // specs not ready yet
    bool launched = false;
    std::unique_ptr<Request> request;
    // ZeRO, in backend memory: the bucket padded to shard * group size (the padding stays zero) and this
    // rank's reduced slice (then its updated slice, for the all-gather of the parameters).
    Buffer staging, received;
  };
  Communicator& comm(const Bucket& b) { return b.expert ? expert_comm_ : dense_comm_; }
  void launch(Bucket& b);
  void complete(Bucket& b);

  Backend& backend_;
  const ParamTable& table_;
  Communicator& dense_comm_;
  Communicator& expert_comm_;
  bool zero_;
  std::vector<Bucket> buckets_;
  std::vector<int64_t> bucket_of_spec_;
  std::vector<Segment> owned_dense_, owned_expert_;
  float* grads_ = nullptr;
  double last_wait_s_ = 0;
};

}  // namespace moe
