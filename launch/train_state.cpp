// Mapping the training state to checkpoint pieces.
#include "launch/train_state.h"

namespace moe {
namespace {

using ckpt::Piece;

// The element of the global tensor where this rank's slice of `spec` starts.
int64_t global_base(const ParamSpec& spec) {
  return spec.global_rows > 0 ? spec.shard_offset * (spec.numel / spec.shape[0]) : 0;
}

// Replicated tensors are written by one replica: dense ones by world rank 0, expert ones by the first
// rank of each expert-data-parallel group. ZeRO slices are distinct on every rank: each writes its own.
bool writes(const TrainState& s, bool expert) { return expert ? s.groups->coords.edp == 0 : s.groups->rank == 0; }

}  // namespace

std::vector<Piece> checkpoint_pieces(TrainState& s, bool for_save) {
  std::vector<Piece> pieces;
  const ParamTable& table = s.model->table();
  auto add = [&](std::string tensor, ckpt::DType dtype, std::vector<int64_t> shape, std::vector<int64_t> global_shape,
                 int64_t flat_offset, void* data, bool mine) {
    if (for_save && !mine) return;
    Piece p{std::move(tensor), dtype, std::move(shape), std::move(global_shape), flat_offset, data, data};
    pieces.push_back(std::move(p));
  };

  for (const ParamSpec& spec : table.specs())
    add("params/" + spec.name, ckpt::DType::F32, spec.shape, spec.global_shape(), global_base(spec),
        s.model->params() + spec.offset, writes(s, spec.expert()));

  // AdamW moments, piece by piece (whole tensors, or ZeRO slices), in the same coordinates.
  float* m = s.optimizer->first_moment();
  float* v = s.optimizer->second_moment();
  for (const AdamW::Piece& op : s.optimizer->pieces()) {
    const ParamSpec* spec = nullptr;
    for (const ParamSpec& sp : table.specs())
      if (op.offset >= sp.offset && op.offset < sp.offset + sp.numel) spec = &sp;
    const int64_t offset = global_base(*spec) + (op.offset - spec->offset);
    const bool mine = s.zero ? true : writes(s, spec->expert());
    add("optim/exp_avg/" + spec->name, ckpt::DType::F32, {op.length}, spec->global_shape(), offset, m + op.state, mine);
    add("optim/exp_avg_sq/" + spec->name, ckpt::DType::F32, {op.length}, spec->global_shape(), offset, v + op.state,
        mine);
  }
  s.optimizer_steps = s.optimizer->steps_taken();
  add("optim/step", ckpt::DType::I64, {1}, {1}, 0, &s.optimizer_steps, s.groups->rank == 0);

  for (size_t i = 0; i < s.moe_layers.size(); ++i) {
    MoeLayer<float>* layer = s.moe_layers[i];
    const int64_t E = layer->settings().num_experts;
    const std::string prefix = "moe/" + layer->param_prefix();
    add(prefix + ".balancing_bias", ckpt::DType::F32, {E}, {E}, 0, layer->balancing_bias().data(), s.groups->rank == 0);
    add(prefix + ".last_used_step", ckpt::DType::I64, {E}, {E}, 0, (*s.last_used)[i].data(), s.groups->rank == 0);
  }

  // Per-expert clipping statistics of this rank's experts, by global expert index.
  const auto& experts = s.clip->experts();
  s.clip_ema.resize(experts.size());
  s.clip_samples.resize(experts.size());
  for (size_t k = 0; k < experts.size(); ++k) s.clip_ema[k] = experts[k].ema, s.clip_samples[k] = experts[k].samples;
  for (size_t k = 0; k < experts.size();) {  // one piece per layer: its local experts are consecutive
    size_t end = k;
    while (end < experts.size() && experts[end].group == experts[k].group) ++end;
    const int64_t n = int64_t(end - k), E = experts[k].layer_experts;
    add("clip/" + experts[k].group + ".norm_ema", ckpt::DType::F64, {n}, {E}, experts[k].global_index, &s.clip_ema[k],
        writes(s, true));
    add("clip/" + experts[k].group + ".samples", ckpt::DType::I64, {n}, {E}, experts[k].global_index,
        &s.clip_samples[k], writes(s, true));
    k = end;
  }
  return pieces;
}

void finish_load(TrainState& s) {
  s.optimizer->set_steps_taken(s.optimizer_steps);
  auto& experts = s.clip->experts();
  for (size_t k = 0; k < experts.size(); ++k) experts[k].ema = s.clip_ema[k], experts[k].samples = s.clip_samples[k];
}

}  // namespace moe
