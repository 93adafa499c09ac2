// The model's forward and backward: one straight sequence of layer calls, the reverse for backward.
#include "core/model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace moe {

template <typename T>
Model<T>::Model(Backend& backend, const ModelShape& shape, int64_t seq_len, int64_t max_batch, Recompute recompute,
                FfnFactory ffn_factory, int num_slots)
    : backend_(backend),
      ops_(backend.ops<T>()),
      shape_(shape),
      T_(seq_len),
      max_batch_(max_batch),
      recompute_(recompute) {
  const int64_t V = shape.vocab, D = shape.d_model, L = shape.layers, H = shape.heads;
  MOE_CHECK(D % H == 0 && shape.head_dim() % 2 == 0, "d_model " << D << " and heads " << H);
  const double out_std = 0.02 / std::sqrt(2.0 * double(L));  // Wo scaled by 1/sqrt(2L) (MODEL.md)

  table_.add({"embed.weight", {V, D}, ParamRole::Embedding, false, ParamInit::Normal, 0.02});
  auto specs = [&] { return int64_t(table_.specs().size()); };
  embed_specs_ = {0, specs()};
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "layers." + std::to_string(l);
    const int64_t first = specs();
    table_.add({p + ".attn_norm.gain", {D}, ParamRole::Norm, false, ParamInit::Ones});
    table_.add({p + ".attn.wq", {D, D}, ParamRole::Dense, true, ParamInit::Normal, 0.02});
    table_.add({p + ".attn.wk", {D, D}, ParamRole::Dense, true, ParamInit::Normal, 0.02});
    table_.add({p + ".attn.wv", {D, D}, ParamRole::Dense, true, ParamInit::Normal, 0.02});
    table_.add({p + ".attn.wo", {D, D}, ParamRole::Dense, true, ParamInit::Normal, out_std});
    table_.add({p + ".ffn_norm.gain", {D}, ParamRole::Norm, false, ParamInit::Ones});
    ffn_.push_back(ffn_factory ? ffn_factory(l) : std::make_unique<DenseMlp<T>>(backend, D, shape.ffn_hidden, L));
    ffn_.back()->register_params(table_, p + ".ffn");
    layer_specs_.emplace_back(first, specs());
  }
  const int64_t head_first = specs();
  table_.add({"out_norm.gain", {D}, ParamRole::Norm, false, ParamInit::Ones});
  table_.add({"head.weight", {D, V}, ParamRole::Output, true, ParamInit::Normal, 0.02});
  head_specs_ = {head_first, specs()};

  constexpr DType kType = dtype_of<T>();
  params_ = backend.allocate(kType, table_.numel());
  grads_ = backend.allocate(kType, table_.numel());
  T* P = params();
  T* G = grads();
  auto at = [&](const std::string& name) { return table_.find(name).offset; };
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "layers." + std::to_string(l);
    const int64_t an = at(p + ".attn_norm.gain"), q = at(p + ".attn.wq"), k = at(p + ".attn.wk"),
                  v = at(p + ".attn.wv"), o = at(p + ".attn.wo"), fn = at(p + ".ffn_norm.gain");
    blocks_.push_back({P + an, P + q, P + k, P + v, P + o, P + fn, G + an, G + q, G + k, G + v, G + o, G + fn});
    ffn_[l]->bind(table_, P, G);
  }
  embed_ = P + at("embed.weight"), d_embed_ = G + at("embed.weight");
  out_norm_ = P + at("out_norm.gain"), d_out_norm_ = G + at("out_norm.gain");
  head_ = P + at("head.weight"), d_head_ = G + at("head.weight");

  // Activations: one arena per slot; with Recompute::Full one set of layer activations for all.
  const int64_t N = max_batch * seq_len;
  MOE_CHECK(num_slots >= 1, num_slots << " micro-batch slots; at least one is needed");
  if (recompute == Recompute::Full) {
    shared_acts_ = backend.allocate(kType, acts_size());
    T* cursor = shared_acts_.template data<T>();
    carve_acts(cursor);
  }
  slots_.resize(size_t(num_slots));
  for (Slot& slot : slots_) make_slot(slot);

  int64_t ffn_scratch = 0;
  for (const auto& f : ffn_) ffn_scratch = std::max(ffn_scratch, f->scratch_size(N));
  scratch_ = backend.allocate(kType, 7 * N * D + N * V + T_ * T_ + ffn_scratch);
  T* cursor = scratch_.template data<T>();
  for (T** p : {&ffn_out_, &dres_, &dtmp_, &dq_, &dk_, &dv_, &datt_}) *p = cursor, cursor += N * D;
  dlogits_ = cursor, cursor += N * V;
  attn_scratch_ = cursor, cursor += T_ * T_;
  ffn_scratch_ = cursor;
}

