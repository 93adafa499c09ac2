// The MoE layer: routing (plan), expert compute over permuted contiguous blocks, combine, router losses,
// and the mirrored backward. See moe_layer.h for what is and is not here.
#include "core/moe_layer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>

#include "core/error.h"

namespace moe {
namespace {
template <typename T>
inline void copy_row(const T* src, T* dst, int64_t D) {
  std::copy_n(src, D, dst);
}
}  // namespace

template <typename T>
struct MoeLayer<T>::ActsView {
  T *logits, *scores;  // (N, E) raw router logits z, scores p
  T* yp;               // expert outputs back at the token side, permuted order (M, D)
  T *shared_acts, *shared_out;
  T *xf, *fallback_acts, *yf;
};

template <typename T>
MoeLayer<T>::MoeLayer(Ops<T>& ops, const MoeSettings& settings) : ops_(ops), s_(settings) {
  MOE_CHECK(s_.num_experts >= 1 && s_.top_k >= 1 && s_.top_k <= s_.num_experts,
            "experts " << s_.num_experts << ", top_k " << s_.top_k);
  MOE_CHECK(
      s_.ep_size >= 1 && s_.num_experts % s_.ep_size == 0 && s_.ep_rank >= 0 && s_.ep_rank < s_.ep_size,
      "expert parallelism " << s_.ep_size << " (rank " << s_.ep_rank << ") over " << s_.num_experts << " experts");
  bias_.assign(size_t(s_.num_experts), 0.0f);
  if (s_.shared_experts > 0)
    shared_ = std::make_unique<DenseMlp<T>>(ops, s_.d_model, s_.shared_experts * s_.expert_hidden, s_.layers_total);
  if (s_.overflow == Overflow::Dense)
    fallback_ = std::make_unique<DenseMlp<T>>(ops, s_.d_model, s_.fallback_hidden, s_.layers_total);
  reset_stats();
}

template <typename T>
void MoeLayer<T>::register_params(ParamTable& table, const std::string& prefix) {
  prefix_ = prefix;
  const int64_t D = s_.d_model, E = s_.num_experts, F = s_.expert_hidden;
  const double out_std = 0.02 / std::sqrt(2.0 * double(s_.layers_total));
  table.add({prefix + ".router.weight", {D, E}, ParamRole::Router, true, ParamInit::Normal, 0.02});
  // This rank's experts: rows [ep_rank * El, (ep_rank + 1) * El) of the global (E, ...) tensors.
  const int64_t El = local_experts(), first = s_.ep_rank * El;
  table.add({prefix + ".experts.w1", {El, D, F}, ParamRole::Expert, true, ParamInit::Normal, 0.02, E, first});
  table.add({prefix + ".experts.w3", {El, D, F}, ParamRole::Expert, true, ParamInit::Normal, 0.02, E, first});
  table.add({prefix + ".experts.w2", {El, F, D}, ParamRole::Expert, true, ParamInit::Normal, out_std, E, first});
  if (shared_) shared_->register_params(table, prefix + ".shared");
  if (fallback_) fallback_->register_params(table, prefix + ".fallback");
}

template <typename T>
void MoeLayer<T>::bind(const ParamTable& table, T* params, T* grads) {
  auto at = [&](const char* name) { return table.find(prefix_ + name).offset; };
  router_ = params + at(".router.weight"), d_router_ = grads + at(".router.weight");
  w1_ = params + at(".experts.w1"), dw1_ = grads + at(".experts.w1");
  w3_ = params + at(".experts.w3"), dw3_ = grads + at(".experts.w3");
  w2_ = params + at(".experts.w2"), dw2_ = grads + at(".experts.w2");
  if (shared_) shared_->bind(table, params, grads);
  if (fallback_) fallback_->bind(table, params, grads);
}

template <typename T>
int64_t MoeLayer<T>::activation_size(int64_t N) const {
  const int64_t D = s_.d_model, E = s_.num_experts, K = s_.top_k;
  int64_t n = 2 * N * E + N * K * D;
  if (shared_) n += shared_->activation_size(N) + N * D;
  if (fallback_) n += 2 * N * D + fallback_->activation_size(N);
  return n;
}

template <typename T>
typename MoeLayer<T>::ActsView MoeLayer<T>::carve(T* acts, int64_t N) const {
  const int64_t D = s_.d_model, E = s_.num_experts, K = s_.top_k, M = N * K;
  ActsView v{};
  T* c = acts;
  v.logits = c, c += N * E;
  v.scores = c, c += N * E;
  v.yp = c, c += M * D;
  if (shared_) v.shared_acts = c, c += shared_->activation_size(N), v.shared_out = c, c += N * D;
  if (fallback_) v.xf = c, c += N * D, v.fallback_acts = c, c += fallback_->activation_size(N), v.yf = c, c += N * D;
  return v;
}

template <typename T>
int64_t MoeLayer<T>::capacity(int64_t N) const {
  if (s_.capacity_factor <= 0) return std::numeric_limits<int64_t>::max();
  return int64_t(std::ceil(double(s_.top_k) * double(N) / double(s_.num_experts) * s_.capacity_factor));
}

template <typename T>
double MoeLayer<T>::forward_flops(int64_t N) const {
  const double n = double(N), D = double(s_.d_model), F = double(s_.expert_hidden);
  double flops = 2 * n * D * double(s_.num_experts) + 6 * n * double(s_.top_k) * D * F;
  if (shared_) flops += shared_->forward_flops(N);
  return flops;
}

template <typename T>
void MoeLayer<T>::reset_stats() {
  stats_ = RouterStepStats{};
  stats_.tokens_per_expert.assign(size_t(s_.num_experts), 0);
}

template <typename T>
void MoeLayer<T>::update_balancing_bias(const std::vector<int64_t>& counts, double rate) {
  if (rate <= 0) return;
  MOE_CHECK(int64_t(counts.size()) == s_.num_experts, "counts of " << counts.size() << " experts");
  double mean = 0;
  for (int64_t c : counts) mean += double(c);
  mean /= double(counts.size());
  for (size_t e = 0; e < counts.size(); ++e) {
    const double diff = mean - double(counts[e]);
    bias_[e] += float(rate * double((diff > 0) - (diff < 0)));
  }
}

// ---- Dispatch and combine: communication only --------------------------------------------------

// Rows for each rank's experts are contiguous in the global-expert order of the permutation; the counts
// per (source, local expert) are exchanged first so that every rank knows what it will receive.
template <typename T>
void MoeLayer<T>::plan_exchange(MoeSlot<T>& st) {
  const int64_t P = s_.ep_size, El = local_experts();
  std::vector<int64_t> send_count(static_cast<size_t>(P * El));
  for (int64_t e = 0; e < s_.num_experts; ++e) send_count[e] = st.expert_offset[e + 1] - st.expert_offset[e];
  st.recv_count.assign(size_t(P * El), 0);
  if (P == 1)
    st.recv_count = send_count;
  else
    exchange_->exchange_counts(send_count.data(), st.recv_count.data(), El);
  st.send_rows.assign(size_t(P), 0);
  st.recv_rows.assign(size_t(P), 0);
  for (int64_t q = 0; q < P; ++q)
    for (int64_t el = 0; el < El; ++el)
      st.send_rows[q] += send_count[q * El + el], st.recv_rows[q] += st.recv_count[q * El + el];
  st.local_offset.assign(size_t(El + 1), 0);
  for (int64_t el = 0; el < El; ++el) {
    int64_t rows = 0;
    for (int64_t q = 0; q < P; ++q) rows += st.recv_count[q * El + el];
    st.local_offset[el + 1] = st.local_offset[el] + rows;
  }
  st.received = st.local_offset[El];
}

template <typename T>
void MoeLayer<T>::exchange_rows(const T* send, const std::vector<int64_t>& send_rows, T* recv,
                                const std::vector<int64_t>& recv_rows, int64_t width) {
  if (s_.ep_size == 1) {
    std::copy_n(send, send_rows[0] * width, recv);
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    std::vector<int64_t> sc(send_rows.size()), rc(recv_rows.size());
    for (size_t q = 0; q < sc.size(); ++q) sc[q] = send_rows[q] * width, rc[q] = recv_rows[q] * width;
    exchange_->exchange(send, sc.data(), recv, rc.data());
  } else {
    MOE_FAIL("expert parallelism runs in float only");
  }
}

// Received rows arrive source-major (source rank, local expert); the experts compute expert-major (local
// expert, source rank). Moves the blocks between the two orders, in either direction.
template <typename T>
void MoeLayer<T>::reorder_received(const MoeSlot<T>& st, const T* from, T* to, int64_t width,
                                   bool to_expert_major) const {
  const int64_t P = s_.ep_size, El = local_experts();
  int64_t src = 0;
  for (int64_t q = 0; q < P; ++q)
    for (int64_t el = 0; el < El; ++el) {
      int64_t dst = st.local_offset[el];
      for (int64_t q2 = 0; q2 < q; ++q2) dst += st.recv_count[q2 * El + el];
      const int64_t n = st.recv_count[q * El + el] * width;
      const int64_t from_row = to_expert_major ? src : dst, to_row = to_expert_major ? dst : src;
      std::copy_n(from + from_row * width, n, to + to_row * width);
      src += st.recv_count[q * El + el];
    }
}

template <typename T>
void MoeLayer<T>::dispatch_rows(const MoeSlot<T>& st, const T* token_rows, T* expert_rows, int64_t width) {
  exchange_buffer_.resize(size_t(st.received * width));
  exchange_rows(token_rows, st.send_rows, exchange_buffer_.data(), st.recv_rows, width);
  reorder_received(st, exchange_buffer_.data(), expert_rows, width, true);
}

template <typename T>
void MoeLayer<T>::combine_rows(const MoeSlot<T>& st, const T* expert_rows, T* token_rows, int64_t width) {
  exchange_buffer_.resize(size_t(st.received * width));
  reorder_received(st, expert_rows, exchange_buffer_.data(), width, false);
  exchange_rows(exchange_buffer_.data(), st.recv_rows, token_rows, st.send_rows, width);  // counts swapped
}

// ---- Forward and backward --------------------------------------------------------------------------

template <typename T>
void MoeLayer<T>::forward(const FfnContext& context, const T* x, T* y, T* acts, FfnSlot* slot, int64_t N) {
  const int64_t D = s_.d_model, E = s_.num_experts, K = s_.top_k, F = s_.expert_hidden, El = local_experts();
  MOE_CHECK(s_.ep_size == 1 || exchange_,
            "an MoE layer over " << s_.ep_size << " expert-parallel ranks needs an exchange");
  MoeSlot<T>& st = static_cast<MoeSlot<T>&>(*slot);
  const ActsView v = carve(acts, N);
  // Plan (local): router, selection, capacity, permutation.
  ops_.gemm(false, false, N, E, D, T(1), x, D, router_, E, T(0), v.logits, E);  // z = x Wg
  route(context, v.logits, v.scores, st, N);
  build_permutation(st, N);
  plan_exchange(st);

  // Dispatch: gather each expert's tokens into its block, send blocks to the experts' ranks.
  const int64_t M = st.expert_offset[E], R = st.received;
  // Kept across forwards: allocating (and zeroing) them every time cost as much as the gather itself.
  std::vector<T>& xp = token_rows_;
  xp.resize(size_t(M * D));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < M; ++r) copy_row(x + (st.perm_slot[r] / K) * D, xp.data() + r * D, D);
  st.xe.resize(size_t(R * D));
  st.ea.resize(size_t(R * F)), st.eb.resize(size_t(R * F)), st.eh.resize(size_t(R * F));
  dispatch_rows(st, xp.data(), st.xe.data(), D);

