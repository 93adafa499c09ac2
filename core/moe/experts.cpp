// The routed experts: grouped GEMMs over contiguous blocks, forward and backward. See experts.h.
#include "core/moe/experts.h"

namespace moe {

template <typename T>
void GroupedExperts<T>::resize(ExpertActs<T>& acts, int64_t R) const {
  const DType held = rounded() ? dtype_of<Rounded<T>>() : dtype_of<T>();
  backend_.reserve(acts.xe, held, R * D_);
  backend_.reserve(acts.ab, held, R * 2 * F_), backend_.reserve(acts.h, held, R * F_);
}

template <typename T>
void GroupedExperts<T>::forward(const std::vector<int64_t>& offset, ExpertActs<T>& acts, T* y) const {
  if (rounded())
    ops_.expert_mlp_forward_rounded(mlp(offset), acts.xe.template data<Rounded<T>>(),
                                    acts.ab.template data<Rounded<T>>(), acts.h.template data<Rounded<T>>(), y);
  else
    ops_.expert_mlp_forward(mlp(offset), acts.xe.template data<T>(), acts.ab.template data<T>(),
                            acts.h.template data<T>(), y);
}

template <typename T>
void GroupedExperts<T>::backward(const std::vector<int64_t>& offset, const ExpertActs<T>& acts, const T* dy, T* scratch,
                                 T* dx) const {
  const int64_t R = offset.back(), F = F_;
  T* dh = scratch;  // (R, F)
  if (rounded()) {  // then dab (R, 2F) and dy (R, D), held rounded
    Rounded<T>* dab = reinterpret_cast<Rounded<T>*>(dh + R * F);
    ops_.expert_mlp_backward_rounded(mlp(offset), acts.xe.template data<Rounded<T>>(),
                                     acts.ab.template data<Rounded<T>>(), acts.h.template data<Rounded<T>>(), dy,
                                     dab + R * 2 * F, dh, dab, dx);
  } else {  // then dab (R, 2F)
    ops_.expert_mlp_backward(mlp(offset), acts.xe.template data<T>(), acts.ab.template data<T>(),
                             acts.h.template data<T>(), dy, dh, dh + R * F, dx);
  }
}

template class GroupedExperts<float>;
template class GroupedExperts<double>;

}  // namespace moe
