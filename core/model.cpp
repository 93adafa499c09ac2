// The model's forward and backward: one straight sequence of layer calls, the reverse for backward.
#include "core/model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "core/error.h"

namespace moe {

template <typename T>
Model<T>::Model(Backend& backend, ModelOptions<T> options)
    : backend_(backend),
      ops_(backend.ops<T>()),
      shape_(options.shape),
      T_(options.seq_len),
      max_batch_(options.max_batch),
      stage_(options.stage),
      first_(stage_.first_layer),
      end_(stage_.last_layer < 0 ? shape_.layers : stage_.last_layer),
      tp_(std::move(options.tp)) {
  const ModelShape& shape = shape_;
  const StageSpec& stage = stage_;
  const int64_t seq_len = T_, num_slots = options.num_slots;
  const RecomputeSpec& recompute = options.recompute;
  const int64_t V = shape.vocab, D = shape.d_model, H = shape.heads;
  MOE_CHECK(seq_len >= 1 && max_batch_ >= 1,
            "a model for micro-batches of " << max_batch_ << " sequences of " << seq_len << " tokens; both at least 1");
  MOE_CHECK(D % H == 0 && shape.head_dim() % 2 == 0, "d_model " << D << " and heads " << H);
  MOE_CHECK(first_ >= 0 && first_ <= end_ && end_ <= shape.layers,
            "stage layers [" << first_ << ", " << end_ << ") of a model with " << shape.layers);
  MOE_CHECK(!tp_.sequence_parallel || seq_len % tp_.shard.size == 0,
            "sequence length " << seq_len << " over " << tp_.shard.size << " sequence-parallel ranks");
  MOE_CHECK(recompute.layers >= -1 && recompute.layers <= shape.layers,
            "recompute of the first " << recompute.layers << " layers of a model with " << shape.layers
                                      << "; expected -1 (every layer) up to " << shape.layers);
  for (int64_t l = first_; l < end_; ++l) recompute_.push_back(recompute.of_layer(l));
  auto specs = [&] { return int64_t(table_.specs().size()); };
  if (stage.embedding) {
    embedding_ = tp_.embedding ? tp_.embedding() : std::make_unique<TokenEmbedding<T>>(backend, V, D);
    embedding_->register_params(table_);
  }
  embed_specs_ = {0, specs()};
  build_layers(options.ffn_factory, options.attention_factory, options.precision);
  const int64_t head_first = specs();
  if (stage.head) {
    table_.add({"out_norm.gain", {D}, ParamRole::Norm, false, ParamInit::Ones});
    head_ = tp_.head ? tp_.head() : std::make_unique<LmHead<T>>(backend, V, D);
    head_->set_precision(options.precision);
    head_->register_params(table_);
  }
  head_specs_ = {head_first, specs()};
  // Norms see only this rank's rows under sequence parallelism: their gradients are partial sums.
  if (tp_.sequence_parallel && tp_.shard.size > 1)
    table_.mark_partial_over_tp([](const ParamSpec& s) { return s.role == ParamRole::Norm; });

  constexpr DType kType = dtype_of<T>();
  params_ = backend.allocate(kType, table_.numel());
  grads_ = backend.allocate(kType, table_.numel());
  bind_parameters(table_, params_.template data<T>(), grads_.template data<T>());

  // Activations: one arena per slot; the Full layers share one set of layer activations, as large as
  // the largest of theirs.
  MOE_CHECK(num_slots >= 1, num_slots << " micro-batch slots; at least one is needed");
  int64_t shared = 0;
  for (int64_t i = 0; i < stage_layers(); ++i)
    if (recompute_[size_t(i)] == Recompute::Full) shared = std::max(shared, acts_size(i));
  if (shared > 0) shared_acts_ = backend.allocate(kType, shared);
  slots_.resize(size_t(num_slots));
  for (Slot& slot : slots_) make_slot(slot);
  make_scratch();
  if (stage.head) loss_staging_ = std::make_unique<LossStaging<T>>(backend, options.loss_sections, max_batch_ * T_);
}

// Every layer's parameters and gradients, found by name in `table`, which carves `P` and `G`.
template <typename T>
void Model<T>::bind_parameters(const ParamTable& table, T* P, T* G) {
  bound_ = {&table, P, G};
  auto at = [&](const std::string& name) { return table.find(name).offset; };
  blocks_.clear();
  for (int64_t l = first_; l < end_; ++l) {
    const std::string p = "layers." + std::to_string(l);
    const int64_t an = at(p + ".attn_norm.gain"), fn = at(p + ".ffn_norm.gain");
    blocks_.push_back({P + an, P + fn, G + an, G + fn});
    attn_[size_t(l - first_)]->bind(table, P, G);
    ffn_[size_t(l - first_)]->bind(table, P, G);
  }
  if (stage_.embedding) embedding_->bind(table, P, G);
  if (stage_.head) {
    out_norm_ = P + at("out_norm.gain"), d_out_norm_ = G + at("out_norm.gain");
    head_->bind(table, P, G);
  }
}

template <typename T>
void Model<T>::share_parameters(const ParamTable& table, int64_t first_spec, T* params, T* grads) {
  for (size_t i = 0; i < table_.specs().size(); ++i) {
    const ParamSpec& own = table_.specs()[i];
    MOE_CHECK(first_spec + int64_t(i) < int64_t(table.specs().size()) &&
                  table.specs()[size_t(first_spec) + i].name == own.name,
              "the shared parameter table holds this model's '" << own.name << "' at spec " << first_spec + int64_t(i));
  }
  spec_base_ = first_spec;
  bind_parameters(table, params, grads);
  release_parameters();  // this model's own, if still held
}

template <typename T>
void Model<T>::release_parameters() {
  params_ = Buffer(), grads_ = Buffer();
}

// The stage's layers, in the whole model's order and names: attention norm, attention, FFN norm, FFN.
template <typename T>
void Model<T>::build_layers(const FfnFactory& ffn_factory, const AttentionFactory& attention_factory,
                            GemmPrecision precision) {
  const int64_t D = shape_.d_model, L = shape_.layers;
  for (int64_t l = first_; l < end_; ++l) {
    const std::string p = "layers." + std::to_string(l);
    const int64_t first = int64_t(table_.specs().size());
    table_.add({p + ".attn_norm.gain", {D}, ParamRole::Norm, false, ParamInit::Ones});
    attn_.push_back(attention_factory ? attention_factory(l)
                                      : std::make_unique<MhaAttention<T>>(backend_, D, shape_.heads, T_, L, TpShard{},
                                                                          shape_.kv_heads));
    attn_.back()->set_keep_probabilities(recompute_[size_t(l - first_)] != Recompute::Selective);
    attn_.back()->set_precision(precision);
    attn_.back()->register_params(table_, p + ".attn");
    table_.add({p + ".ffn_norm.gain", {D}, ParamRole::Norm, false, ParamInit::Ones});
    ffn_.push_back(ffn_factory ? ffn_factory(l) : std::make_unique<DenseMlp<T>>(backend_, D, shape_.ffn_hidden, L));
    ffn_.back()->set_precision(precision);
    ffn_.back()->register_params(table_, p + ".ffn");
    layer_specs_.emplace_back(first, int64_t(table_.specs().size()));
  }
}

// Scratch of one forward or backward call, shared by all layers and slots.
template <typename T>
void Model<T>::make_scratch() {
  const int64_t N = max_batch_ * T_, R = rows(N), D = shape_.d_model;
  int64_t layer_scratch = head_ ? head_->scratch_size(N) : 0;
  for (const auto& f : ffn_) layer_scratch = std::max(layer_scratch, f->scratch_size(R));
  for (const auto& a : attn_) layer_scratch = std::max(layer_scratch, a->scratch_size(R));
  scratch_ =
      backend_.allocate(dtype_of<T>(), sizes::elements(sizes::model_scratch(double(R), double(D))) + layer_scratch);
  T* cursor = scratch_.template data<T>();
  for (T** p : {&ffn_out_, &dres_, &dtmp_}) *p = cursor, cursor += R * D;
  layer_scratch_ = cursor;
}

template <typename T>
void Model<T>::make_slot(Slot& slot) {
  const int64_t N = max_batch_ * T_, R = rows(N), D = shape_.d_model, L = stage_layers();
  int64_t own = 0;  // the saved activations of the layers not fully recomputed
  for (int64_t i = 0; i < L; ++i)
    if (recompute_[size_t(i)] != Recompute::Full) own += acts_size(i);
  const int64_t head =
      stage_.head ? sizes::elements(sizes::output_norm_activations(double(R), double(D), head_->keeps_input())) +
                        head_->activation_size(N)
                  : 0;
  const int64_t residual = sizes::elements(sizes::residual_stream(double(L), double(R), double(D)));
  slot.arena = backend_.allocate(dtype_of<T>(), residual + own + head);
  T* cursor = slot.arena.template data<T>();
  for (int64_t l = 0; l <= L; ++l, cursor += R * D) slot.x.push_back(cursor);
  for (int64_t i = 0; i < L; ++i) {
    if (recompute_[size_t(i)] == Recompute::Full) {
      T* shared = shared_acts_.template data<T>();  // every Full layer from the start of the shared set
      slot.acts.push_back(carve_acts(i, shared));
    } else {
      slot.acts.push_back(carve_acts(i, cursor));
    }
  }
  if (stage_.head) {
    if (!head_->keeps_input()) slot.xo = cursor, cursor += R * D;  // else the head keeps it, held rounded
    slot.rstd_o = cursor, cursor += R;
    slot.head_acts = cursor, cursor += head_->activation_size(N);
  }
  const sizes::SlotIo io = sizes::slot_io(double(N), double(R), double(D), stage_.embedding, stage_.head);
  slot.losses = backend_.allocate(dtype_of<T>(), sizes::elements(io.losses));
  slot.targets = backend_.allocate(DType::I32, sizes::elements(io.targets));
  slot.inputs = backend_.allocate(DType::I32, sizes::elements(io.inputs));
  slot.input_grad = backend_.allocate(dtype_of<T>(), sizes::elements(io.input_grad));
  slot.host_tokens.assign(size_t(2 * N), 0);
  for (const auto& f : ffn_) slot.ffn.push_back(f->make_slot());
}

// Elements of the activations layer i (of the stage) saves: xa, h, xf (N, D), rstd_a, rstd_f (N), then
// its attention's and its FFN's.
template <typename T>
int64_t Model<T>::acts_size(int64_t i) const {
  const int64_t R = rows(max_batch_ * T_), D = shape_.d_model;
  const bool keeps_input = attn_[size_t(i)]->keeps_input();
  return sizes::elements(sizes::block_activations(double(R), double(D), keeps_input)) +
         attn_[size_t(i)]->activation_size(R) + ffn_[size_t(i)]->activation_size(R);
}

template <typename T>
typename Model<T>::BlockActs Model<T>::carve_acts(int64_t i, T*& cursor) const {
  const int64_t R = rows(max_batch_ * T_), D = shape_.d_model;
  BlockActs a;
  if (!attn_[size_t(i)]->keeps_input()) a.xa = cursor, cursor += R * D;
  for (T** p : {&a.h, &a.xf}) *p = cursor, cursor += R * D;
  a.rstd_a = cursor, cursor += R;
  a.rstd_f = cursor, cursor += R;
  a.attn = cursor, cursor += attn_[size_t(i)]->activation_size(R);
  a.ffn = cursor, cursor += ffn_[size_t(i)]->activation_size(R);
  return a;
}

template <typename T>
int64_t Model<T>::activation_bytes() const {
  int64_t bytes = int64_t(shared_acts_.bytes());
  for (const Slot& slot : slots_) bytes += int64_t(slot.arena.bytes());
  return bytes;
}

template <typename T>
void Model<T>::init_params(uint64_t seed) {
  const ParamTable& table = *bound_.table;
  std::vector<T> host(size_t(table.numel()));
  table.initialize(host.data(), seed);
  backend_.copy_to_device(params(), host.data(), table.numel());
  backend_.synchronize();
}

template <typename T>
void Model<T>::zero_grads() {
  ops_.fill(grads(), T(0), bound_.table->numel());
}

template <typename T>
int64_t Model<T>::local(int64_t layer) const {
  MOE_CHECK(layer >= first_ && layer < end_,
            "layer " << layer << " is outside this stage's [" << first_ << ", " << end_ << ")");
  return layer - first_;
}

template <typename T>
void Model<T>::block_forward(int64_t i, const FfnContext& context, Slot& s, int64_t B) {
  const int64_t N = rows(B * T_), D = shape_.d_model;  // this rank's rows
  const BlockWeights& w = blocks_[size_t(i)];
  const BlockActs& a = s.acts[size_t(i)];
  const T* x_in = s.x[size_t(i)];
  T* x_out = s.x[size_t(i) + 1];
  // h = x + Attn(RMSNorm_a(x)): h starts as a copy of x, made in the norm's pass, and the attention adds into it
  // An attention keeping its input rounded has the norm write it there: the norm, the copy and the cast in one pass.
  Attention<T>& attention = *attn_[size_t(i)];
  if (Rounded<T>* held = attention.held_input(a.attn, N)) {
    ops_.rmsnorm_forward_residual_rounded(x_in, nullptr, a.h, w.attn_norm, held, a.rstd_a, N, D);
    attention.forward(nullptr, a.h, a.attn, layer_scratch_, B);
  } else {
    ops_.rmsnorm_forward_residual(x_in, nullptr, a.h, w.attn_norm, a.xa, a.rstd_a, N, D);
    attention.forward(a.xa, a.h, a.attn, layer_scratch_, B);
  }
  // x = h + FFN(RMSNorm_f(h))
  ops_.rmsnorm_forward(a.h, w.ffn_norm, a.xf, a.rstd_f, N, D);
  ffn_[size_t(i)]->forward(context, a.xf, ffn_out_, a.ffn, s.ffn[size_t(i)].get(), N);
  if (stage_.head && i + 1 == stage_layers())  // the stream's last add and the output norm in one pass
    output_norm(a.h, ffn_out_, x_out, s, B);
  else
    ops_.add(a.h, ffn_out_, x_out, N * D);
}

// xo = RMSNorm_o(x + r) with sum = x + r (r null: x; sum then written only where xo is held), where the head reads
// it: held rounded in its activations when it keeps its input (the norm, the residual add and the cast in one pass),
// else s.xo.
template <typename T>
void Model<T>::output_norm(const T* x, const T* r, T* sum, Slot& s, int64_t B) {
  const int64_t N = rows(B * T_), D = shape_.d_model;
  if (Rounded<T>* held = head_->held_input(s.head_acts, B * T_))
    ops_.rmsnorm_forward_residual_rounded(x, r, sum, out_norm_, held, s.rstd_o, N, D);
  else if (r)
    ops_.rmsnorm_forward_residual(x, r, sum, out_norm_, s.xo, s.rstd_o, N, D);
  else
    ops_.rmsnorm_forward(x, out_norm_, s.xo, s.rstd_o, N, D);
}

template <typename T>
void Model<T>::block_backward(int64_t i, const FfnContext& context, Slot& s, T* dres, int64_t B) {
  // On entry dres = dL/dx_out; on exit dres = dL/dx_in (the residual stream accumulates).
  const int64_t N = rows(B * T_), D = shape_.d_model;  // this rank's rows
  const BlockWeights& w = blocks_[size_t(i)];
  const BlockActs& a = s.acts[size_t(i)];
  const T* x_in = s.x[size_t(i)];
  ffn_[size_t(i)]->backward(context, a.xf, dres, dtmp_, a.ffn, s.ffn[size_t(i)].get(), layer_scratch_,
                            N);                                                              // dtmp = dL/dxf
  ops_.rmsnorm_backward_add(a.h, w.ffn_norm, a.rstd_f, dtmp_, dres, w.d_ffn_norm, N, D);     // dres = dL/dh
  attn_[size_t(i)]->backward(a.xa, dres, dtmp_, a.attn, layer_scratch_, B);                  // dtmp = dL/dxa
  ops_.rmsnorm_backward_add(x_in, w.attn_norm, a.rstd_a, dtmp_, dres, w.d_attn_norm, N, D);  // dres = dL/dx_in
}

template <typename T>
typename Model<T>::Slot& Model<T>::checked_slot(int slot) {
  MOE_CHECK(slot >= 0 && slot < num_slots(), "micro-batch slot " << slot << "; the model has " << num_slots());
  return slots_[size_t(slot)];
}

// tokens are the loader's, on the host: split, checked, then what the stage uses copied to the backend once.
template <typename T>
void Model<T>::stage_inputs(Slot& s, const int32_t* tokens, int64_t B) {
  const int64_t N = B * T_, V = shape_.vocab;
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
  if (stage_.embedding) backend_.copy_to_device(s.inputs.template data<int32_t>(), inputs, N);
  if (stage_.head) backend_.copy_to_device(s.targets.template data<int32_t>(), targets, N);
}

template <typename T>
double Model<T>::forward(int slot, const int32_t* tokens, int64_t B) {
  return forward(slot, tokens, B, nullptr);
}

template <typename T>
double Model<T>::forward(int slot, const int32_t* tokens, int64_t B, const T* input_activation) {
  MOE_CHECK(B >= 1 && B <= max_batch_, "micro-batch of " << B << " sequences; the model was sized for " << max_batch_);
  MOE_CHECK(stage_.embedding == (input_activation == nullptr),
            (stage_.embedding ? "a stage with the embedding takes no input activation"
                              : "a stage without the embedding needs its input activation"));
  Slot& s = checked_slot(slot);
  const int64_t N = B * T_, D = shape_.d_model;
  stage_inputs(s, tokens, B);
  s.batch = B;
  s.context = context_;
  s.context.recomputing = false;

  if (stage_.embedding)
    embedding_->forward(s.inputs.template data<int32_t>(), s.x[0], N);
  else
    ops_.copy(input_activation, s.x[0], rows(N) * D);
  for (int64_t i = 0; i < stage_layers(); ++i) block_forward(i, s.context, s, B);
  return stage_.head ? head_forward(s, N) : 0.0;
}

template <typename T>
double Model<T>::head_forward(Slot& s, int64_t N) {
  // The stage's last block has normalised its output already (block_forward); a stage of the head alone has not
  // (its residual copy goes to dtmp_, free until backward).
  if (stage_layers() == 0) output_norm(s.x.back(), nullptr, dtmp_, s, N / T_);
  head_->forward(s.xo, s.targets.template data<int32_t>(), s.losses.template data<T>(), s.head_acts, N);
  if (staging_losses_) {  // read with the others' (staged_losses)
    loss_staging_->add(s.losses.template data<T>(), N);
    return std::numeric_limits<double>::quiet_NaN();
  }
  // The loss is what the host needs: the per-token losses copied out once, summed in token order.
  const std::vector<T> losses = backend_.download(s.losses.template data<T>(), N);
  return token_loss_sum(losses.data(), N);
}

template <typename T>
void Model<T>::stage_losses() {
  MOE_CHECK(stage_.head, "per-token losses staged on a pipeline stage without the head");
  loss_staging_->clear();
  staging_losses_ = true;
}

template <typename T>
std::vector<double> Model<T>::staged_losses() {
  MOE_CHECK(staging_losses_, "staged losses read without stage_losses()");
  staging_losses_ = false;
  return loss_staging_->read();
}

template <typename T>
void Model<T>::head_backward(Slot& s, double loss_scale, int64_t N) {
  const int64_t D = shape_.d_model;
  head_->backward(s.xo, s.targets.template data<int32_t>(), T(loss_scale), s.head_acts, layer_scratch_, dtmp_, N);
  ops_.rmsnorm_backward(s.x.back(), out_norm_, s.rstd_o, dtmp_, dres_, d_out_norm_, rows(N), D);
  if (grad_ready_) grad_ready_(spec_base_ + head_specs_.first, spec_base_ + head_specs_.second);
}

template <typename T>
void Model<T>::backward(int slot, double loss_scale) {
  backward(slot, loss_scale, nullptr);
}

template <typename T>
void Model<T>::backward(int slot, double loss_scale, const T* output_grad) {
  Slot& s = checked_slot(slot);
  MOE_CHECK(s.batch > 0, "backward of micro-batch slot " << slot << " without a forward into it");
  MOE_CHECK(stage_.head == (output_grad == nullptr),
            (stage_.head ? "a stage with the head takes no output gradient"
                         : "a stage without the head needs the gradient of its output"));
  const int64_t B = s.batch, N = B * T_, D = shape_.d_model;
  if (stage_.head)
    head_backward(s, loss_scale, N);
  else
    ops_.copy(output_grad, dres_, rows(N) * D);
  FfnContext context = s.context;
  context.recomputing = true;  // a recomputed forward must not count routing statistics again
  for (int64_t i = stage_layers() - 1; i >= 0; --i) {
    // Recompute rewrites x[i+1] with the same bits it already holds (same ops on the same input).
    if (recompute_[size_t(i)] == Recompute::Full) block_forward(i, context, s, B);
    block_backward(i, context, s, dres_, B);
    if (grad_ready_)
      grad_ready_(spec_base_ + layer_specs_[size_t(i)].first, spec_base_ + layer_specs_[size_t(i)].second);
  }
  if (!stage_.embedding) {
    ops_.copy(dres_, s.input_grad.template data<T>(), rows(N) * D);
    return;
  }
  embedding_->backward(s.inputs.template data<int32_t>(), dres_, N);
  if (grad_ready_) grad_ready_(spec_base_ + embed_specs_.first, spec_base_ + embed_specs_.second);
}

template <typename T>
double Model<T>::forward_flops(int64_t B) const {
  const int64_t R = rows(B * T_);
  double flops = head_ ? head_->forward_flops(B * T_) : 0.0;
  for (size_t i = 0; i < ffn_.size(); ++i) flops += attn_[i]->forward_flops(R) + ffn_[i]->forward_flops(R);
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
const T* Model<T>::logits(int slot) const {
  MOE_CHECK(slot >= 0 && slot < num_slots(), "micro-batch slot " << slot << "; the model has " << num_slots());
  MOE_CHECK(dynamic_cast<const LmHead<T>*>(head_.get()), "logits of a model without the whole vocabulary's head");
  return slots_[size_t(slot)].head_acts;
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