  // Experts: one GEMM per local expert over its block.
  std::vector<T>& ye = expert_out_;
  ye.resize(size_t(R * D));
  for (int64_t el = 0; el < El; ++el) {
    const int64_t r0 = st.local_offset[el], m = st.local_offset[el + 1] - r0;
    if (m == 0) continue;
    ops_.gemm(false, false, m, F, D, T(1), st.xe.data() + r0 * D, D, w1_ + el * D * F, F, T(0), st.ea.data() + r0 * F,
              F);
    ops_.gemm(false, false, m, F, D, T(1), st.xe.data() + r0 * D, D, w3_ + el * D * F, F, T(0), st.eb.data() + r0 * F,
              F);
  }
  ops_.swiglu_forward(st.ea.data(), st.eb.data(), st.eh.data(), R * F);
  for (int64_t el = 0; el < El; ++el) {
    const int64_t r0 = st.local_offset[el], m = st.local_offset[el + 1] - r0;
    if (m == 0) continue;
    ops_.gemm(false, false, m, D, F, T(1), st.eh.data() + r0 * F, F, w2_ + el * F * D, D, T(0), ye.data() + r0 * D, D);
  }

  // Combine: outputs back to their tokens' ranks, then y = sum_j w_j Expert_j(x), slots in order.
  combine_rows(st, ye.data(), v.yp, D);
  const std::vector<int64_t>& row_of_slot = st.row_of_slot;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    T* yn = y + n * D;
    std::fill_n(yn, D, T(0));
    for (int64_t j = 0; j < K; ++j) {
      const int64_t slot = n * K + j;
      if (st.assigned_expert[slot] < 0) continue;
      const T w = st.gate[slot];
      const T* src = v.yp + row_of_slot[slot] * D;
      for (int64_t d = 0; d < D; ++d) yn[d] += w * src[d];
    }
  }
  if (shared_) {
    shared_->forward(context, x, v.shared_out, v.shared_acts, nullptr, N);
    ops_.add_inplace(y, v.shared_out, N * D);
  }
  if (fallback_ && !st.fallback_token.empty()) {
    const int64_t Mf = int64_t(st.fallback_token.size());
    for (int64_t i = 0; i < Mf; ++i) copy_row(x + int64_t(st.fallback_token[i]) * D, v.xf + i * D, D);
    fallback_->forward(context, v.xf, v.yf, v.fallback_acts, nullptr, Mf);
    for (int64_t i = 0; i < Mf; ++i) {
      T* yn = y + int64_t(st.fallback_token[i]) * D;
      for (int64_t d = 0; d < D; ++d) yn[d] += st.fallback_weight[i] * v.yf[i * D + d];
    }
  }

  router_losses(v.logits, v.scores, st, N);
  count_stats(context, st, N);
}

