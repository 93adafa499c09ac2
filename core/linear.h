// The products of a linear map y = x W, the stuff of a layer's projections: x (rows, in) activations and W (in, out) a
// weight in the parameters' memory, row-major, at the layer's GEMM precision (train.precision; core/backend/ops.h
// GemmArgs). Each is one Ops::gemm that names W as its weight, so that under bf16 GEMMs it is read from the
// parameters' rounded copy. The gradient contract (docs/design.md "Conventions"): dW accumulates, dx is written or,
// with beta 1, added to.
#pragma once

#include <cstdint>

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

template <typename T>
class Linear {
 public:
  Linear(Ops<T>& ops, GemmPrecision precision) : ops_(ops), precision_(precision) {}

  // y (rows, out) = x W + beta y.
  void forward(Rows<const T> x, Rows<const T> w, Rows<T> y, int64_t rows, int64_t in, int64_t out,
               T beta = T(0)) const {
    ops_.gemm({.M = rows,
               .N = out,
               .K = in,
               .A = x.p,
               .lda = x.stride(in),
               .B = w.p,
               .ldb = w.stride(out),
               .beta = beta,
               .C = y.p,
               .ldc = y.stride(out),
               .precision = precision_,
               .weight = GemmWeight::B});
  }
  // dx (rows, in) = dy W^T + beta dx, dy: (rows, out).
  void input_backward(Rows<const T> dy, Rows<const T> w, Rows<T> dx, int64_t rows, int64_t in, int64_t out,
                      T beta = T(0)) const {
    ops_.gemm({.trans_b = true,
               .M = rows,
               .N = in,
               .K = out,
               .A = dy.p,
               .lda = dy.stride(out),
               .B = w.p,
               .ldb = w.stride(out),
               .beta = beta,
               .C = dx.p,
               .ldc = dx.stride(in),
               .precision = precision_,
               .weight = GemmWeight::B});
  }
  // dW (in, out) += x^T dy.
  void weight_backward(Rows<const T> x, Rows<const T> dy, Rows<T> dw, int64_t rows, int64_t in, int64_t out) const {
    ops_.gemm({.trans_a = true,
               .M = in,
               .N = out,
               .K = rows,
               .A = x.p,
               .lda = x.stride(in),
               .B = dy.p,
               .ldb = dy.stride(out),
               .beta = T(1),
               .C = dw.p,
               .ldc = dw.stride(out),
               .precision = precision_});
  }

 private:
  Ops<T>& ops_;
  GemmPrecision precision_;
};

}  // namespace moe
