// Mapping the training state to checkpoint pieces.
#include "launch/train/train_state.h"

#include <algorithm>

#include "checkpoint/writers.h"
#include "core/error.h"

namespace moe {
namespace {

using ckpt::Piece;
using ckpt::Slab;

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

ckpt::DType checkpoint_dtype(const StatePiece& p) {
  switch (p.dtype) {
    case DType::F32:
      return ckpt::DType::F32;
    case DType::F64:
      return ckpt::DType::F64;
    case DType::I64:
      return ckpt::DType::I64;
    default:
      MOE_FAIL("checkpoint piece " << p.tensor << " of dtype " << dtype_name(p.dtype) << ": f32, f64 or i64 expected");
  }
}

Held held_piece(const StatePiece& p) {
  Slab slab = Slab::box(p.global_shape, p.start, p.shape);
  slab.begin = p.begin, slab.count = p.count;
  return {Piece{p.tensor, checkpoint_dtype(p), std::move(slab), p.data, p.data}, p.replicas};
}

}  // namespace

double wait_for_snapshot(TrainState& s) { return s.checkpointer ? s.checkpointer->wait_snapshot() : 0.0; }

std::vector<Piece> checkpoint_pieces(TrainState& s, bool for_save) {
  if (for_save) wait_for_snapshot(s);  // the components' copies below may still be being copied
  const StateUse use = for_save ? StateUse::Save : StateUse::Restore;
  std::vector<Held> held;
  for (Stateful* component : s.components)
    for (const StatePiece& p : component->state_pieces(use)) held.push_back(held_piece(p));
  if (for_save) return written_here(s, std::move(held));
  std::vector<Piece> pieces;
  for (Held& h : held) pieces.push_back(std::move(h.piece));
  return pieces;
}

void finish_load(TrainState& s) {
  for (Stateful* component : s.components) component->state_restored();
}

}  // namespace moe