template <typename T>
void Model<T>::make_slot(Slot& slot) {
  const int64_t N = max_batch_ * T_, D = shape_.d_model, V = shape_.vocab, L = shape_.layers;
  const bool shared = recompute_ == Recompute::Full;
  slot.arena = backend_.allocate(dtype_of<T>(), (L + 1) * N * D + (shared ? 0 : L * acts_size()) + N * D + N + N * V);
  T* cursor = slot.arena.template data<T>();
  for (int64_t l = 0; l <= L; ++l, cursor += N * D) slot.x.push_back(cursor);
  if (shared) {
    T* shared_cursor = shared_acts_.template data<T>();
    slot.acts.assign(size_t(L), carve_acts(shared_cursor));
  } else {
    for (int64_t l = 0; l < L; ++l) slot.acts.push_back(carve_acts(cursor));
  }
  slot.xo = cursor, cursor += N * D;
  slot.rstd_o = cursor, cursor += N;
  slot.logits = cursor, cursor += N * V;
  slot.losses = backend_.allocate(dtype_of<T>(), N);
  slot.inputs = backend_.allocate(DType::I32, N);
  slot.targets = backend_.allocate(DType::I32, N);
  slot.host_tokens.assign(size_t(2 * N), 0);
  for (const auto& f : ffn_) slot.ffn.push_back(f->make_slot());
}

template <typename T>
int64_t Model<T>::acts_size() const {
  const int64_t N = max_batch_ * T_, D = shape_.d_model, H = shape_.heads;
  int64_t ffn = 0;
  for (const auto& f : ffn_) ffn = std::max(ffn, f->activation_size(N));
  return 8 * N * D + 2 * N + max_batch_ * H * T_ * T_ + ffn;
}

template <typename T>
typename Model<T>::BlockActs Model<T>::carve_acts(T*& cursor) const {
  const int64_t N = max_batch_ * T_, D = shape_.d_model, H = shape_.heads;
  BlockActs a;
  for (T** p : {&a.xa, &a.q, &a.k, &a.v, &a.att, &a.h, &a.xf}) *p = cursor, cursor += N * D;
  a.rstd_a = cursor, cursor += N;
  a.rstd_f = cursor, cursor += N;
  a.probs = cursor, cursor += max_batch_ * H * T_ * T_;
  a.ffn = cursor;
  int64_t ffn = 0;
  for (const auto& f : ffn_) ffn = std::max(ffn, f->activation_size(N));
  cursor += ffn + N * D;  // keeps acts_size() an upper bound of what is carved
  return a;
}

template <typename T>
void Model<T>::init_params(uint64_t seed) {
  std::vector<T> host(size_t(table_.numel()));
  table_.initialize(host.data(), seed);
  backend_.copy_to_device(params(), host.data(), table_.numel());
  backend_.synchronize();
}

template <typename T>
void Model<T>::zero_grads() {
  ops_.fill(grads(), T(0), table_.numel());
}

template <typename T>
void Model<T>::block_forward(int64_t l, const FfnContext& context, Slot& s, int64_t B) {
  const int64_t N = B * T_, D = shape_.d_model, H = shape_.heads, Dh = shape_.head_dim();
  const BlockWeights& w = blocks_[l];
  const BlockActs& a = s.acts[l];
  const T* x_in = s.x[l];
  T* x_out = s.x[l + 1];
  // h = x + Attn(RMSNorm_a(x))
  ops_.rmsnorm_forward(x_in, w.attn_norm, a.xa, a.rstd_a, N, D);
  ops_.gemm(false, false, N, D, D, T(1), a.xa, D, w.wq, D, T(0), a.q, D);
  ops_.gemm(false, false, N, D, D, T(1), a.xa, D, w.wk, D, T(0), a.k, D);
  ops_.gemm(false, false, N, D, D, T(1), a.xa, D, w.wv, D, T(0), a.v, D);
  ops_.rope(a.q, B, T_, H, Dh, false);
  ops_.rope(a.k, B, T_, H, Dh, false);
  ops_.attention_forward(a.q, a.k, a.v, a.att, a.probs, B, T_, H, Dh);
  ops_.copy(x_in, a.h, N * D);
  ops_.gemm(false, false, N, D, D, T(1), a.att, D, w.wo, D, T(1), a.h, D);
  // x = h + FFN(RMSNorm_f(h))
  ops_.rmsnorm_forward(a.h, w.ffn_norm, a.xf, a.rstd_f, N, D);
  ffn_[l]->forward(context, a.xf, ffn_out_, a.ffn, s.ffn[l].get(), N);
  ops_.add(a.h, ffn_out_, x_out, N * D);
}