// Statistics are counted once per real training forward, never on a recompute.
template <typename T>
void MoeLayer<T>::count_stats(const FfnContext& context, const MoeSlot<T>& st, int64_t N) {
  if (!context.training || context.recomputing) return;
  const int64_t K = s_.top_k;
  stats_.groups += 1;
  stats_.tokens += N;
  for (int64_t slot = 0; slot < N * K; ++slot) {
    if (st.assigned_expert[slot] >= 0) ++stats_.tokens_per_expert[st.assigned_expert[slot]];
    stats_.dropped += st.fate[slot] == SlotFate::Dropped;
    stats_.rerouted += st.fate[slot] == SlotFate::Rerouted;
    stats_.fallback += st.fate[slot] == SlotFate::Fallback;
  }
  stats_.aux += st.aux, stats_.z += st.z, stats_.entropy_loss += st.entropy, stats_.death += st.death;
  stats_.entropy_sum += st.entropy_sum;
}

template <typename T>
double MoeLayer<T>::router_loss(const FfnSlot* slot) const {
  if (!slot) return 0.0;
  const auto& st = static_cast<const MoeSlot<T>&>(*slot);
  return st.aux + st.z + st.entropy + st.death;
}

template <typename T>
const MoeSlot<T>& MoeLayer<T>::default_state() const {
  const FfnSlot* slot = this->default_slot_state();
  MOE_CHECK(slot, "the MoE layer's routing is read before any one-at-a-time forward");
  return static_cast<const MoeSlot<T>&>(*slot);
}

