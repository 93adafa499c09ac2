// The products of a linear map y = x W, the stuff of a layer's projections: x (rows, in) activations and W (in, out) a
// weight in the parameters' memory, row-major, at the layer's GEMM precision (train.precision; core/backend/ops.h
// GemmArgs). Each is one Ops::gemm that names W as its weight, so that under bf16 GEMMs it is read from the
// parameters' rounded copy. The gradient contract (docs/design.md "Conventions"): dW accumulates, dx is written or,
// with beta 1, added to.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/backend/ops.h"

namespace moe {

// A matrix operand: its first element and the distance between its rows; 0 (a bare pointer) for a contiguous one,
// whose rows are as long as it is wide. A column block of a wider matrix (a head's columns) has that matrix's width.
template <typename P>
struct Rows {
  Rows(P* first, int64_t ld = 0) : p(first), ld(ld) {}  // implicit: a bare pointer is a contiguous matrix
  int64_t stride(int64_t cols) const { return ld > 0 ? ld : cols; }
  P* p;
  int64_t ld;
};

// A matrix operand its producer holds rounded (Rounded<T>: bf16 beside fp32), read by bf16 GEMMs in place of
// rounding it (GemmArgs::A_rounded, B_rounded); its rows as Rows's.
template <typename T>
struct HeldRows {
  int64_t stride(int64_t cols) const { return ld > 0 ? ld : cols; }
  const Rounded<T>* p;
  int64_t ld = 0;
};

// What a Linear product reads a matrix operand as: as stored (Rows) or held rounded (HeldRows).
template <typename X, typename T>
concept LinearOperand = std::is_same_v<X, Rows<const T>> || std::is_same_v<X, HeldRows<T>>;

template <typename T>
class Linear {
 public:
  using Gemm = typename Ops<T>::Gemm;
  Linear(Ops<T>& ops, GemmPrecision precision) : ops_(ops), precision_(precision) {}

  // y (rows, out) = x W + beta y.
  template <typename X>
  requires LinearOperand<X, T>
  void forward(const X& x, Rows<const T> w, Rows<T> y, int64_t rows, int64_t in, int64_t out, T beta = T(0)) const {
    ops_.gemm(with_a({.M = rows,
                      .N = out,
                      .K = in,
                      .lda = x.stride(in),
                      .B = w.p,
                      .ldb = w.stride(out),
                      .beta = beta,
                      .C = y.p,
                      .ldc = y.stride(out),
                      .precision = precision_,
                      .weight = GemmWeight::B},
                     x.p));
  }
  void forward(Rows<const T> x, Rows<const T> w, Rows<T> y, int64_t rows, int64_t in, int64_t out,
               T beta = T(0)) const {
    forward<Rows<const T>>(x, w, y, rows, in, out, beta);
  }
  // dx (rows, in) = dy W^T + beta dx, dy: (rows, out).
  template <typename Y>
  requires LinearOperand<Y, T>
  void input_backward(const Y& dy, Rows<const T> w, Rows<T> dx, int64_t rows, int64_t in, int64_t out,
                      T beta = T(0)) const {
    ops_.gemm(with_a({.trans_b = true,
                      .M = rows,
                      .N = in,
                      .K = out,
                      .lda = dy.stride(out),
                      .B = w.p,
                      .ldb = w.stride(out),
                      .beta = beta,
                      .C = dx.p,
                      .ldc = dx.stride(in),
                      .precision = precision_,
                      .weight = GemmWeight::B},
                     dy.p));
  }
  void input_backward(Rows<const T> dy, Rows<const T> w, Rows<T> dx, int64_t rows, int64_t in, int64_t out,
                      T beta = T(0)) const {
    input_backward<Rows<const T>>(dy, w, dx, rows, in, out, beta);
  }
  // dW (in, out) += x^T dy.
  template <typename X, typename Y>
  requires LinearOperand<X, T> && LinearOperand<Y, T>
  void weight_backward(const X& x, const Y& dy, Rows<T> dw, int64_t rows, int64_t in, int64_t out) const {
    ops_.gemm(with_b(with_a({.trans_a = true,
                             .M = in,
                             .N = out,
                             .K = rows,
                             .lda = x.stride(in),
                             .ldb = dy.stride(out),
                             .beta = T(1),
                             .C = dw.p,
                             .ldc = dw.stride(out),
                             .precision = precision_},
                            x.p),
                     dy.p));
  }
  void weight_backward(Rows<const T> x, Rows<const T> dy, Rows<T> dw, int64_t rows, int64_t in, int64_t out) const {
    weight_backward<Rows<const T>, Rows<const T>>(x, dy, dw, rows, in, out);
  }

 private:
  static Gemm with_a(Gemm g, const T* a) { return g.A = a, g; }
  static Gemm with_a(Gemm g, const Rounded<T>* a) requires(!std::is_same_v<Rounded<T>, T>) {
    return g.A_rounded = a, g;
  }
  static Gemm with_b(Gemm g, const T* b) { return g.B = b, g; }
  static Gemm with_b(Gemm g, const Rounded<T>* b) requires(!std::is_same_v<Rounded<T>, T>) {
    return g.B_rounded = b, g;
  }

  Ops<T>& ops_;
  GemmPrecision precision_;
};

}  // namespace moe
