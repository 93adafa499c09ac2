// The routed experts: grouped GEMMs over contiguous blocks, forward and backward. See experts.h.
#include "core/moe/experts.h"

namespace moe {

template <typename T>
void GroupedExperts<T>::resize(ExpertActs<T>& acts, int64_t R) const {
  constexpr DType kType = dtype_of<T>();
  backend_.reserve(acts.xe, kType, R * D_);
  backend_.reserve(acts.a, kType, R * F_), backend_.reserve(acts.b, kType, R * F_),
      backend_.reserve(acts.h, kType, R * F_);
}

template <typename T>
void GroupedExperts<T>::forward(const std::vector<int64_t>& offset, ExpertActs<T>& acts, T* y) const {
  const int64_t D = D_, F = F_, El = int64_t(offset.size()) - 1, R = offset[El];
  const int64_t* off = offset.data();
  const T* xe = acts.xe.template data<T>();
  T *a = acts.a.template data<T>(), *b = acts.b.template data<T>(), *h = acts.h.template data<T>();
  ops_.grouped_gemm(false, false, El, off, F, D, T(1), xe, w1_, T(0), a);  // a = xe W1
  ops_.grouped_gemm(false, false, El, off, F, D, T(1), xe, w3_, T(0), b);  // b = xe W3
  ops_.swiglu_forward(a, b, h, R * F);
  ops_.grouped_gemm(false, false, El, off, D, F, T(1), h, w2_, T(0), y);  // y = h W2
}

template <typename T>
void GroupedExperts<T>::backward(const std::vector<int64_t>& offset, const ExpertActs<T>& acts, const T* dy, T* scratch,
                                 T* dx) const {
  const int64_t D = D_, F = F_, El = int64_t(offset.size()) - 1, R = offset[El];
  const int64_t* off = offset.data();
  const T* xe = acts.xe.template data<T>();
  const T *a = acts.a.template data<T>(), *b = acts.b.template data<T>(), *h = acts.h.template data<T>();
  T* dh = scratch;                                                         // (R, F)
  T* da = scratch + R * F;                                                 // (R, F)
  T* db = da + R * F;                                                      // (R, F)
  ops_.grouped_gemm(true, false, El, off, D, F, T(1), h, dy, T(1), dw2_);  // dW2 += h^T dy
  ops_.grouped_gemm(false, true, El, off, F, D, T(1), dy, w2_, T(0), dh);  // dh = dy W2^T
  ops_.swiglu_backward(a, b, dh, da, db, R * F);
  ops_.grouped_gemm(true, false, El, off, F, D, T(1), xe, da, T(1), dw1_);  // dW1 += xe^T da
  ops_.grouped_gemm(true, false, El, off, F, D, T(1), xe, db, T(1), dw3_);  // dW3 += xe^T db
  ops_.grouped_gemm(false, true, El, off, D, F, T(1), da, w1_, T(0), dx);   // dx = da W1^T
  ops_.grouped_gemm(false, true, El, off, D, F, T(1), db, w3_, T(1), dx);   //    + db W3^T
}

template class GroupedExperts<float>;
template class GroupedExperts<double>;

}  // namespace moe
