// The per-expert clipping statistics as checkpoint state: the same on every rank holding an expert (its norm
// is summed over the expert's blocks), so one of the expert's etp x edp ranks writes them.
#include "optim/per_expert_clip.h"

namespace moe {

std::vector<StatePiece> PerExpertClip::state_pieces(StateUse) {
  saved_ema_.resize(experts_.size());
  saved_samples_.resize(experts_.size());
  for (size_t k = 0; k < experts_.size(); ++k) saved_ema_[k] = experts_[k].ema, saved_samples_[k] = experts_[k].samples;
  std::vector<StatePiece> out;
  const ParamGroup holders = ParamGroup::ExpertTensorDataParallel;
  for (size_t k = 0; k < experts_.size();) {  // one piece per layer: its local experts are consecutive
    size_t end = k;
    while (end < experts_.size() && experts_[end].group == experts_[k].group) ++end;
    const int64_t n = int64_t(end - k), E = experts_[k].layer_experts;
    const std::string& group = experts_[k].group;
    const int64_t first = experts_[k].global_index;
    out.push_back(
        StatePiece::box("clip/" + group + ".norm_ema", DType::F64, {E}, {first}, {n}, &saved_ema_[k], holders));
    out.push_back(
        StatePiece::box("clip/" + group + ".samples", DType::I64, {E}, {first}, {n}, &saved_samples_[k], holders));
    k = end;
  }
  return out;
}

void PerExpertClip::state_restored() {
  for (size_t k = 0; k < experts_.size(); ++k) experts_[k].ema = saved_ema_[k], experts_[k].samples = saved_samples_[k];
}

}  // namespace moe