template <typename T>
void Model<T>::block_backward(int64_t l, const FfnContext& context, Slot& s, T* dres, int64_t B) {
  // On entry dres = dL/dx_out; on exit dres = dL/dx_in (the residual stream accumulates).
  const int64_t N = B * T_, D = shape_.d_model, H = shape_.heads, Dh = shape_.head_dim();
  const BlockWeights& w = blocks_[l];
  const BlockActs& a = s.acts[l];
  const T* x_in = s.x[l];
  ffn_[l]->backward(context, a.xf, dres, dtmp_, a.ffn, s.ffn[l].get(), ffn_scratch_, N);  // dtmp = dL/dxf
  ops_.rmsnorm_backward(a.h, w.ffn_norm, a.rstd_f, dtmp_, datt_, w.d_ffn_norm, N, D);     // datt = via norm
  ops_.add_inplace(dres, datt_, N * D);                                                   // dres = dL/dh
  ops_.gemm(true, false, D, D, N, T(1), a.att, D, dres, D, T(1), w.dwo, D);               // dWo += att^T dh
  ops_.gemm(false, true, N, D, D, T(1), dres, D, w.wo, D, T(0), datt_, D);                // datt = dh Wo^T
  ops_.attention_backward(a.q, a.k, a.v, a.probs, datt_, dq_, dk_, dv_, attn_scratch_, B, T_, H, Dh);
  ops_.rope(dq_, B, T_, H, Dh, true);
  ops_.rope(dk_, B, T_, H, Dh, true);
  ops_.gemm(true, false, D, D, N, T(1), a.xa, D, dq_, D, T(1), w.dwq, D);
  ops_.gemm(true, false, D, D, N, T(1), a.xa, D, dk_, D, T(1), w.dwk, D);
  ops_.gemm(true, false, D, D, N, T(1), a.xa, D, dv_, D, T(1), w.dwv, D);
  ops_.gemm(false, true, N, D, D, T(1), dq_, D, w.wq, D, T(0), dtmp_, D);  // dxa = dq Wq^T
  ops_.gemm(false, true, N, D, D, T(1), dk_, D, w.wk, D, T(1), dtmp_, D);  //     + dk Wk^T
  ops_.gemm(false, true, N, D, D, T(1), dv_, D, w.wv, D, T(1), dtmp_, D);  //     + dv Wv^T
  ops_.rmsnorm_backward(x_in, w.attn_norm, a.rstd_a, dtmp_, datt_, w.d_attn_norm, N, D);
  ops_.add_inplace(dres, datt_, N * D);  // dres = dL/dx_in
}

template <typename T>
typename Model<T>::Slot& Model<T>::checked_slot(int slot) {
  MOE_CHECK(slot >= 0 && slot < num_slots(), "micro-batch slot " << slot << "; the model has " << num_slots());
  return slots_[size_t(slot)];
}

