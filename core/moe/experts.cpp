// The routed experts: grouped GEMMs over contiguous blocks, forward and backward. See experts.h.
#include "core/moe/experts.h"

namespace moe {

template <typename T>
void GroupedExperts<T>::resize(ExpertActs<T>& acts, int64_t R) const {
  acts.xe.resize(size_t(R * D_));
  acts.a.resize(size_t(R * F_)), acts.b.resize(size_t(R * F_)), acts.h.resize(size_t(R * F_));
}

template <typename T>
void GroupedExperts<T>::forward(const std::vector<int64_t>& offset, ExpertActs<T>& acts, T* y) const {
  const int64_t D = D_, F = F_, El = int64_t(offset.size()) - 1, R = offset[El];
  for (int64_t el = 0; el < El; ++el) {
    const int64_t r0 = offset[el], m = offset[el + 1] - r0;
    if (m == 0) continue;
    const T* xe = acts.xe.data() + r0 * D;
    ops_.gemm(false, false, m, F, D, T(1), xe, D, w1_ + el * D * F, F, T(0), acts.a.data() + r0 * F, F);
    ops_.gemm(false, false, m, F, D, T(1), xe, D, w3_ + el * D * F, F, T(0), acts.b.data() + r0 * F, F);
  }
  ops_.swiglu_forward(acts.a.data(), acts.b.data(), acts.h.data(), R * F);
  for (int64_t el = 0; el < El; ++el) {
    const int64_t r0 = offset[el], m = offset[el + 1] - r0;
    if (m == 0) continue;
    ops_.gemm(false, false, m, D, F, T(1), acts.h.data() + r0 * F, F, w2_ + el * F * D, D, T(0), y + r0 * D, D);
  }
}

template <typename T>
void GroupedExperts<T>::backward(const std::vector<int64_t>& offset, const ExpertActs<T>& acts, const T* dy, T* scratch,
                                 T* dx) const {
  const int64_t D = D_, F = F_, El = int64_t(offset.size()) - 1, R = offset[El];
  T* dh = scratch;          // (R, F)
  T* da = scratch + R * F;  // (R, F)
  T* db = da + R * F;       // (R, F)
  for (int64_t el = 0; el < El; ++el) {
    const int64_t r0 = offset[el], m = offset[el + 1] - r0;
    if (m == 0) continue;
    ops_.gemm(true, false, F, D, m, T(1), acts.h.data() + r0 * F, F, dy + r0 * D, D, T(1), dw2_ + el * F * D, D);
    ops_.gemm(false, true, m, F, D, T(1), dy + r0 * D, D, w2_ + el * F * D, D, T(0), dh + r0 * F, F);
  }
  ops_.swiglu_backward(acts.a.data(), acts.b.data(), dh, da, db, R * F);
  for (int64_t el = 0; el < El; ++el) {
    const int64_t r0 = offset[el], m = offset[el + 1] - r0;
    if (m == 0) continue;
    const T* xe = acts.xe.data() + r0 * D;
    ops_.gemm(true, false, D, F, m, T(1), xe, D, da + r0 * F, F, T(1), dw1_ + el * D * F, F);
    ops_.gemm(true, false, D, F, m, T(1), xe, D, db + r0 * F, F, T(1), dw3_ + el * D * F, F);
    ops_.gemm(false, true, m, D, F, T(1), da + r0 * F, F, w1_ + el * D * F, F, T(0), dx + r0 * D, D);
    ops_.gemm(false, true, m, D, F, T(1), db + r0 * F, F, w3_ + el * D * F, F, T(1), dx + r0 * D, D);
  }
}

template class GroupedExperts<float>;
template class GroupedExperts<double>;

}  // namespace moe
