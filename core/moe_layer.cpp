// The MoE layer: the wiring of router, dispatch plan, dispatcher and experts, the combine, the shared
// experts and the dense fallback, forward and mirrored backward. See moe_layer.h.
#include "core/moe_layer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <type_traits>

#include "core/error.h"

namespace moe {

template <typename T>
struct MoeLayer<T>::ActsView {
  T *logits, *scores;  // (N, E) raw router logits z, scores p
  T* yp;               // expert outputs back at the token side, permuted order (M, D)
  T *shared_acts, *shared_out;
  T *xf, *fallback_acts, *yf;
};

template <typename T>
MoeLayer<T>::MoeLayer(Backend& backend, const MoeSettings& settings)
    : backend_(backend),
      ops_(backend.ops<T>()),
      s_(settings),
      router_(backend, settings),
      dispatcher_(make_dispatcher<T>(settings.dispatcher, backend, settings.num_experts, settings.ep_size)),
      experts_(backend, settings.d_model, settings.expert_hidden / settings.expert_tp) {
  MOE_CHECK(s_.num_experts >= 1 && s_.top_k >= 1 && s_.top_k <= s_.num_experts,
            "experts " << s_.num_experts << ", top_k " << s_.top_k);
  MOE_CHECK(
      s_.ep_size >= 1 && s_.num_experts % s_.ep_size == 0 && s_.ep_rank >= 0 && s_.ep_rank < s_.ep_size,
      "expert parallelism " << s_.ep_size << " (rank " << s_.ep_rank << ") over " << s_.num_experts << " experts");
  MOE_CHECK(s_.token_shards >= 1 && s_.token_shard >= 0 && s_.token_shard < s_.token_shards,
            "routing group block " << s_.token_shard << " of " << s_.token_shards);
  MOE_CHECK(s_.expert_tp >= 1 && s_.expert_tp_rank >= 0 && s_.expert_tp_rank < s_.expert_tp &&
                s_.expert_hidden % s_.expert_tp == 0 && (s_.expert_tp == 1 || s_.token_shards == 1),
            "expert tensor parallelism " << s_.expert_tp << " (rank " << s_.expert_tp_rank << ") of experts of width "
                                         << s_.expert_hidden << " over " << s_.token_shards << " routing-group blocks");
  const TpShard hidden{s_.expert_tp, s_.expert_tp_rank};  // the shared experts and fallback split like the experts
  if (s_.shared_experts > 0)
    shared_ = std::make_unique<DenseMlp<T>>(backend, s_.d_model, s_.shared_experts * s_.expert_hidden, s_.layers_total,
                                            hidden);
  if (uses_fallback(s_.overflow))
    fallback_ = std::make_unique<DenseMlp<T>>(backend, s_.d_model, s_.fallback_hidden, s_.layers_total, hidden);
  capacity_.factor = s_.capacity_factor;
  reset_stats();
}

template <typename T>
void MoeLayer<T>::register_params(ParamTable& table, const std::string& prefix) {
  prefix_ = prefix;
  const int64_t D = s_.d_model, E = s_.num_experts, F = s_.expert_hidden;
  const double out_std = 0.02 / std::sqrt(2.0 * double(s_.layers_total));
  table.add({prefix + ".router.weight", {D, E}, ParamRole::Router, true, ParamInit::Normal, 0.02});
  if (s_.tau_learned) table.add({prefix + ".tau.log_ratio", {1}, ParamRole::Router, false, ParamInit::Zeros, 0.0});
  // This rank's experts: rows [ep_rank * El, (ep_rank + 1) * El) of the global (E, ...) tensors, and with
  // expert tensor parallelism its block of their hidden width (columns of W1, W3, rows of W2).
  const int64_t El = local_experts(), first = s_.ep_rank * El;
  const TpShard hidden{s_.expert_tp, s_.expert_tp_rank};
  auto add_expert = [&](const char* name, std::vector<int64_t> shape, int hidden_axis, double std,
                        std::vector<std::string> parts = {}) {
    ParamSpec spec{prefix + name, std::move(shape), ParamRole::Expert, true, ParamInit::Normal, std};
    spec.split = {0, E, first, ParamGroup::ExpertParallel};
    spec.parts = std::move(parts);
    table.add(hidden.block_of(spec, hidden_axis, ParamGroup::ExpertTensorParallel));
  };
  // W1 and W3 side by side (each row [W1 row | W3 row]: one GEMM), split on their hidden axis.
  add_expert(".experts.w13", {El, D, 2, F}, 3, 0.02, {prefix + ".experts.w1", prefix + ".experts.w3"});
  add_expert(".experts.w2", {El, F, D}, 1, out_std);
  if (shared_) shared_->register_params(table, prefix + ".shared");
  if (fallback_) fallback_->register_params(table, prefix + ".fallback");
  // Split routing group: the router, shared experts and fallback see this rank's tokens only (and a learned
  // temperature takes its gradient from them).
  if (s_.token_shards > 1)
    table.mark_partial_over_tp([&prefix](const ParamSpec& s) {
      for (const char* part : {".router.", ".shared.", ".fallback.", ".tau."})
        if (s.name.rfind(prefix + part, 0) == 0) return true;
      return false;
    });
}

template <typename T>
void MoeLayer<T>::bind(const ParamTable& table, T* params, T* grads) {
  auto at = [&](const char* name) { return table.find(prefix_ + name).offset; };
  router_.bind(params + at(".router.weight"), grads + at(".router.weight"));
  if (s_.tau_learned) router_.bind_log_tau(params + at(".tau.log_ratio"), grads + at(".tau.log_ratio"));
  experts_.bind(params + at(".experts.w13"), params + at(".experts.w2"), grads + at(".experts.w13"),
                grads + at(".experts.w2"));
  if (shared_) shared_->bind(table, params, grads);
  if (fallback_) fallback_->bind(table, params, grads);
}

template <typename T>
sizes::MoeShape MoeLayer<T>::shape(int64_t N) const {
  // The shared experts and the fallback split their hidden units like the experts.
  return {double(s_.d_model),
          double(s_.num_experts),
          double(s_.top_k),
          double(group_tokens(N)),
          double(N),
          shared_ ? double(s_.shared_experts * s_.expert_hidden / s_.expert_tp) : 0.0,
          fallback_ ? double(s_.fallback_hidden / s_.expert_tp) : 0.0,
          reroutes(s_.overflow),
          held_size<T>(experts_.rounded())};
}

template <typename T>
void MoeLayer<T>::set_precision(GemmPrecision precision) {
  experts_.set_precision(precision);
  if (shared_) shared_->set_precision(precision);
  if (fallback_) fallback_->set_precision(precision);
}

template <typename T>
int64_t MoeLayer<T>::activation_size(int64_t N) const {
  return sizes::elements(sizes::moe_activations(shape(N)));
}

template <typename T>
typename MoeLayer<T>::ActsView MoeLayer<T>::carve(T* acts, int64_t N) const {
  const int64_t D = s_.d_model, E = s_.num_experts, K = s_.top_k, M = N * K;
  ActsView v{};
  T* c = acts;
  v.logits = c, c += group_tokens(N) * E;
  v.scores = c, c += group_tokens(N) * E;
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
  const double n = double(N), D = double(s_.d_model), F = double(s_.expert_hidden / s_.expert_tp);
  double flops = 2 * n * D * double(s_.num_experts) + 6 * n * double(s_.top_k) * D * F;
  if (shared_) flops += shared_->forward_flops(N);
  return flops;
}

template <typename T>
void MoeLayer<T>::reset_stats() {
  stats_ = RouterStepStats{};
  stats_.tokens_per_expert.assign(size_t(s_.num_experts), 0);
}

// ---- Forward -------------------------------------------------------------------------------------

template <typename T>
void MoeLayer<T>::forward(const FfnContext& context, const T* x, T* y, T* acts, FfnSlot* slot, int64_t N) {
  const int64_t D = s_.d_model;
  MOE_CHECK(dispatcher_->ready(), "an MoE layer over " << s_.ep_size
                                                       << " expert-parallel ranks needs an exchange for its "
                                                       << dispatcher_->name() << " dispatcher");
  MOE_CHECK(s_.expert_tp == 1 || (group_ && group_->size() == s_.expert_tp),
            "an MoE layer whose experts are split over " << s_.expert_tp << " ranks needs their group");
  MoeSlot<T>& st = static_cast<MoeSlot<T>&>(*slot);
  const ActsView v = carve(acts, N);
  // Router and plan: scores, selection, gate weights, losses; capacity, overflow, permutation. Each part is a
  // span of the backend's timeline (a trace's "moe ..." spans).
  {
    const auto span = backend_.span("moe router", "moe");
    route(context, x, v, st, N);
    plan(context, st, N);
  }

  // The counts travel to the experts' ranks (where the ranks of the group meet) while this rank uploads its
  // plan, gathers each expert's tokens into its block and computes the shared experts (they need only x);
  // then the blocks go to the experts' ranks.
  const int64_t M = st.plan.rows();
  // One rank: the experts' rows are the tokens' permuted rows in the same order, so the gather writes the
  // experts' input and the experts write the permuted output in place (the dispatch and the combine move nothing).
  // Otherwise kept across forwards: allocating (and zeroing) them every time cost as much as the gather itself.
  const bool alias = aliased_sides();
  if (alias) experts_.resize(st.experts, M);
  // Under bf16 GEMMs the rows are gathered rounded and travel so (GroupedExperts::rounded): the exchange moves them
  // as `width` elements of T a row, bits it never computes on (d_model is even: config_rules.cpp).
  const bool rounded = experts_.rounded();
  const int64_t width = rounded ? D * int64_t(sizeof(Rounded<T>)) / int64_t(sizeof(T)) : D;
  MOE_CHECK(width * int64_t(sizeof(T)) == D * int64_t(rounded ? sizeof(Rounded<T>) : sizeof(T)),
            "rows of " << D << " rounded values are not a whole number of exchange elements");
  if (!alias) backend_.reserve(token_rows_, dtype_of<T>(), M * width);
  void* xp = alias ? st.experts.xe.raw() : token_rows_.raw();
  std::optional<TimelineSpan> span(std::in_place, backend_.timeline(), "moe dispatch", "moe");
  plan_beside(st, [&] {
    const int32_t* token = st.perm_token.template data<int32_t>();
    if (rounded)
      ops_.gather_rows_rounded(x, token, static_cast<Rounded<T>*>(xp), M, D);
    else
      ops_.gather_rows(x, token, nullptr, static_cast<T*>(xp), M, D);
    if (shared_) shared_->forward(context, x, v.shared_out, v.shared_acts, nullptr, N);
  });
  const int64_t R = st.exchange.received;
  MOE_CHECK(!alias || R == M, "one rank's experts receive " << R << " rows of its " << M << " permuted rows");
  if (!alias) experts_.resize(st.experts, R);
  dispatcher_->dispatch(st.exchange, static_cast<const T*>(xp), static_cast<T*>(st.experts.xe.raw()), width);

  // Experts, then their outputs back to the tokens' ranks (the dense fallback computing meanwhile), and the
  // gate-weighted sum, the shared experts' and the fallback's outputs added in that order.
  if (!alias) backend_.reserve(expert_out_, dtype_of<T>(), R * D);
  T* ye = alias ? v.yp : expert_out_.template data<T>();
  span.emplace(backend_.timeline(), "moe experts", "moe");
  experts_.forward(st.exchange.local_offset, st.experts, ye);
  span.emplace(backend_.timeline(), "moe combine", "moe");
  const bool fallback = fallback_ && st.fallback_count > 0;
  combine_beside(st.exchange, ye, v.yp, [&] {
    if (fallback) fallback_forward(context, st, x, v);
  });
  combine(st, v.yp, y, N);
  if (shared_) ops_.add_inplace(y, v.shared_out, N * D);
  if (fallback) {
    const int64_t Mf = st.fallback_count;
    ops_.scatter_add_rows(v.yf, st.fallback_token_rows.template data<int32_t>(), st.fallback_weights.template data<T>(),
                          y, Mf, D);
  }
}

template <typename T>
void MoeLayer<T>::plan_beside(MoeSlot<T>& st, const std::function<void()>& beside) {
  if (!s_.overlap_exchange || s_.ep_size == 1) {
    dispatcher_->plan(st.plan.expert_offset, st.exchange);
    beside();
    return;
  }
  std::unique_ptr<ExchangeHandle> counts = dispatcher_->start_plan(st.plan.expert_offset, st.exchange);
  beside();
  dispatcher_->finish_plan(std::move(counts), st.exchange);
}

template <typename T>
void MoeLayer<T>::dispatch_beside(const ExchangePlan& p, const T* token_rows, T* expert_rows,
                                  const std::function<void()>& beside) {
  if (!s_.overlap_exchange || s_.ep_size == 1) {
    dispatcher_->dispatch(p, token_rows, expert_rows, s_.d_model);
    beside();
    return;
  }
  dispatcher_->start_dispatch(p, token_rows, s_.d_model, in_flight_);
  beside();
  dispatcher_->finish_dispatch(p, in_flight_, expert_rows, s_.d_model);
}

template <typename T>
void MoeLayer<T>::combine_beside(const ExchangePlan& p, const T* expert_rows, T* token_rows,
                                 const std::function<void()>& beside) {
  if (!s_.overlap_exchange || s_.ep_size == 1) {
    dispatcher_->combine(p, expert_rows, token_rows, s_.d_model);
    beside();
    return;
  }
  dispatcher_->start_combine(p, expert_rows, token_rows, s_.d_model, in_flight_);
  beside();
  dispatcher_->finish_combine(p, in_flight_, s_.d_model);
}

template <typename T>
void MoeLayer<T>::route(const FfnContext& context, const T* x, const ActsView& v, MoeSlot<T>& st, int64_t N) {
  if (s_.token_shards == 1) {
    router_.logits(x, v.logits, N);
  } else {
    MOE_CHECK(group_ && group_->size() == s_.token_shards,
              "an MoE layer whose routing group is split over " << s_.token_shards << " ranks needs their all-gather");
    backend_.reserve(local_logits_, dtype_of<T>(), N * s_.num_experts);
    router_.logits(x, local_logits_.template data<T>(), N);
    group_->allgather(local_logits_.template data<T>(), v.logits, N * s_.num_experts);
  }
  st.first_token = s_.token_shard * N;
  router_.route_on_backend(context, v.logits, v.scores, st.routing, group_tokens(N));  // plan waits
}

// The backend plan's buffers of a slot (sizes::moe_plan_buffers), kept across forwards.
template <typename T>
void MoeLayer<T>::reserve_plan(MoeSlot<T>& st, const sizes::MoePlanBuffers& size) {
  backend_.reserve(st.assigned, DType::I32, sizes::elements(size.assigned));
  backend_.reserve(st.expert_offset, DType::I64, sizes::elements(size.expert_offset));
  backend_.reserve(st.plan_counts, DType::I64, sizes::elements(size.plan_counts));
  backend_.reserve(st.perm_slot_rows, DType::I32, sizes::elements(size.perm_slot_rows));
  backend_.reserve(st.slot_row, DType::I32, sizes::elements(size.slot_row));
  backend_.reserve(st.perm_token, DType::I32, sizes::elements(size.perm_token));
  backend_.reserve(st.perm_gate, dtype_of<T>(), sizes::elements(size.perm_gate));
  backend_.reserve(st.gate, dtype_of<T>(), sizes::elements(size.gate));
}

// Capacity in MODEL.md's priority order over the whole routing group, the overflow rerouted (reroute, the cascade),
// the stable permutation by expert (of the group, then this rank's part of it where the group is split), each
// permuted row's token and gate weight, and the dense fallback's rows of this rank's tokens, as ops on the backend
// (the host plan's code is their CPU body, so the same bits); then one wait for what the host needs: the expert
// offsets (the grouped GEMM's row counts, the all-to-all's split sizes; a split group's whole ones for the
// statistics), the plan's counts (the fallback's rows, the statistics), f and the losses' sums.
template <typename T>
void MoeLayer<T>::plan(const FfnContext& context, MoeSlot<T>& st, int64_t N) {
  const int64_t E = s_.num_experts, K = s_.top_k, M = N * K, G = group_tokens(N), lo = st.first_token * K;
  Routing<T>& r = st.routing;
  const sizes::MoePlanBuffers size = sizes::moe_plan_buffers(shape(N));
  reserve_plan(st, size);
  int32_t* assigned = st.assigned.template data<int32_t>();
  int64_t* counts = st.plan_counts.template data<int64_t>();  // rerouted, the fallback's tokens and slots
  const bool by_score = s_.drop_policy == DropPolicy::Probs;
  ops_.capacity_keep(r.selected_on_backend.template data<int32_t>(), router_.selected_scores(), by_score, capacity(G),
                     assigned, G * K, E);
  if (reroutes(s_.overflow))
    ops_.reroute_overflow(router_.preference_rows(), r.choices, router_.selected_scores(), by_score, capacity(G),
                          assigned, counts, G, K, E);
  const bool split = G > N, counting = context.training && !context.recomputing;
  if (split)
    permute_split_group(st, N);
  else
    ops_.permute_by_expert(assigned, st.expert_offset.template data<int64_t>(),
                           st.perm_slot_rows.template data<int32_t>(), st.slot_row.template data<int32_t>(), M, E);
  const T* gate = r.gate_on_backend.template data<T>() + lo;  // this rank's tokens' gate weights
  ops_.permuted_rows(st.perm_slot_rows.template data<int32_t>(), gate, K, st.perm_token.template data<int32_t>(),
                     st.perm_gate.template data<T>(), M);
  ops_.copy(gate, st.gate.template data<T>(), M);
  if (fallback_) fallback_on_backend(st, size, N);
  router_.read_back(r, G, false);
  DispatchPlan& plan = st.plan;
  plan.expert_offset.resize(size_t(E + 1));
  backend_.copy_to_host(plan.expert_offset.data(), st.expert_offset.template data<int64_t>(), E + 1);
  std::vector<int64_t> group_offset(split && counting ? size_t(E + 1) : 0);
  if (!group_offset.empty()) backend_.copy_to_host(group_offset.data(), group_offset_.template data<int64_t>(), E + 1);
  // The counts the plan's ops wrote: the rerouted slots' (reroute), the fallback's tokens and slots (fallback).
  int64_t host_counts[3] = {0, 0, 0};
  const int64_t first = reroutes(s_.overflow) ? 0 : 1, end = fallback_ ? 3 : 1;
  if (end > first) backend_.copy_to_host(host_counts + first, counts + first, end - first);
  backend_.synchronize();
  router_.finish(context, r, G);
  plan.fate.clear(), plan.assigned_expert.clear(), plan.perm_slot.clear(), plan.row_of_slot.clear();
  st.fallback_count = host_counts[1], st.fallback_pair_count = host_counts[2];
  if (counting) count_backend_stats(st, split ? group_offset : plan.expert_offset, host_counts[0], G);
}

// The whole routing group's statistics (as every rank of a split group counts them) from its expert offsets and the
// group's rerouted slots: each selected slot is kept or rerouted (a row), computed by the fallback (where there is
// one, every selected slot left without an expert), or dropped; a token selects min(K, usable experts).
template <typename T>
void MoeLayer<T>::count_backend_stats(const MoeSlot<T>& st, const std::vector<int64_t>& offset, int64_t rerouted,
                                      int64_t G) {
  const int64_t E = s_.num_experts, K = s_.top_k;
  const std::vector<uint8_t>& masked = st.routing.expert_masked;
  const int64_t usable = E - std::count(masked.begin(), masked.end(), uint8_t(1));
  for (int64_t e = 0; e < E; ++e) stats_.tokens_per_expert[size_t(e)] += offset[size_t(e + 1)] - offset[size_t(e)];
  const int64_t selected = G * std::min(K, usable), rows = offset[size_t(E)];
  const int64_t fallback = fallback_ ? selected - rows : 0;
  stats_.rerouted += rerouted, stats_.fallback += fallback, stats_.dropped += selected - rows - fallback;
  count_router_stats(st, G);
}

// A routing group split over ranks: the whole group's permutation (the layer's workspace), then this rank's part of
// it into the slot's buffers (Ops::restrict_permutation: restrict_plan's CPU body).
template <typename T>
void MoeLayer<T>::permute_split_group(MoeSlot<T>& st, int64_t N) {
  const int64_t E = s_.num_experts, K = s_.top_k, G = group_tokens(N), lo = st.first_token * K;
  const sizes::GroupPermutation size = sizes::moe_group_permutation(shape(N));
  backend_.reserve(group_offset_, DType::I64, sizes::elements(size.offset));
  backend_.reserve(group_perm_slot_, DType::I32, sizes::elements(size.perm_slot));
  backend_.reserve(group_row_of_slot_, DType::I32, sizes::elements(size.row_of_slot));
  int64_t* offset = group_offset_.template data<int64_t>();
  int32_t* perm_slot = group_perm_slot_.template data<int32_t>();
  ops_.permute_by_expert(st.assigned.template data<int32_t>(), offset, perm_slot,
                         group_row_of_slot_.template data<int32_t>(), G * K, E);
  ops_.restrict_permutation(offset, perm_slot, lo, lo + N * K, st.expert_offset.template data<int64_t>(),
                            st.perm_slot_rows.template data<int32_t>(), st.slot_row.template data<int32_t>(), G * K, E);
}

template <typename T>
void MoeLayer<T>::fallback_on_backend(MoeSlot<T>& st, const sizes::MoePlanBuffers& size, int64_t N) {
  backend_.reserve(st.fallback_token_rows, DType::I32, sizes::elements(size.fallback_tokens));
  backend_.reserve(st.fallback_weights, dtype_of<T>(), sizes::elements(size.fallback_weights));
  backend_.reserve(st.fallback_slot_source, DType::I32, sizes::elements(size.fallback_sources));
  backend_.reserve(st.fallback_slot, DType::I32, sizes::elements(size.fallback_slots));
  const Routing<T>& r = st.routing;
  const int64_t lo = st.first_token * s_.top_k;  // this rank's tokens' slots in the routing group
  ops_.fallback_rows(r.selected_on_backend.template data<int32_t>() + lo, st.assigned.template data<int32_t>() + lo,
                     r.gate_on_backend.template data<T>() + lo, s_.top_k,
                     st.fallback_token_rows.template data<int32_t>(), st.fallback_weights.template data<T>(),
                     st.fallback_slot_source.template data<int32_t>(), st.fallback_slot.template data<int32_t>(),
                     st.plan_counts.template data<int64_t>() + 1, N);
}

template <typename T>
void MoeLayer<T>::combine(const MoeSlot<T>& st, const T* yp, T* y, int64_t N) const {
  ops_.combine_rows(yp, st.slot_row.template data<int32_t>(), st.gate.template data<T>(), y, N, s_.top_k, s_.d_model,
                    false);
}

// The dense fallback's output yf (Mf, D) of its tokens; the caller adds it to y.
template <typename T>
void MoeLayer<T>::fallback_forward(const FfnContext& context, const MoeSlot<T>& st, const T* x, const ActsView& v) {
  const int64_t D = s_.d_model, Mf = st.fallback_count;
  ops_.gather_rows(x, st.fallback_token_rows.template data<int32_t>(), nullptr, v.xf, Mf, D);
  fallback_->forward(context, v.xf, v.yf, v.fallback_acts, nullptr, Mf);
}

template <typename T>
void MoeLayer<T>::count_router_stats(const MoeSlot<T>& st, int64_t N) {
  stats_.groups += 1;
  stats_.tokens += N;
  const Routing<T>& r = st.routing;
  stats_.aux += r.aux, stats_.z += r.z, stats_.entropy_loss += r.entropy, stats_.death += r.death;
  stats_.warmup += r.warmup, stats_.entropy_sum += r.entropy_sum;
  stats_.tau_sum += r.tau, stats_.capacity_factor_sum += s_.capacity_factor;
}

template <typename T>
double MoeLayer<T>::router_loss(const FfnSlot* slot) const {
  if (!slot) return 0.0;
  return static_cast<const MoeSlot<T>&>(*slot).routing.loss();
}

template <typename T>
const MoeSlot<T>& MoeLayer<T>::host_state() const {
  const MoeSlot<T>& st = default_state();
  if (!st.plan.fate.empty() || st.routing.tokens == 0) return st;
  // Filled once per forward, on demand (tests, benchmarks): the slot is this layer's, written by its forwards. As
  // the host plan keeps them: the whole group's selection and gate weights, this rank's slots' experts and fates.
  MoeSlot<T>& s = const_cast<MoeSlot<T>&>(st);
  const int64_t K = s_.top_k, G = s.routing.tokens, lo = s.first_token * K, M = G / s_.token_shards * K;
  s.routing.selected = backend_.download(s.routing.selected_on_backend.template data<int32_t>(), G * K);
  s.routing.gate = backend_.download(s.routing.gate_on_backend.template data<T>(), G * K);
  s.plan.assigned_expert = backend_.download(s.assigned.template data<int32_t>() + lo, M);
  // A slot's fate from its selection and assignment: a rerouted slot's expert is never one its token selected, and
  // every overflowed slot left without one is the fallback's where there is a fallback.
  const SlotFate unplaced = fallback_ ? SlotFate::Fallback : SlotFate::Dropped;
  s.plan.fate.resize(size_t(M));
  for (size_t slot = 0; slot < size_t(M); ++slot) {
    const int32_t assigned = s.plan.assigned_expert[slot], selected = s.routing.selected[size_t(lo) + slot];
    s.plan.fate[slot] = assigned >= 0   ? (assigned == selected ? SlotFate::Kept : SlotFate::Rerouted)
                        : selected >= 0 ? unplaced
                                        : SlotFate::None;
  }
  return st;
}

template <typename T>
const MoeSlot<T>& MoeLayer<T>::default_state() const {
  const FfnSlot* slot = this->default_slot_state();
  MOE_CHECK(slot, "the MoE layer's routing is read before any one-at-a-time forward");
  return static_cast<const MoeSlot<T>&>(*slot);
}

// ---- Backward ------------------------------------------------------------------------------------

template <typename T>
void MoeLayer<T>::backward(const FfnContext& context, const T* x, const T* dy, T* dx, const T* acts, FfnSlot* slot,
                           T* /*scratch*/, int64_t N) {
  const int64_t D = s_.d_model, E = s_.num_experts, K = s_.top_k, F = s_.expert_hidden / s_.expert_tp;
  const MoeSlot<T>& st = static_cast<const MoeSlot<T>&>(*slot);
  const ActsView v = carve(const_cast<T*>(acts), N);
  const int64_t M = st.plan.rows(), R = st.exchange.received;
  const int64_t Mf = st.fallback_count;
  const int64_t G = group_tokens(N);
  const sizes::RoutedRows rows{double(M), double(R), double(Mf)};
  backend_.reserve(scratch_, dtype_of<T>(), sizes::elements(sizes::moe_backward_scratch(shape(N), rows, double(F))));
  T* c = scratch_.template data<T>();
  T* dyp = c;                                 // (M, D) token side
  T* dxp = (c += M * D);                      // (M, D) token side
  T* dye = (c += M * D);                      // (R, D) expert side
  T* dxe = (c += R * D);                      // (R, D) expert side
  if (aliased_sides()) dye = dyp, dxe = dxp;  // one rank: the same rows, nothing to move
  T* es = (c += R * D);                       // experts' scratch
  T* dp = (c += experts_.scratch_size(R));    // (G, E), the whole routing group's
  T* dz = (c += G * E);                       // (G, E)
  T* dw = (c += G * E);                       // (G K)
  T* sub = (c += G * K);                      // shared experts' or fallback's scratch (used one after the other)
  ops_.fill(dp, T(0), G * E);
  ops_.fill(dz, T(0), G * E);
  ops_.fill(dw, T(0), G * K);
  T* own_dw = dw + st.first_token * K;  // this rank's tokens' slots of the routing group

  // Routed experts, mirrored: un-weight at the token side, dispatch the output gradients to the experts
  // (the shared experts' backward computing meanwhile: it writes dx), expert backward per block, combine the
  // input gradients back (the fallback's backward computing meanwhile), sum them into the tokens' dx (or write
  // it, without shared experts), then the fallback's.
  std::optional<TimelineSpan> span(std::in_place, backend_.timeline(), "moe dispatch", "moe");
  uncombine(st, dy, v.yp, dyp, own_dw);
  dispatch_beside(st.exchange, dyp, dye, [&] {
    if (shared_) shared_->backward(context, x, dy, dx, v.shared_acts, nullptr, sub, N);
  });
  span.emplace(backend_.timeline(), "moe experts", "moe");
  experts_.backward(st.exchange.local_offset, st.experts, dye, es, dxe);
  span.emplace(backend_.timeline(), "moe combine", "moe");
  const bool fallback = fallback_ && Mf > 0;
  combine_beside(st.exchange, dxe, dxp, [&] {
    if (fallback) fallback_backward(context, st, v, dy, own_dw, sub);
  });
  ops_.combine_rows(dxp, st.slot_row.template data<int32_t>(), nullptr, dx, N, K, D, shared_ != nullptr);
  if (fallback)
    ops_.scatter_add_rows(sub + Mf * D, st.fallback_token_rows.template data<int32_t>(), nullptr, dx, Mf, D);

  // Split hidden width: each rank's expert outputs, so its gate-weight gradients, are partial sums.
  if (s_.expert_tp > 1) group_->allreduce_sum(own_dw, N * K);
  span.emplace(backend_.timeline(), "moe router", "moe");
  router_backward(context, st, x, v, dw, dp, dz, dx, N);
}

// The whole group's logits gradient (router losses over every token; gate weights of this rank's tokens,
// the other ranks' are theirs), then the router weight's and the input's from this rank's rows of it.
template <typename T>
void MoeLayer<T>::router_backward(const FfnContext& context, const MoeSlot<T>& st, const T* x, const ActsView& v, T* dw,
                                  T* dp, T* dz, T* dx, int64_t N) {
  const int64_t E = s_.num_experts, G = group_tokens(N);
  router_.logits_backward(context, st.routing, v.logits, v.scores, dw, dp, dz, G, st.first_token, N);
  // With expert tensor parallelism every rank computes the same whole router gradient; its share of the
  // input gradient is added by one rank to the partial sums.
  router_.input_backward(x, dz + st.first_token * E, s_.expert_tp_rank == 0 ? dx : nullptr, N);
}

template <typename T>
void MoeLayer<T>::uncombine(const MoeSlot<T>& st, const T* dy, const T* yp, T* dyp, T* dw) {
  const int64_t D = s_.d_model, M = st.plan.rows();
  const int32_t* perm_token = st.perm_token.template data<int32_t>();
  ops_.gather_rows(dy, perm_token, st.perm_gate.template data<T>(), dyp, M, D);
  // dw of a slot = dy of its token . its expert's output: one value per permuted row, into its slot (each slot
  // at most once, onto zero).
  backend_.reserve(dots_, dtype_of<T>(), M);
  ops_.row_dots(dy, perm_token, yp, dots_.template data<T>(), M, D);
  ops_.scatter_add_rows(dots_.template data<T>(), st.perm_slot_rows.template data<int32_t>(), nullptr, dw, M, 1);
}

// Dense fallback of overflowed assignments: its output's share to each overflowed assignment's gate weight,
// and its input gradient dxf (Mf, D) at scratch + Mf * D, which the caller scatters into dx.
template <typename T>
void MoeLayer<T>::fallback_backward(const FfnContext& context, const MoeSlot<T>& st, const ActsView& v, const T* dy,
                                    T* dw, T* scratch) {
  const int64_t D = s_.d_model, Mf = st.fallback_count;
  T* dyf = scratch;       // (Mf, D)
  T* dxf = dyf + Mf * D;  // (Mf, D)
  T* fbs = dxf + Mf * D;  // the fallback MLP's scratch
  const int32_t* tokens = st.fallback_token_rows.template data<int32_t>();
  ops_.gather_rows(dy, tokens, st.fallback_weights.template data<T>(), dyf, Mf, D);
  // Each overflowed assignment's gate weight gets its token's dot of dy with the fallback's output (its slot
  // has no routed row, so it was zero).
  const int64_t Sf = st.fallback_pair_count;
  backend_.reserve(dots_, dtype_of<T>(), Mf);
  backend_.reserve(fallback_dots_, dtype_of<T>(), Sf);
  ops_.row_dots(dy, tokens, v.yf, dots_.template data<T>(), Mf, D);
  ops_.gather_rows(dots_.template data<T>(), st.fallback_slot_source.template data<int32_t>(), nullptr,
                   fallback_dots_.template data<T>(), Sf, 1);
  ops_.scatter_add_rows(fallback_dots_.template data<T>(), st.fallback_slot.template data<int32_t>(), nullptr, dw, Sf,
                        1);
  fallback_->backward(context, v.xf, dyf, dxf, v.fallback_acts, nullptr, fbs, Mf);
}

template class MoeLayer<float>;
template class MoeLayer<double>;

}  // namespace moe
