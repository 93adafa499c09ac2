// AdamW's checkpoint state: the moments of what this rank owns, in the coordinates of their parameters, and
// the step.
#include "optim/adamw.h"

namespace moe {
namespace {

// The spec of the parameter the flat offset lies in.
const ParamSpec& spec_at(const ParamTable& table, int64_t offset) {
  const ParamSpec* found = nullptr;
  for (const ParamSpec& spec : table.specs())
    if (offset >= spec.offset && offset < spec.offset + spec.numel) found = &spec;
  return *found;
}

}  // namespace

std::vector<StatePiece> AdamW::state_pieces(StateUse use) {
  float* m = first_moment();
  float* v = second_moment();
  if (!backend_.memory_is_host()) {
    if (use == StateUse::Save) {
      host_m_ = backend_.download(first_moment(), moment_size());
      host_v_ = backend_.download(second_moment(), moment_size());
    } else {
      host_m_.assign(size_t(moment_size()), 0.0f), host_v_.assign(size_t(moment_size()), 0.0f);
    }
    m = host_m_.data(), v = host_v_.data();
  }
  std::vector<StatePiece> out;
  for (const Piece& op : pieces_) {
    const ParamSpec& spec = spec_at(table_, op.offset);
    // A ZeRO slice is a range of the rank's block in its row-major order; otherwise all of it. Under ZeRO
    // the slice is this rank's among its data-parallel group; the tp ranks hold the same slice of a tensor
    // they all hold whole.
    const ParamGroup whole_on_tp =
        spec.replicas == ParamGroup::TensorDataParallel ? ParamGroup::TensorParallel : ParamGroup::None;
    const ParamGroup replicas = zero_ ? whole_on_tp : spec.replicas;
    StatePiece piece = StatePiece::block("optim/exp_avg/" + spec.name, DType::F32, spec, m + op.state, replicas);
    piece.begin = op.offset - spec.offset, piece.count = op.length;
    out.push_back(piece);
    piece.tensor = "optim/exp_avg_sq/" + spec.name, piece.data = v + op.state;
    out.push_back(std::move(piece));
  }
  saved_steps_ = t_;
  // The step is the same on every stage: written once for the whole job.
  out.push_back(StatePiece::whole("optim/step", DType::I64, {1}, &saved_steps_, ParamGroup::World));
  return out;
}

void AdamW::state_restored() {
  t_ = saved_steps_;
  if (backend_.memory_is_host()) return;
  backend_.copy_to_device(first_moment(), host_m_.data(), int64_t(host_m_.size()));
  backend_.copy_to_device(second_moment(), host_v_.data(), int64_t(host_v_.size()));
  backend_.synchronize();
}

}  // namespace moe
