// Bucketed, overlapped gradient reduction and the ZeRO slices.
#include "parallel/grad_buckets.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace moe {

GradBuckets::GradBuckets(const ParamTable& table, Communicator& dense_comm, Communicator& expert_comm,
                         int64_t bucket_elems, bool zero)
    : table_(table), dense_comm_(dense_comm), expert_comm_(expert_comm), zero_(zero) {
  const auto& specs = table.specs();
  bucket_of_spec_.assign(specs.size(), -1);
  // Walk specs in backward order; consecutive specs of one region are contiguous and descending there.
  int64_t open[2] = {-1, -1};  // the bucket being filled, per region (dense, expert)
  for (int64_t i = int64_t(specs.size()) - 1; i >= 0; --i) {
    const ParamSpec& s = specs[i];
    const int region = s.expert() ? 1 : 0;
    if (open[region] < 0 || buckets_[open[region]].lo != s.offset + s.numel ||
        buckets_[open[region]].hi - buckets_[open[region]].lo >= bucket_elems) {
      buckets_.push_back(Bucket{});
      buckets_.back().expert = region == 1;
      buckets_.back().lo = buckets_.back().hi = s.offset + s.numel;
      open[region] = int64_t(buckets_.size()) - 1;
    }
    Bucket& b = buckets_[open[region]];
    b.lo = s.offset;
    b.specs.push_back(i);
    bucket_of_spec_[i] = open[region];
  }
  for (Bucket& b : buckets_) {
    Communicator& c = comm(b);
    const int64_t len = b.hi - b.lo, P = c.size();
    b.shard = (len + P - 1) / P;
    if (!zero_) {
      (b.expert ? owned_expert_ : owned_dense_).push_back({b.lo, len});
      continue;
    }
    const int64_t lo = b.lo + c.rank() * b.shard, hi = std::min(b.hi, lo + b.shard);
    if (hi > lo) (b.expert ? owned_expert_ : owned_dense_).push_back({lo, hi - lo});
  }
}

void GradBuckets::start(float* grads) {
  grads_ = grads;
  for (Bucket& b : buckets_) {
    MOE_CHECK(!b.request, "a gradient bucket is still in flight from the previous step");
    b.pending = int64_t(b.specs.size());
    b.launched = false;
  }
  last_wait_s_ = 0;
}

void GradBuckets::launch(Bucket& b) {
  b.launched = true;
  Communicator& c = comm(b);
  const int64_t len = b.hi - b.lo;
  if (c.size() == 1) return;
  if (!zero_) {
    b.request = c.iallreduce_sum(grads_ + b.lo, len);
    return;
  }
  b.staging.assign(size_t(b.shard * c.size()), 0.0f);  // padded to a multiple of the group
  b.received.assign(size_t(b.shard), 0.0f);
  std::copy_n(grads_ + b.lo, len, b.staging.data());
  b.request = c.ireduce_scatter_sum(b.staging.data(), b.received.data(), b.shard);
}

void GradBuckets::complete(Bucket& b) {
  if (!b.request) return;
  b.request->wait();
  b.request.reset();
  if (zero_) {
    Communicator& c = comm(b);
    const int64_t lo = b.lo + c.rank() * b.shard, hi = std::min(b.hi, lo + b.shard);
    if (hi > lo) std::copy_n(b.received.data(), hi - lo, grads_ + lo);
  }
}

void GradBuckets::mark_ready(int64_t spec_begin, int64_t spec_end) {
  for (int64_t i = spec_begin; i < spec_end; ++i) {
    Bucket& b = buckets_[bucket_of_spec_[i]];
    if (--b.pending == 0) launch(b);
  }
  // Nonblocking collectives progress only inside MPI calls: test the ones in flight.
  for (Bucket& b : buckets_)
    if (b.request) b.request->test();
}

void GradBuckets::finish() {
  const auto t0 = std::chrono::steady_clock::now();
  for (Bucket& b : buckets_)
    if (!b.launched) launch(b);
  for (Bucket& b : buckets_) complete(b);
  last_wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void GradBuckets::allgather_params(float* params) {
  if (!zero_) return;
  for (Bucket& b : buckets_) {
    Communicator& c = comm(b);
    if (c.size() == 1) continue;
    const int64_t lo = b.lo + c.rank() * b.shard, hi = std::min(b.hi, lo + b.shard);
    std::vector<float> mine(size_t(b.shard), 0.0f);
    if (hi > lo) std::copy_n(params + lo, hi - lo, mine.data());
    b.staging.resize(size_t(b.shard * c.size()));
    c.allgather(mine.data(), b.staging.data(), b.shard);
    std::copy_n(b.staging.data(), b.hi - b.lo, params + b.lo);
  }
}

}  // namespace moe
