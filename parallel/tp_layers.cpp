// The tensor-parallel layers: the shards of core layers between the conjugate mappings.
#include "parallel/tp_layers.h"

#include "core/error.h"
#include "core/linear.h"
#include "core/sizes.h"
#include "parallel/tp_mappings.h"
#include "parallel/vocab_parallel.h"

namespace moe {

namespace {

// Into a tensor-parallel region: the whole rows (N, D) of a tensor of which this rank holds its rows.
// Under sequence parallelism they are all-gathered into `full`; without, every rank holds them already.
// The forward of a region's input (gather_rows / copy_to_region) and the backward of its output
// (reduce_scatter_rows / reduce_from_region) are this same move.
template <typename T>
const T* whole_rows(Backend& backend, const TpContext& tp, const T* mine, T* full, int64_t N, int64_t D) {
  if (!tp.sequence_parallel) return mine;
  tp::gather_rows_forward(backend, *tp.comm, mine, full, tp.rows(N), D);
  return full;
}

// Out of it: partial sums (N, D) on every rank to this rank's rows of their sum in `out` (reduce-scatter
// under sequence parallelism; all-reduce in place without, `out` may be `partial`). The forward of a
// region's output and the backward of its input.
template <typename T>
void summed_rows(Backend& backend, const TpContext& tp, Ops<T>& ops, T* partial, T* out, int64_t N, int64_t D) {
  if (tp.sequence_parallel) {
    tp::reduce_scatter_rows_forward(backend, *tp.comm, partial, out, tp.rows(N), D);
    return;
  }
  tp::reduce_from_region_forward(*tp.comm, partial, N * D);
  if (out != partial) ops.copy(partial, out, N * D);
}

// The wrappers' backward scratch before the shard's: under sequence parallelism the gathered input, the
// gathered output gradient and the input's partial gradient (N, D) each; without, none (the rows are there).
int64_t wrapper_scratch(const TpContext& tp, int64_t N, int64_t D) {
  return sizes::elements(sizes::tp_wrapper_scratch(tp.sequence_parallel, double(N), double(D)));
}

}  // namespace

// ---- Attention --------------------------------------------------------------------------------------

template <typename T>
TpAttention<T>::TpAttention(Backend& backend, TpContext tp, int64_t d_model, int64_t heads, int64_t seq_len,
                            int64_t layers_total, int64_t kv_heads)
    : backend_(backend),
      ops_(backend.ops<T>()),
      tp_(tp),
      D_(d_model),
      T_(seq_len),
      inner_(backend, d_model, heads, seq_len, layers_total, tp.shard(), kv_heads) {
  inner_.set_keep_input(!tp.sequence_parallel);
}

template <typename T>
int64_t TpAttention<T>::scratch_size(int64_t R) const {
  const int64_t N = tp_.tokens(R);
  return wrapper_scratch(tp_, N, D_) + inner_.scratch_size(N);
}

template <typename T>
void TpAttention<T>::forward(const T* x, T* y, T* acts, T* scratch, int64_t B) {
  const int64_t N = B * T_, R = tp_.rows(N), D = D_;
  backend_.reserve(work_, dtype_of<T>(), 2 * N * D + R * D);
  T* partial = work_.template data<T>();
  const T* xg = whole_rows(backend_, tp_, x, partial + N * D, N, D);  // gathered again in backward, not kept
  ops_.fill(partial, T(0), N * D);
  // this rank's heads' share of the output; the shard's scratch where backward has it
  inner_.forward(xg, partial, acts, scratch + wrapper_scratch(tp_, N, D), B);
  T* sum = tp_.sequence_parallel ? partial + 2 * N * D : partial;
  summed_rows(backend_, tp_, ops_, partial, sum, N, D);
  ops_.add_inplace(y, sum, R * D);
}

template <typename T>
void TpAttention<T>::backward(const T* x, const T* dy, T* dx, const T* acts, T* scratch, int64_t B) {
  const int64_t N = B * T_, D = D_;
  T* dxg = tp_.sequence_parallel ? scratch + 2 * N * D : dx;
  inner_.backward(whole_rows(backend_, tp_, x, scratch, N, D), whole_rows(backend_, tp_, dy, scratch + N * D, N, D),
                  dxg, acts, scratch + wrapper_scratch(tp_, N, D), B);
  summed_rows(backend_, tp_, ops_, dxg, dx, N, D);
}

// ---- Dense MLP --------------------------------------------------------------------------------------

template <typename T>
TpMlp<T>::TpMlp(Backend& backend, TpContext tp, int64_t d_model, int64_t hidden, int64_t layers_total)
    : backend_(backend),
      ops_(backend.ops<T>()),
      tp_(tp),
      D_(d_model),
      inner_(backend, d_model, hidden, layers_total, tp.shard()) {}

template <typename T>
int64_t TpMlp<T>::scratch_size(int64_t R) const {
  const int64_t N = tp_.tokens(R);
  return wrapper_scratch(tp_, N, D_) + inner_.scratch_size(N);
}

template <typename T>
void TpMlp<T>::forward(const FfnContext& context, const T* x, T* y, T* acts, FfnSlot*, int64_t R) {
  const int64_t N = tp_.tokens(R), D = D_;
  const bool sp = tp_.sequence_parallel;
  // Without sequence parallelism y holds all N rows: the partial sums go there and are summed in place.
  if (sp) backend_.reserve(work_, dtype_of<T>(), 2 * N * D);
  T* partial = sp ? work_.template data<T>() : y;
  const T* xg = whole_rows(backend_, tp_, x, partial + N * D, N, D);  // gathered again in backward, not kept
  inner_.forward(context, xg, partial, acts, nullptr, N);             // this rank's hidden units' share
  summed_rows(backend_, tp_, ops_, partial, y, N, D);
}

template <typename T>
void TpMlp<T>::backward(const FfnContext& context, const T* x, const T* dy, T* dx, const T* acts, FfnSlot*, T* scratch,
                        int64_t R) {
  const int64_t N = tp_.tokens(R), D = D_;
  T* dxg = tp_.sequence_parallel ? scratch + 2 * N * D : dx;
  inner_.backward(context, whole_rows(backend_, tp_, x, scratch, N, D),
                  whole_rows(backend_, tp_, dy, scratch + N * D, N, D), dxg, acts, nullptr,
                  scratch + wrapper_scratch(tp_, N, D), N);
  summed_rows(backend_, tp_, ops_, dxg, dx, N, D);
}

// ---- A block of the rows for a token-split FFN ------------------------------------------------------

template <typename T>
TokenSplitFfn<T>::TokenSplitFfn(Backend& backend, Communicator& tp, int64_t d_model,
                                std::unique_ptr<FeedForward<T>> inner)
    : backend_(backend), tp_(tp), width_(d_model), inner_(std::move(inner)) {}

template <typename T>
void TokenSplitFfn<T>::forward(const FfnContext& context, const T* x, T* y, T* acts, FfnSlot* slot, int64_t N) {
  const int64_t R = N / tp_.size(), D = width_;
  MOE_CHECK(R * tp_.size() == N, N << " tokens in blocks over " << tp_.size() << " tensor-parallel ranks");
  backend_.reserve(work_, dtype_of<T>(), R * D);
  inner_->forward(context, x + tp_.rank() * R * D, work_.template data<T>(), acts, slot, R);
  tp::gather_rows_forward(backend_, tp_, work_.template data<T>(), y, R, D);
}

template <typename T>
void TokenSplitFfn<T>::backward(const FfnContext& context, const T* x, const T* dy, T* dx, const T* acts, FfnSlot* slot,
                                T* scratch, int64_t N) {
  const int64_t R = N / tp_.size(), D = width_, first = tp_.rank() * R * D;
  backend_.reserve(work_, dtype_of<T>(), R * D);
  inner_->backward(context, x + first, dy + first, work_.template data<T>(), acts, slot, scratch, R);
  tp::gather_rows_forward(backend_, tp_, work_.template data<T>(), dx, R,
                          D);  // the whole gradient: the blocks, gathered
}

// ---- An MoE layer with its experts' hidden width split ---------------------------------------------

template <typename T>
ExpertTpFfn<T>::ExpertTpFfn(Backend& backend, TpContext tp, int64_t d_model, std::unique_ptr<FeedForward<T>> inner)
    : backend_(backend), ops_(backend.ops<T>()), tp_(tp), D_(d_model), inner_(std::move(inner)) {}

template <typename T>
int64_t ExpertTpFfn<T>::scratch_size(int64_t R) const {
  const int64_t N = tp_.tokens(R);
  return wrapper_scratch(tp_, N, D_) + inner_->scratch_size(N);
}

template <typename T>
void ExpertTpFfn<T>::forward(const FfnContext& context, const T* x, T* y, T* acts, FfnSlot* slot, int64_t R) {
  const int64_t N = tp_.tokens(R), D = D_;
  const bool sp = tp_.sequence_parallel;
  if (sp) backend_.reserve(work_, dtype_of<T>(), 2 * N * D);
  T* partial = sp ? work_.template data<T>() : y;  // without sequence parallelism y holds all N rows
  const T* xg = whole_rows(backend_, tp_, x, partial + N * D, N, D);
  inner_->forward(context, xg, partial, acts, slot, N);
  summed_rows(backend_, tp_, ops_, partial, y, N, D);
}

template <typename T>
void ExpertTpFfn<T>::backward(const FfnContext& context, const T* x, const T* dy, T* dx, const T* acts, FfnSlot* slot,
                              T* scratch, int64_t R) {
  const int64_t N = tp_.tokens(R), D = D_;
  T* dxg = tp_.sequence_parallel ? scratch + 2 * N * D : dx;
  inner_->backward(context, whole_rows(backend_, tp_, x, scratch, N, D),
                   whole_rows(backend_, tp_, dy, scratch + N * D, N, D), dxg, acts, slot,
                   scratch + wrapper_scratch(tp_, N, D), N);
  summed_rows(backend_, tp_, ops_, dxg, dx, N, D);
}

// ---- Vocabulary-parallel embedding ------------------------------------------------------------------

template <typename T>
VocabParallelEmbedding<T>::VocabParallelEmbedding(Backend& backend, TpContext tp, int64_t vocab, int64_t d_model)
    : backend_(backend), ops_(backend.ops<T>()), tp_(tp), D_(d_model), inner_(backend, vocab, d_model, tp.shard()) {}

template <typename T>
void VocabParallelEmbedding<T>::forward(const int32_t* tokens, T* x, int64_t N) {
  if (tp_.sequence_parallel) backend_.reserve(work_, dtype_of<T>(), N * D_);
  T* partial = tp_.sequence_parallel ? work_.template data<T>() : x;  // without, x holds all N rows
  inner_.forward(tokens, partial, N);
  summed_rows(backend_, tp_, ops_, partial, x, N, D_);
}

template <typename T>
void VocabParallelEmbedding<T>::backward(const int32_t* tokens, const T* dx, int64_t N) {
  // The whole rows' gradient (without sequence parallelism every rank has it); each rank takes its block's.
  if (tp_.sequence_parallel) backend_.reserve(work_, dtype_of<T>(), N * D_);
  inner_.backward(tokens, whole_rows(backend_, tp_, dx, work_.template data<T>(), N, D_), N);
}

// ---- Vocabulary-parallel head -----------------------------------------------------------------------

template <typename T>
VocabParallelHead<T>::VocabParallelHead(Backend& backend, TpContext tp, int64_t vocab, int64_t d_model)
    : backend_(backend), ops_(backend.ops<T>()), tp_(tp), V_(vocab), Vl_(vocab / tp.comm->size()), D_(d_model) {
  MOE_CHECK(vocab % tp.comm->size() == 0, "vocabulary " << vocab << " over " << tp.comm->size() << " ranks");
}

template <typename T>
void VocabParallelHead<T>::register_params(ParamTable& table) {
  table.add(tp_.shard().block_of({"head.weight", {D_, V_}, ParamRole::Output, true, ParamInit::Normal, 0.02}, 1));
}

template <typename T>
void VocabParallelHead<T>::bind(const ParamTable& table, T* params, T* grads) {
  const int64_t at = table.find("head.weight").offset;
  weight_ = params + at, grad_ = grads + at;
}

template <typename T>
void VocabParallelHead<T>::forward(const T* xo, const int32_t* targets, T* losses, T* acts, int64_t N) {
  if (tp_.sequence_parallel) backend_.reserve(work_, dtype_of<T>(), N * D_);
  T* logits = acts;
  T* lse = logits + N * Vl_;
  const Linear<T> linear(ops_, precision_);
  if (Rounded<T>* xr = held_input(acts, N)) {
    if (xo) ops_.round_values(xo, xr, N * D_);  // null: the output norm wrote it
    linear.forward(HeldRows<T>{xr}, weight_, logits, N, D_, Vl_);
  } else {
    const T* xg = whole_rows(backend_, tp_, xo, work_.template data<T>(), N, D_);  // gathered again in backward
    linear.forward(xg, weight_, logits, N, D_, Vl_);
  }
  tp::vocab_parallel_cross_entropy_forward(backend_, *tp_.comm, logits, targets, losses, lse, N, Vl_);
}

template <typename T>
void VocabParallelHead<T>::backward(const T* xo, const int32_t* targets, T scale, const T* acts, T* scratch, T* dxo,
                                    int64_t N) {
  const T* logits = acts;
  const T* lse = logits + N * Vl_;
  const int64_t L = dlogits_size(N);  // (N, Vl), as stored or held rounded
  T* dxg = scratch + L;               // (N, D)
  const Linear<T> linear(ops_, precision_);
  auto products = [&](const auto& dlogits) {
    if (const Rounded<T>* xr = held_input(const_cast<T*>(acts), N)) {
      linear.weight_backward(HeldRows<T>{xr}, dlogits, grad_, N, D_, Vl_);  // dW += x^T dlogits
    } else {
      const T* xg = whole_rows(backend_, tp_, xo, scratch + L + N * D_, N, D_);  // (N, D) under sequence parallelism
      linear.weight_backward(Rows<const T>(xg), dlogits, grad_, N, D_, Vl_);
    }
    linear.input_backward(dlogits, weight_, dxg, N, D_, Vl_);  // partial dxg
  };
  if (held()) {
    Rounded<T>* dlogits = reinterpret_cast<Rounded<T>*>(scratch);
    tp::vocab_parallel_cross_entropy_backward_rounded(backend_, *tp_.comm, logits, targets, lse, scale, dlogits, N,
                                                      Vl_);
    products(HeldRows<T>{dlogits});
  } else {
    tp::vocab_parallel_cross_entropy_backward(backend_, *tp_.comm, logits, targets, lse, scale, scratch, N, Vl_);
    products(Rows<const T>(scratch));
  }
  summed_rows(backend_, tp_, ops_, dxg, dxo, N, D_);
}

// ---- The model's layout ----------------------------------------------------------------------------

template <typename T>
TensorParallelLayout<T> tensor_parallel_layout(Backend& backend, TpContext tp, const ModelShape& shape) {
  TensorParallelLayout<T> layout;
  if (tp.comm->size() == 1) return layout;
  layout.shard = tp.shard();
  layout.sequence_parallel = tp.sequence_parallel;
  const int64_t V = shape.vocab, D = shape.d_model;
  Backend* b = &backend;
  layout.embedding = [b, tp, V, D] { return std::make_unique<VocabParallelEmbedding<T>>(*b, tp, V, D); };
  layout.head = [b, tp, V, D] { return std::make_unique<VocabParallelHead<T>>(*b, tp, V, D); };
  return layout;
}

template <typename T>
typename Model<T>::AttentionFactory tp_attention_factory(Backend& backend, TpContext tp, const ModelShape& shape,
                                                         int64_t seq_len) {
  if (tp.comm->size() == 1) return nullptr;
  Backend* b = &backend;
  return [b, tp, shape, seq_len](int64_t) -> std::unique_ptr<Attention<T>> {
    return std::make_unique<TpAttention<T>>(*b, tp, shape.d_model, shape.heads, seq_len, shape.layers, shape.kv_heads);
  };
}

template <typename T>
typename Model<T>::FfnFactory tp_ffn_factory(Backend& backend, TpContext tp, const ModelShape& shape,
                                             MoeSettingsOf moe_settings) {
  Backend* b = &backend;
  return [b, tp, shape, moe_settings](int64_t layer) -> std::unique_ptr<FeedForward<T>> {
    const bool split = tp.comm->size() > 1;
    if (std::optional<MoeSettings> s = moe_settings ? moe_settings(layer) : std::nullopt) {
      if (s->expert_tp > 1) {
        MOE_CHECK(s->expert_tp == tp.comm->size(),
                  "experts split over " << s->expert_tp << " of " << tp.comm->size() << " tensor-parallel ranks");
        s->expert_tp_rank = tp.comm->rank();
        return std::make_unique<ExpertTpFfn<T>>(*b, tp, shape.d_model, std::make_unique<MoeLayer<T>>(*b, *s));
      }
      s->token_shards = tp.comm->size(), s->token_shard = tp.comm->rank();
      auto moe = std::make_unique<MoeLayer<T>>(*b, *s);
      if (!split || tp.sequence_parallel) return moe;
      return std::make_unique<TokenSplitFfn<T>>(*b, *tp.comm, shape.d_model, std::move(moe));
    }
    if (split) return std::make_unique<TpMlp<T>>(*b, tp, shape.d_model, shape.ffn_hidden, shape.layers);
    return std::make_unique<DenseMlp<T>>(*b, shape.d_model, shape.ffn_hidden, shape.layers);
  };
}

template <typename T>
void reduce_partial_over_tp(const ParamTable& table, T* grads, Communicator& tp) {
  if (tp.size() == 1) return;
  for (const ParamSpec& spec : table.specs())
    if (spec.partial_over_tp) tp.allreduce_sum(grads + spec.offset, spec.numel);
}

template <typename T>
MoeLayer<T>* moe_layer_of(FeedForward<T>& ffn) {
  if (auto* split = dynamic_cast<TokenSplitFfn<T>*>(&ffn)) return dynamic_cast<MoeLayer<T>*>(&split->inner());
  if (auto* split = dynamic_cast<ExpertTpFfn<T>*>(&ffn)) return dynamic_cast<MoeLayer<T>*>(&split->inner());
  return dynamic_cast<MoeLayer<T>*>(&ffn);
}

template TensorParallelLayout<float> tensor_parallel_layout<float>(Backend&, TpContext, const ModelShape&);
template TensorParallelLayout<double> tensor_parallel_layout<double>(Backend&, TpContext, const ModelShape&);
template Model<float>::AttentionFactory tp_attention_factory<float>(Backend&, TpContext, const ModelShape&, int64_t);
template Model<double>::AttentionFactory tp_attention_factory<double>(Backend&, TpContext, const ModelShape&, int64_t);
template Model<float>::FfnFactory tp_ffn_factory<float>(Backend&, TpContext, const ModelShape&, MoeSettingsOf);
template Model<double>::FfnFactory tp_ffn_factory<double>(Backend&, TpContext, const ModelShape&, MoeSettingsOf);
template void reduce_partial_over_tp<float>(const ParamTable&, float*, Communicator&);
template void reduce_partial_over_tp<double>(const ParamTable&, double*, Communicator&);
template MoeLayer<float>* moe_layer_of<float>(FeedForward<float>&);
template MoeLayer<double>* moe_layer_of<double>(FeedForward<double>&);

template class TpAttention<float>;
template class TpAttention<double>;
template class TpMlp<float>;
template class TpMlp<double>;
template class ExpertTpFfn<float>;
template class ExpertTpFfn<double>;
template class TokenSplitFfn<float>;
template class TokenSplitFfn<double>;
template class VocabParallelEmbedding<float>;
template class VocabParallelEmbedding<double>;
template class VocabParallelHead<float>;
template class VocabParallelHead<double>;

}  // namespace moe
