// The model's checkpoint state: every parameter of the stage, as its block of the global tensor.
#include "core/model.h"

namespace moe {

template <typename T>
std::vector<StatePiece> Model<T>::state_pieces(StateUse use) {
  T* values = params();
  if (!backend_.memory_is_host()) {
    if (use == StateUse::Save)
      host_params_ = backend_.download(params(), num_params());
    else
      host_params_.assign(size_t(num_params()), T(0));
    values = host_params_.data();
  }
  std::vector<StatePiece> pieces;
  for (const ParamSpec& spec : table().specs())  // with chunks sharing it: the rank's
    pieces.push_back(
        StatePiece::block("params/" + spec.name, dtype_of<T>(), spec, values + spec.offset, spec.replicas));
  return pieces;
}

template <typename T>
void Model<T>::state_restored() {
  if (backend_.memory_is_host()) return;
  backend_.copy_to_device(params(), host_params_.data(), int64_t(host_params_.size()));
  backend_.synchronize();
}

template std::vector<StatePiece> Model<float>::state_pieces(StateUse);
template std::vector<StatePiece> Model<double>::state_pieces(StateUse);
template void Model<float>::state_restored();
template void Model<double>::state_restored();

}  // namespace moe
