// An MoE layer's checkpoint state: its router's balancing bias, when each expert last received a token, and with
// adaptive capacity the capacity control. The same on every rank of the stage (each sees the step's counts
// summed over the data-parallel group), so one of the stage's tp x dp ranks writes them.
#include "core/moe_layer.h"

namespace moe {

template <typename T>
std::vector<StatePiece> MoeLayer<T>::state_pieces(StateUse) {
  const int64_t E = s_.num_experts;
  const std::string prefix = "moe/" + prefix_;
  const ParamGroup stage = ParamGroup::TensorDataParallel;
  std::vector<StatePiece> out;
  out.push_back(StatePiece::whole(prefix + ".balancing_bias", DType::F32, {E}, router_.bias().data(), stage));
  out.push_back(StatePiece::whole(prefix + ".last_used_step", DType::I64, {E}, last_used_.data(), stage));
  if (!s_.capacity_auto) return out;
  out.push_back(StatePiece::whole(prefix + ".capacity_factor", DType::F64, {1}, &capacity_.factor, stage));
  out.push_back(StatePiece::whole(prefix + ".capacity_steps_above", DType::I64, {1}, &capacity_.above, stage));
  out.push_back(StatePiece::whole(prefix + ".capacity_steps_below", DType::I64, {1}, &capacity_.below, stage));
  return out;
}

template <typename T>
void MoeLayer<T>::state_restored() {
  if (s_.capacity_auto) apply_capacity_control();
}

template std::vector<StatePiece> MoeLayer<float>::state_pieces(StateUse);
template std::vector<StatePiece> MoeLayer<double>::state_pieces(StateUse);
template void MoeLayer<float>::state_restored();
template void MoeLayer<double>::state_restored();

}  // namespace moe