template <typename T>
double Model<T>::forward(int slot, const int32_t* tokens, int64_t B) {
  MOE_CHECK(B >= 1 && B <= max_batch_, "micro-batch of " << B << " sequences; the model was sized for " << max_batch_);
  Slot& s = checked_slot(slot);
  const int64_t N = B * T_, D = shape_.d_model, V = shape_.vocab, L = shape_.layers;
  // tokens are the loader's, on the host: split, checked, then copied to the backend once.
  int32_t* inputs = s.host_tokens.data();
  int32_t* targets = inputs + N;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T_; ++t) {
      inputs[b * T_ + t] = tokens[b * (T_ + 1) + t];
      targets[b * T_ + t] = tokens[b * (T_ + 1) + t + 1];
    }
  for (int64_t i = 0; i < N; ++i)
    MOE_CHECK(inputs[i] >= 0 && inputs[i] < V && targets[i] >= 0 && targets[i] < V,
              "token id outside the vocabulary [0, " << V << ")");
  backend_.copy_to_device(s.inputs.template data<int32_t>(), inputs, N);
  backend_.copy_to_device(s.targets.template data<int32_t>(), targets, N);
  s.batch = B;
  s.context = context_;
  s.context.recomputing = false;

  ops_.embedding_forward(s.inputs.template data<int32_t>(), embed_, s.x[0], N, D);
  for (int64_t l = 0; l < L; ++l) block_forward(l, s.context, s, B);
  ops_.rmsnorm_forward(s.x[L], out_norm_, s.xo, s.rstd_o, N, D);
  ops_.gemm(false, false, N, V, D, T(1), s.xo, D, head_, V, T(0), s.logits, V);
  ops_.cross_entropy_forward(s.logits, s.targets.template data<int32_t>(), s.losses.template data<T>(), N, V);
  // The loss is what the host needs: the per-token losses copied out once, summed in token order.
  const std::vector<T> losses = backend_.download(s.losses.template data<T>(), N);
  double total = 0;
  for (int64_t i = 0; i < N; ++i) total += double(losses[size_t(i)]);
  return total;
}

template <typename T>
void Model<T>::backward(int slot, double loss_scale) {
  Slot& s = checked_slot(slot);
  MOE_CHECK(s.batch > 0, "backward of micro-batch slot " << slot << " without a forward into it");
  const int64_t B = s.batch, N = B * T_, D = shape_.d_model, V = shape_.vocab, L = shape_.layers;
  ops_.cross_entropy_backward(s.logits, s.targets.template data<int32_t>(), T(loss_scale), dlogits_, N, V);
  ops_.gemm(true, false, D, V, N, T(1), s.xo, D, dlogits_, V, T(1), d_head_, V);  // dHead += xo^T dlogits
  ops_.gemm(false, true, N, D, V, T(1), dlogits_, V, head_, V, T(0), dtmp_, D);   // dxo = dlogits Head^T
  ops_.rmsnorm_backward(s.x[L], out_norm_, s.rstd_o, dtmp_, dres_, d_out_norm_, N, D);
  if (grad_ready_) grad_ready_(head_specs_.first, head_specs_.second);
  FfnContext context = s.context;
  context.recomputing = true;  // a recomputed forward must not count routing statistics again
  for (int64_t l = L - 1; l >= 0; --l) {
    // Recompute rewrites x[l+1] with the same bits it already holds (same ops on the same input).
    if (recompute_ == Recompute::Full) block_forward(l, context, s, B);
    block_backward(l, context, s, dres_, B);
    if (grad_ready_) grad_ready_(layer_specs_[l].first, layer_specs_[l].second);
  }
  ops_.embedding_backward(s.inputs.template data<int32_t>(), dres_, d_embed_, N, D);
  if (grad_ready_) grad_ready_(embed_specs_.first, embed_specs_.second);
}

template <typename T>
double Model<T>::forward_flops(int64_t B) const {
  const double N = double(B * T_), D = double(shape_.d_model), V = double(shape_.vocab), Tq = double(T_);
  double flops = 2 * N * D * V;
  for (const auto& f : ffn_) flops += 2 * N * D * D * 4 + 2 * 2 * N * Tq * D + f->forward_flops(B * T_);
  return flops;
}

template <typename T>
void Model<T>::set_context(bool training, int64_t step, int64_t first_sequence, double router_loss_scale,
                           uint64_t seed) {
  context_.training = training;
  context_.step = step;
  context_.first_token = first_sequence * T_;
  context_.router_loss_scale = router_loss_scale;
  context_.seed = seed;
}

template <typename T>
double Model<T>::router_loss(int slot) const {
  MOE_CHECK(slot >= 0 && slot < num_slots(), "micro-batch slot " << slot << "; the model has " << num_slots());
  double total = 0;
  for (size_t l = 0; l < ffn_.size(); ++l) total += ffn_[l]->router_loss(slots_[size_t(slot)].ffn[l].get());
  return total;
}

template class Model<float>;
template class Model<double>;

}  // namespace moe
