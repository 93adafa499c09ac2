// Mapping the training state to checkpoint pieces.
#include "launch/train/train_state.h"

#include <algorithm>

#include "checkpoint/writers.h"
#include "core/error.h"

namespace moe {
namespace {

using ckpt::Piece;
using ckpt::Slab;

// This rank's block of `spec` in the global tensor.
Slab block_of(const ParamSpec& spec) { return Slab::box(spec.global_shape(), spec.global_start(), spec.shape); }

// A piece and the group whose members hold it alike (None: this rank alone holds it, as a ZeRO slice).
struct Held {
  Piece piece;
  ParamGroup replicas = ParamGroup::None;
};

// A replica group's size and this rank's position in it, for assign_writers.
struct Members {
  int size = 1, rank = 0;
};
Members members(const ProcessGroups& g, ParamGroup group) {
  switch (group) {
    case ParamGroup::DataParallel:
      return {g.dp->size(), g.dp->rank()};
    case ParamGroup::ExpertDataParallel:
      return {g.edp->size(), g.edp->rank()};
    case ParamGroup::TensorParallel:
      return {g.tp->size(), g.tp->rank()};
    case ParamGroup::World:
      return {g.world->size(), g.world->rank()};
    case ParamGroup::TensorDataParallel:          // the ranks of one pipeline stage
    case ParamGroup::ExpertTensorDataParallel: {  // those of them with this rank's experts
      std::vector<int64_t> ranks = g.grid.group(g.rank, GroupKind::TpDp);
      if (group == ParamGroup::ExpertTensorDataParallel)
        ranks.erase(
            std::remove_if(ranks.begin(), ranks.end(), [&](int64_t m) { return g.grid.coords(m).ep != g.coords.ep; }),
            ranks.end());
      return {int(ranks.size()), int(std::find(ranks.begin(), ranks.end(), g.rank) - ranks.begin())};
    }
    default:
      MOE_FAIL("no replica group " << param_group_name(group) << " for checkpoint pieces");
  }
}

// Of the pieces held, those this rank writes: its own, and the replicated ones assign_writers gives it
// among the members of their replica group (world: the optimizer step; tp x dp: tensors every rank of the
// stage holds whole and the MoE state of its layers; dp: blocks of tensors split over tp; edp: expert tensors (or their
// blocks); etp x edp: the experts' clipping statistics; tp: ZeRO slices of tensors every tp rank holds whole).
std::vector<Piece> written_here(const TrainState& s, std::vector<Held> held) {
  std::vector<bool> mine(held.size(), false);
  for (size_t i = 0; i < held.size(); ++i) mine[i] = held[i].replicas == ParamGroup::None;
  for (const ParamGroup g : {ParamGroup::DataParallel, ParamGroup::ExpertDataParallel, ParamGroup::TensorParallel,
                             ParamGroup::TensorDataParallel, ParamGroup::ExpertTensorDataParallel, ParamGroup::World}) {
    const Members group = members(*s.groups, g);
    std::vector<std::pair<std::string, int64_t>> items;
    std::vector<size_t> index;
    for (size_t i = 0; i < held.size(); ++i)
      if (held[i].replicas == g) items.emplace_back(held[i].piece.tensor, held[i].piece.bytes()), index.push_back(i);
    const std::vector<int> writer = ckpt::assign_writers(items, group.size);
    for (size_t k = 0; k < index.size(); ++k) mine[index[k]] = writer[k] == group.rank;
  }
  std::vector<Piece> out;
  for (size_t i = 0; i < held.size(); ++i)
    if (mine[i]) out.push_back(std::move(held[i].piece));
  return out;
}

// Where the pieces of the parameters and AdamW moments point: the backend's memory when the host can address
// it, else host copies (filled from the device for a save; filled by the load, then uploaded by finish_load).
struct Staged {
  float *params, *m, *v;
};
Staged stage(TrainState& s, bool for_save) {
  Backend& backend = s.model->backend();
  if (backend.memory_is_host()) return {s.model->params(), s.optimizer->first_moment(), s.optimizer->second_moment()};
  const int64_t P = s.model->num_params(), M = s.optimizer->moment_size();
  if (for_save) {
    s.host_params = backend.download(s.model->params(), P);
    s.host_m = backend.download(s.optimizer->first_moment(), M);
    s.host_v = backend.download(s.optimizer->second_moment(), M);
  } else {
    s.host_params.assign(size_t(P), 0.0f), s.host_m.assign(size_t(M), 0.0f), s.host_v.assign(size_t(M), 0.0f);
  }
  return {s.host_params.data(), s.host_m.data(), s.host_v.data()};
}

}  // namespace

double wait_for_snapshot(TrainState& s) { return s.checkpointer ? s.checkpointer->wait_snapshot() : 0.0; }

std::vector<Piece> checkpoint_pieces(TrainState& s, bool for_save) {
  if (for_save) wait_for_snapshot(s);  // the host copies and scalars below may still be being copied
  std::vector<Held> held;
  const ParamTable& table = s.model->table();
  auto add = [&](std::string tensor, ckpt::DType dtype, Slab slab, void* data, ParamGroup replicas) {
    held.push_back({Piece{std::move(tensor), dtype, std::move(slab), data, data}, replicas});
  };
  // Per-expert clipping statistics: the same on every rank holding the expert (summed over its blocks).
  const ParamGroup all = ParamGroup::TensorDataParallel, expert_group = ParamGroup::ExpertTensorDataParallel;

  const Staged staged = stage(s, for_save);
  for (const ParamSpec& spec : table.specs())
    add("params/" + spec.name, ckpt::DType::F32, block_of(spec), staged.params + spec.offset, spec.replicas);

  // AdamW moments, piece by piece (whole tensors, or ZeRO slices), in the same coordinates.
  float* m = staged.m;
  float* v = staged.v;
  for (const AdamW::Piece& op : s.optimizer->pieces()) {
    const ParamSpec* spec = nullptr;
    for (const ParamSpec& sp : table.specs())
      if (op.offset >= sp.offset && op.offset < sp.offset + sp.numel) spec = &sp;
    // A ZeRO slice is a range of the rank's block in its row-major order; otherwise all of it.
    Slab slab = block_of(*spec);
    slab.begin = op.offset - spec->offset, slab.count = op.length;
    // Under ZeRO a slice is this rank's among its data-parallel group; the tp ranks hold the same slice
    // of a tensor they all hold whole.
    const ParamGroup whole_on_tp =
        spec->replicas == ParamGroup::TensorDataParallel ? ParamGroup::TensorParallel : ParamGroup::None;
    const ParamGroup replicas = s.zero ? whole_on_tp : spec->replicas;
    add("optim/exp_avg/" + spec->name, ckpt::DType::F32, slab, m + op.state, replicas);
    add("optim/exp_avg_sq/" + spec->name, ckpt::DType::F32, slab, v + op.state, replicas);
  }
  s.optimizer_steps = s.optimizer->steps_taken();
  // The step is the same on every stage: written once for the whole job.
  add("optim/step", ckpt::DType::I64, Slab::whole({1}), &s.optimizer_steps, ParamGroup::World);

  for (size_t i = 0; i < s.moe_layers.size(); ++i) {
    MoeLayer<float>* layer = s.moe_layers[i];
    const int64_t E = layer->settings().num_experts;
    const std::string prefix = "moe/" + layer->param_prefix();
    add(prefix + ".balancing_bias", ckpt::DType::F32, Slab::whole({E}), layer->balancing_bias().data(), all);
    add(prefix + ".last_used_step", ckpt::DType::I64, Slab::whole({E}), (*s.last_used)[i].data(), all);
    if (!s.capacity_auto) continue;
    CapacityControl& control = layer->capacity_control();
    add(prefix + ".capacity_factor", ckpt::DType::F64, Slab::whole({1}), &control.factor, all);
    add(prefix + ".capacity_steps_above", ckpt::DType::I64, Slab::whole({1}), &control.above, all);
    add(prefix + ".capacity_steps_below", ckpt::DType::I64, Slab::whole({1}), &control.below, all);
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
    const Slab slab = Slab::box({E}, {experts[k].global_index}, {n});
    add("clip/" + experts[k].group + ".norm_ema", ckpt::DType::F64, slab, &s.clip_ema[k], expert_group);
    add("clip/" + experts[k].group + ".samples", ckpt::DType::I64, slab, &s.clip_samples[k], expert_group);
    k = end;
  }
  if (for_save) return written_here(s, std::move(held));
  std::vector<Piece> pieces;
  for (Held& h : held) pieces.push_back(std::move(h.piece));
  return pieces;
}

void finish_load(TrainState& s) {
  Backend& backend = s.model->backend();
  if (!backend.memory_is_host()) {
    backend.copy_to_device(s.model->params(), s.host_params.data(), int64_t(s.host_params.size()));
    backend.copy_to_device(s.optimizer->first_moment(), s.host_m.data(), int64_t(s.host_m.size()));
    backend.copy_to_device(s.optimizer->second_moment(), s.host_v.data(), int64_t(s.host_v.size()));
    backend.synchronize();
  }
  s.optimizer->set_steps_taken(s.optimizer_steps);
  if (s.capacity_auto)
    for (MoeLayer<float>* layer : s.moe_layers) layer->apply_capacity_control();
  auto& experts = s.clip->experts();
  for (size_t k = 0; k < experts.size(); ++k) experts[k].ema = s.clip_ema[k], experts[k].samples = s.clip_samples[k];
}

}  // namespace moe
