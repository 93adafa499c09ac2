// The backend seam: the narrow set of ops every layer is written with (DESIGN.md "Backend").
// Pointers are in the backend's memory (host for the CPU backend). Every op has a CPU reference in
// core/backend/cpu/ and a conformance test; another backend implements this interface and must pass it.
//
// Gradient contract (STYLE.md): parameter gradients accumulate (+=); activation gradients are written (=),
// except where an op says it accumulates (the residual stream).
#pragma once

#include <cstdint>

namespace moe {

template <typename T>
class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* name() const = 0;

  // C(M,N) = alpha * op(A) * op(B) + beta * C, row-major; op(A) is (M,K), op(B) is (K,N).
  virtual void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
                    const T* B, int64_t ldb, T beta, T* C, int64_t ldc) = 0;

  // out: (N, D) = table[tokens]; tokens: (N) in [0, V).
  virtual void embedding_forward(const int32_t* tokens, const T* table, T* out, int64_t N, int64_t D) = 0;
  // dtable[tokens[i]] += dout[i]  (parameter gradient: accumulates).
  virtual void embedding_backward(const int32_t* tokens, const T* dout, T* dtable, int64_t N, int64_t D) = 0;

  // y = x / sqrt(mean(x^2) + eps) * gain; x, y: (N, D); rstd: (N) saved for backward.
  virtual void rmsnorm_forward(const T* x, const T* gain, T* y, T* rstd, int64_t N, int64_t D) = 0;
  // dx = (written); dgain += (accumulates).
  virtual void rmsnorm_backward(const T* x, const T* gain, const T* rstd, const T* dy, T* dx, T* dgain, int64_t N,
                                int64_t D) = 0;

  // Rotary embedding in place on x: (B, T, H, Dh), pairs (2i, 2i+1) of each head rotated by
  // angle t * base^(-2i/Dh). inverse = true applies the transpose (the backward of the forward).
  virtual void rope(T* x, int64_t B, int64_t T_, int64_t H, int64_t Dh, bool inverse) = 0;

  // Causal softmax attention per head. q, k, v, out: (B, T, H*Dh) with head h at columns [h*Dh, (h+1)*Dh);
  // probs: (B, H, T, T) saved for backward (upper triangle zero).
  virtual void attention_forward(const T* q, const T* k, const T* v, T* out, T* probs, int64_t B, int64_t T_, int64_t H,
                                 int64_t Dh) = 0;
  // dq, dk, dv written. scratch: (T, T).
  virtual void attention_backward(const T* q, const T* k, const T* v, const T* probs, const T* dout, T* dq, T* dk,
                                  T* dv, T* scratch, int64_t B, int64_t T_, int64_t H, int64_t Dh) = 0;

  // h = silu(a) * b, elementwise over n.
  virtual void swiglu_forward(const T* a, const T* b, T* h, int64_t n) = 0;
  // da, db written.
  virtual void swiglu_backward(const T* a, const T* b, const T* dh, T* da, T* db, int64_t n) = 0;

  // Cross-entropy of logits (N, V) against targets (N); losses: (N) per-token -log p[target].
  virtual void cross_entropy_forward(const T* logits, const int32_t* targets, T* losses, int64_t N, int64_t V) = 0;
  // dlogits = (softmax(logits) - onehot(target)) * scale (written).
  virtual void cross_entropy_backward(const T* logits, const int32_t* targets, T scale, T* dlogits, int64_t N,
                                      int64_t V) = 0;

  // y += x over n (the residual stream).
  virtual void add_inplace(T* y, const T* x, int64_t n) = 0;
  // y = a + b over n.
  virtual void add(const T* a, const T* b, T* y, int64_t n) = 0;
  virtual void copy(const T* x, T* y, int64_t n) = 0;
  virtual void fill(T* y, T value, int64_t n) = 0;
  virtual void scale(T* y, T factor, int64_t n) = 0;
  // Sum of squares in double, in a fixed order (same result whatever the thread count).
  virtual double sum_squares(const T* x, int64_t n) = 0;
};

// The CPU backend (OpenBLAS + OpenMP), for float and double (double serves the gradient checks).
template <typename T>
Ops<T>& cpu_ops();

// Threads of this process for OpenMP loops and BLAS; 0 picks cores / ranks on this node.
void set_compute_threads(int threads);
int compute_threads();

}  // namespace moe