template <typename T>
void MoeLayer<T>::backward(const FfnContext& context, const T* x, const T* dy, T* dx, const T* acts, FfnSlot* slot,
                           T* /*scratch*/, int64_t N) {
  const int64_t D = s_.d_model, E = s_.num_experts, K = s_.top_k, F = s_.expert_hidden, El = local_experts();
  const MoeSlot<T>& st = static_cast<const MoeSlot<T>&>(*slot);
  const ActsView v = carve(const_cast<T*>(acts), N);
  const int64_t M = st.expert_offset[E], R = st.received;
  const int64_t Mf = int64_t(st.fallback_token.size());
  const int64_t shared_scratch = shared_ ? shared_->scratch_size(N) : 0;
  const int64_t fb_rows = std::max<int64_t>(Mf, 1);
  const int64_t fb_scratch = fallback_ ? fallback_->scratch_size(fb_rows) : 0;
  const size_t need =
      size_t(2 * M * D + 2 * R * D + 3 * R * F + 2 * N * E + N * K + shared_scratch + fb_scratch + 2 * fb_rows * D);
  if (scratch_.size() < need) scratch_.resize(need);
  T* c = scratch_.data();
  T* dyp = c;             // (M, D) token side
  T* dxp = (c += M * D);  // (M, D) token side
  T* dye = (c += M * D);  // (R, D) expert side
  T* dxe = (c += R * D);  // (R, D) expert side
  T* dh = (c += R * D);   // (R, F)
  T* da = (c += R * F);   // (R, F)
  T* db = (c += R * F);   // (R, F)
  T* dp = (c += R * F);   // (N, E)
  T* dz = (c += N * E);   // (N, E)
  T* dw = (c += N * E);   // (N K)
  T* sh = (c += N * K);   // shared scratch
  T* fbs = (c += shared_scratch);
  T* dyf = (c += fb_scratch);
  T* dxf = (c += fb_rows * D);
  std::fill_n(dp, N * E, T(0));
  std::fill_n(dz, N * E, T(0));
  std::fill_n(dw, N * K, T(0));

  // Shared experts write dx; otherwise it starts at zero.
  if (shared_)
    shared_->backward(context, x, dy, dx, v.shared_acts, nullptr, sh, N);
  else
    ops_.fill(dx, T(0), N * D);

  // Routed experts, mirrored: un-weight at the token side, dispatch the output gradients to the experts,
  // expert backward per block, combine the input gradients back, scatter them to the tokens.
  const std::vector<int64_t>& row_of_slot = st.row_of_slot;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < M; ++r) {
    const int64_t slot = st.perm_slot[r];
    const T* g = dy + (slot / K) * D;
    const T* out = v.yp + r * D;
    const T w = st.gate[slot];
    double dot = 0;
    for (int64_t d = 0; d < D; ++d) dyp[r * D + d] = w * g[d], dot += double(g[d]) * out[d];
    dw[slot] = T(dot);
  }
  dispatch_rows(st, dyp, dye, D);
  for (int64_t el = 0; el < El; ++el) {
    const int64_t r0 = st.local_offset[el], m = st.local_offset[el + 1] - r0;
    if (m == 0) continue;
    ops_.gemm(true, false, F, D, m, T(1), st.eh.data() + r0 * F, F, dye + r0 * D, D, T(1), dw2_ + el * F * D, D);
    ops_.gemm(false, true, m, F, D, T(1), dye + r0 * D, D, w2_ + el * F * D, D, T(0), dh + r0 * F, F);
  }
  ops_.swiglu_backward(st.ea.data(), st.eb.data(), dh, da, db, R * F);
  for (int64_t el = 0; el < El; ++el) {
    const int64_t r0 = st.local_offset[el], m = st.local_offset[el + 1] - r0;
    if (m == 0) continue;
    const T* xe = st.xe.data() + r0 * D;
    ops_.gemm(true, false, D, F, m, T(1), xe, D, da + r0 * F, F, T(1), dw1_ + el * D * F, F);
    ops_.gemm(true, false, D, F, m, T(1), xe, D, db + r0 * F, F, T(1), dw3_ + el * D * F, F);
    ops_.gemm(false, true, m, D, F, T(1), da + r0 * F, F, w1_ + el * D * F, F, T(0), dxe + r0 * D, D);
    ops_.gemm(false, true, m, D, F, T(1), db + r0 * F, F, w3_ + el * D * F, F, T(1), dxe + r0 * D, D);
  }
  combine_rows(st, dxe, dxp, D);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K; ++j) {
      const int64_t slot = n * K + j;
      if (st.assigned_expert[slot] < 0) continue;
      const T* src = dxp + row_of_slot[slot] * D;
      for (int64_t d = 0; d < D; ++d) dx[n * D + d] += src[d];
    }

  // Dense fallback of overflowed assignments.
  if (fallback_ && Mf > 0) {
    for (int64_t i = 0; i < Mf; ++i) {
      const int64_t n = st.fallback_token[i];
      double dot = 0;
      for (int64_t d = 0; d < D; ++d)
        dyf[i * D + d] = st.fallback_weight[i] * dy[n * D + d], dot += double(dy[n * D + d]) * v.yf[i * D + d];
      for (int64_t j = 0; j < K; ++j)
        if (st.fate[n * K + j] == SlotFate::Fallback) dw[n * K + j] += T(dot);
    }
    fallback_->backward(context, v.xf, dyf, dxf, v.fallback_acts, nullptr, fbs, Mf);
    for (int64_t i = 0; i < Mf; ++i)
      for (int64_t d = 0; d < D; ++d) dx[int64_t(st.fallback_token[i]) * D + d] += dxf[i * D + d];
  }

  router_backward(context, st, x, v.logits, v.scores, dw, dp, dz, dx, N);
}

template class MoeLayer<float>;
template class MoeLayer<double>;

}  // namespace moe
