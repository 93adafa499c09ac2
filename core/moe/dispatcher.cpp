// The dispatcher interface's shared parts: the blocking forms, the expert-major reordering, the choice of
// implementation. See dispatcher.h.
#include "core/moe/dispatcher.h"

#include "core/error.h"
#include "core/moe/allgather_dispatcher.h"
#include "core/moe/alltoall_dispatcher.h"

namespace moe {

// With one rank the rows arrive from one source, so the expert-major order is the tokens' own: one copy, without
// the staging buffers, and none where the caller gives both sides the same memory (MoeLayer does).
template <typename T>
void Dispatcher<T>::dispatch(const ExchangePlan& p, const T* token_rows, T* expert_rows, int64_t width) {
  if (ep_size_ == 1 && token_rows == expert_rows) return;
  if (ep_size_ == 1) return backend_.copy(expert_rows, token_rows, size_t(p.received * width) * sizeof(T));
  start_dispatch(p, token_rows, width, blocking_);
  finish_dispatch(p, blocking_, expert_rows, width);
}

template <typename T>
void Dispatcher<T>::combine(const ExchangePlan& p, const T* expert_rows, T* token_rows, int64_t width) {
  if (ep_size_ == 1 && token_rows == expert_rows) return;
  if (ep_size_ == 1) return backend_.copy(token_rows, expert_rows, size_t(p.received * width) * sizeof(T));
  start_combine(p, expert_rows, token_rows, width, blocking_);
  finish_combine(p, blocking_, width);
}

template <typename T>
void Dispatcher<T>::set_local_offsets(ExchangePlan& p) const {
  const int64_t P = ep_size_, El = local_experts();
  p.local_offset.assign(size_t(El + 1), 0);
  for (int64_t el = 0; el < El; ++el) {
    int64_t rows = 0;
    for (int64_t q = 0; q < P; ++q) rows += p.recv_count[q * El + el];
    p.local_offset[el + 1] = p.local_offset[el] + rows;
  }
  p.received = p.local_offset[El];
}

// Block (q, el) sits at row first_row[q * El + el] of `rows` and at local_offset[el] plus the rows of the
// sources before q in the expert-major order.
template <typename T>
void Dispatcher<T>::move_blocks(const ExchangePlan& p, const std::vector<int64_t>& first_row, const T* from, T* to,
                                int64_t width, bool to_expert_major) const {
  const int64_t P = ep_size_, El = local_experts();
  for (int64_t el = 0; el < El; ++el) {
    int64_t expert_major = p.local_offset[el];
    for (int64_t q = 0; q < P; ++q) {
      const int64_t n = p.recv_count[q * El + el], other = first_row[size_t(q * El + el)];
      const int64_t from_row = to_expert_major ? other : expert_major, to_row = to_expert_major ? expert_major : other;
      if (n > 0) backend_.copy(to + to_row * width, from + from_row * width, size_t(n * width) * sizeof(T));
      expert_major += n;
    }
  }
}

template <typename T>
std::unique_ptr<Dispatcher<T>> make_dispatcher(DispatcherKind kind, Backend& backend, int64_t experts,
                                               int64_t ep_size) {
  switch (kind) {
    case DispatcherKind::AllToAll:
      return std::make_unique<AllToAllDispatcher<T>>(backend, experts, ep_size);
    case DispatcherKind::AllGather:
      return std::make_unique<AllGatherDispatcher<T>>(backend, experts, ep_size);
  }
  MOE_FAIL("unknown dispatcher " << int(kind));
}

template class Dispatcher<float>;
template class Dispatcher<double>;
template std::unique_ptr<Dispatcher<float>> make_dispatcher(DispatcherKind, Backend&, int64_t, int64_t);
template std::unique_ptr<Dispatcher<double>> make_dispatcher(DispatcherKind, Backend&, int64_t, int64_t);

}  // namespace moe
