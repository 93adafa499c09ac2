// Bucketed, overlapped gradient reduction and the ZeRO slices.
#include "parallel/grad_buckets.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace moe {

GradBuckets::GradBuckets(Backend& backend, const ParamTable& table, Communicator& dense_comm, Communicator& expert_comm,
                         int64_t bucket_elems, bool zero)
    : backend_(backend), table_(table), dense_comm_(dense_comm), expert_comm_(expert_comm), zero_(zero) {
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
  backend_.reserve(b.staging, DType::F32, b.shard * c.size());  // zero-filled when made
  backend_.reserve(b.received, DType::F32, b.shard);
  backend_.copy(b.staging.data<float>(), grads_ + b.lo, size_t(len) * sizeof(float));
  b.request = c.ireduce_scatter_sum(b.staging.data<float>(), b.received.data<float>(), b.shard);
}

void GradBuckets::complete(Bucket& b) {
  if (!b.request) return;
  b.request->wait();
  b.request.reset();
  if (zero_) {
    Communicator& c = comm(b);
    const int64_t lo = b.lo + c.rank() * b.shard, hi = std::min(b.hi, lo + b.shard);
    if (hi > lo) backend_.copy(grads_ + lo, b.received.data<float>(), size_t(hi - lo) * sizeof(float));
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
    // This rank's updated slice, zero past the bucket's end, in `received` (free since finish).
    backend_.reserve(b.received, DType::F32, b.shard);
    backend_.reserve(b.staging, DType::F32, b.shard * c.size());
    float* mine = b.received.data<float>();
    const int64_t n = std::max<int64_t>(0, hi - lo);
    if (n > 0) backend_.copy(mine, params + lo, size_t(n) * sizeof(float));
    if (n < b.shard) backend_.ops<float>().fill(mine + n, 0.0f, b.shard - n);
    c.allgather(mine, b.staging.data<float>(), b.shard);
    backend_.copy(params + b.lo, b.staging.data<float>(), size_t(b.hi - b.lo) * sizeof(float));
    backend_.ops<float>().parameters_changed();  // other ranks' updates: the rounded copy lacks them
  }
}

}  // namespace moe
