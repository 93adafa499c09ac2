// The ops of the memory-checking backend (core/backend/memory_check.h): each translates its backend pointers
// from the shadow space (core/backend/shadow_memory.h) to the real storage and queues the CPU backend's op on
// the backend's stream (core/backend/deferred_stream.h), so that only ops, never host code, touch backend
// memory, and only after the host synchronises does it see their results. Ops that return a value to the host
// (sum_squares) synchronise first, as on a GPU. Every pointer must lie inside one live buffer with
// the op's extent to spare (a read or write past a buffer's end is refused, naming the op, as a GPU would fault
// or silently corrupt). Host-side arguments (grouped GEMMs' row offsets) are read at the call. The fused-attention
// switch and the parameters' memory are handed on before each op (the GEMM precision travels with each call).
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/backend/deferred_stream.h"
#include "core/backend/ops.h"
#include "core/backend/shadow_memory.h"

namespace moe {

// The conformance suites' coverage (ggml's rule: an op without a case fails the suite). Every op of Ops is
// overridden below (most are pure virtual, so a new op cannot be left out) and marks its id here when a
// caller runs it on this backend; tests/core/test_op_coverage.cpp runs the suites and then asks which ids no
// case reached.
enum class OpId : int {
  gemm,
  embedding_forward,
  embedding_backward,
  rmsnorm_forward,
  rmsnorm_backward,
  rmsnorm_forward_residual,
  rmsnorm_forward_residual_rounded,
  rmsnorm_backward_add,
  rope,
  rope_rounded,
  expand_heads,
  expand_heads_backward,
  attention_forward,
  attention_backward,
  fused_attention_supported,
  attention_forward_fused,
  attention_backward_fused,
  swiglu_forward,
  swiglu_forward_rounded,
  swiglu_backward,
  swiglu_backward_rounded,
  round_values,
  cross_entropy_forward,
  cross_entropy_backward,
  cross_entropy_backward_rounded,
  logits_row_max,
  logits_sum_exp,
  logits_max_over_blocks,
  logits_loss_finish,
  logits_softmax_backward,
  logits_softmax_backward_rounded,
  add_inplace,
  add,
  copy,
  copy_strided,
  fill,
  scale,
  sum_squares,
  sum_squares_into,
  sum_squares_segments_into,
  grouped_gemm,
  expert_mlp_forward,
  expert_mlp_backward,
  expert_mlp_forward_rounded,
  expert_mlp_backward_rounded,
  gumbel_noise,
  softmax_rows,
  sigmoid_rows,
  topk_rows,
  gather_rows,
  gather_rows_rounded,
  scatter_add_rows,
  combine_rows,
  row_dots,
  gate_weights,
  expert_fractions,
  router_loss_sums,
  capacity_keep,
  reroute_overflow,
  fallback_rows,
  permute_by_expert,
  restrict_permutation,
  permuted_rows,
  gate_backward,
  router_loss_backward,
  score_backward,
  adamw_update,
  count
};
inline constexpr const char* kOpNames[] = {"gemm",
                                           "embedding_forward",
                                           "embedding_backward",
                                           "rmsnorm_forward",
                                           "rmsnorm_backward",
                                           "rmsnorm_forward_residual",
                                           "rmsnorm_forward_residual_rounded",
                                           "rmsnorm_backward_add",
                                           "rope",
                                           "rope_rounded",
                                           "expand_heads",
                                           "expand_heads_backward",
                                           "attention_forward",
                                           "attention_backward",
                                           "fused_attention_supported",
                                           "attention_forward_fused",
                                           "attention_backward_fused",
                                           "swiglu_forward",
                                           "swiglu_forward_rounded",
                                           "swiglu_backward",
                                           "swiglu_backward_rounded",
                                           "round_values",
                                           "cross_entropy_forward",
                                           "cross_entropy_backward",
                                           "cross_entropy_backward_rounded",
                                           "logits_row_max",
                                           "logits_sum_exp",
                                           "logits_max_over_blocks",
                                           "logits_loss_finish",
                                           "logits_softmax_backward",
                                           "logits_softmax_backward_rounded",
                                           "add_inplace",
                                           "add",
                                           "copy",
                                           "copy_strided",
                                           "fill",
                                           "scale",
                                           "sum_squares",
                                           "sum_squares_into",
                                           "sum_squares_segments_into",
                                           "grouped_gemm",
                                           "expert_mlp_forward",
                                           "expert_mlp_backward",
                                           "expert_mlp_forward_rounded",
                                           "expert_mlp_backward_rounded",
                                           "gumbel_noise",
                                           "softmax_rows",
                                           "sigmoid_rows",
                                           "topk_rows",
                                           "gather_rows",
                                           "gather_rows_rounded",
                                           "scatter_add_rows",
                                           "combine_rows",
                                           "row_dots",
                                           "gate_weights",
                                           "expert_fractions",
                                           "router_loss_sums",
                                           "capacity_keep",
                                           "reroute_overflow",
                                           "fallback_rows",
                                           "permute_by_expert",
                                           "restrict_permutation",
                                           "permuted_rows",
                                           "gate_backward",
                                           "router_loss_backward",
                                           "score_backward",
                                           "adamw_update"};
static_assert(sizeof(kOpNames) / sizeof(kOpNames[0]) == size_t(OpId::count));
inline std::atomic<bool> g_op_covered[size_t(OpId::count)];
inline void covered(OpId id) { g_op_covered[size_t(id)].store(true, std::memory_order_relaxed); }
// The ops no caller has run on a memory-checking backend in this process.
inline std::vector<std::string> ops_not_covered() {
  std::vector<std::string> missing;
  for (size_t i = 0; i < size_t(OpId::count); ++i)
    if (!g_op_covered[i].load()) missing.push_back(kOpNames[i]);
  return missing;
}

template <typename T>
class StrictOps final : public Ops<T> {
 public:
  // Starts with the inner ops' settings (the CPU backend's: no fused attention).
  StrictOps(Ops<T>& inner, const ShadowMemory& shadow, DeferredStream& stream)
      : inner_(inner), shadow_(shadow), stream_(stream) {
    this->set_fused_attention(inner.fused_attention_allowed());
  }
  const char* name() const override { return inner_.name(); }

  void run_gemm(const typename Ops<T>::Gemm& g) override {
    covered(OpId::gemm);
    const char* op = "gemm";
    typename Ops<T>::Gemm real = g;
    real.A = r(g.A, strided(g.trans_a ? g.K : g.M, g.trans_a ? g.M : g.K, g.lda), op);
    real.A_rounded = r(g.A_rounded, strided(g.trans_a ? g.K : g.M, g.trans_a ? g.M : g.K, g.lda), op);
    real.B = r(g.B, strided(g.trans_b ? g.N : g.K, g.trans_b ? g.K : g.N, g.ldb), op);
    real.B_rounded = r(g.B_rounded, strided(g.trans_b ? g.N : g.K, g.trans_b ? g.K : g.N, g.ldb), op);
    real.C = r(g.C, strided(g.M, g.N, g.ldc), op);
    run([=, this] { inner_.gemm(real); });
  }
  void embedding_forward(const int32_t* tokens, const T* table, int64_t first, int64_t rows, T* out, int64_t N,
                         int64_t D) override {
    covered(OpId::embedding_forward);
    const char* op = "embedding_forward";
    const auto p0 = r(tokens, N, op);
    const auto p1 = r(table, rows * D, op);
    const auto p2 = r(out, N * D, op);
    run([=, this] { inner_.embedding_forward(p0, p1, first, rows, p2, N, D); });
  }
  void embedding_backward(const int32_t* tokens, const T* dout, int64_t first, int64_t rows, T* dtable, int64_t N,
                          int64_t D) override {
    covered(OpId::embedding_backward);
    const char* op = "embedding_backward";
    const auto p0 = r(tokens, N, op);
    const auto p1 = r(dout, N * D, op);
    const auto p2 = r(dtable, rows * D, op);
    run([=, this] { inner_.embedding_backward(p0, p1, first, rows, p2, N, D); });
  }
  void rmsnorm_forward(const T* x, const T* gain, T* y, T* rstd, int64_t N, int64_t D) override {
    covered(OpId::rmsnorm_forward);
    const char* op = "rmsnorm_forward";
    const auto p0 = r(x, N * D, op);
    const auto p1 = r(gain, D, op);
    const auto p2 = r(y, N * D, op);
    const auto p3 = r(rstd, N, op);
    run([=, this] { inner_.rmsnorm_forward(p0, p1, p2, p3, N, D); });
  }
  void rmsnorm_backward(const T* x, const T* gain, const T* rstd, const T* dy, T* dx, T* dgain, int64_t N,
                        int64_t D) override {
    covered(OpId::rmsnorm_backward);
    const char* op = "rmsnorm_backward";
    const auto p0 = r(x, N * D, op);
    const auto p1 = r(gain, D, op);
    const auto p2 = r(rstd, N, op);
    const auto p3 = r(dy, N * D, op);
    const auto p4 = r(dx, N * D, op);
    const auto p5 = r(dgain, D, op);
    run([=, this] { inner_.rmsnorm_backward(p0, p1, p2, p3, p4, p5, N, D); });
  }
  void rmsnorm_forward_residual(const T* x, const T* res, T* sum, const T* gain, T* y, T* rstd, int64_t N,
                                int64_t D) override {
    residual_norm(OpId::rmsnorm_forward_residual, x, res, sum, gain, y, rstd, N, D,
                  [this, N, D](auto... p) { inner_.rmsnorm_forward_residual(p..., N, D); });
  }
  void rmsnorm_forward_residual_rounded(const T* x, const T* res, T* sum, const T* gain, Rounded<T>* y, T* rstd,
                                        int64_t N, int64_t D) override {
    residual_norm(OpId::rmsnorm_forward_residual_rounded, x, res, sum, gain, y, rstd, N, D,
                  [this, N, D](auto... p) { inner_.rmsnorm_forward_residual_rounded(p..., N, D); });
  }
  void rmsnorm_backward_add(const T* x, const T* gain, const T* rstd, const T* dy, T* dres, T* dgain, int64_t N,
                            int64_t D) override {
    covered(OpId::rmsnorm_backward_add);
    const char* op = "rmsnorm_backward_add";
    const auto p0 = r(x, N * D, op);
    const auto p1 = r(gain, D, op);
    const auto p2 = r(rstd, N, op);
    const auto p3 = r(dy, N * D, op);
    const auto p4 = r(dres, N * D, op);
    const auto p5 = r(dgain, D, op);
    run([=, this] { inner_.rmsnorm_backward_add(p0, p1, p2, p3, p4, p5, N, D); });
  }
  void rope(T* x, int64_t B, int64_t T_, int64_t H, int64_t Dh, bool inverse) override {
    covered(OpId::rope);
    const auto p0 = r(x, B * T_ * H * Dh, "rope");
    run([=, this] { inner_.rope(p0, B, T_, H, Dh, inverse); });
  }
  void rope_rounded(const T* x, Rounded<T>* y, int64_t B, int64_t T_, int64_t H, int64_t Dh, bool inverse) override {
    covered(OpId::rope_rounded);
    const char* op = "rope_rounded";
    const auto p0 = r(x, B * T_ * H * Dh, op);
    const auto p1 = r(y, B * T_ * H * Dh, op);
    run([=, this] { inner_.rope_rounded(p0, p1, B, T_, H, Dh, inverse); });
  }
  void expand_heads(const T* x, T* y, int64_t N, int64_t Hkv, int64_t group, int64_t Dh) override {
    covered(OpId::expand_heads);
    const char* op = "expand_heads";
    const auto p0 = r(x, N * Hkv * Dh, op);
    const auto p1 = r(y, N * Hkv * group * Dh, op);
    run([=, this] { inner_.expand_heads(p0, p1, N, Hkv, group, Dh); });
  }
  void expand_heads_backward(const T* dy, T* dx, int64_t N, int64_t Hkv, int64_t group, int64_t Dh) override {
    covered(OpId::expand_heads_backward);
    const char* op = "expand_heads_backward";
    const auto p0 = r(dy, N * Hkv * group * Dh, op);
    const auto p1 = r(dx, N * Hkv * Dh, op);
    run([=, this] { inner_.expand_heads_backward(p0, p1, N, Hkv, group, Dh); });
  }
  void attention_forward(const AttentionForwardArgs<T>& a) override {
    covered(OpId::attention_forward);
    const char* op = "attention_forward";
    check_attention_operands(a, op);  // at the call, as a device's op would
    const AttentionShape& s = a.shape;
    const int64_t n = s.B * s.T * s.H * s.Dh;
    AttentionForwardArgs<T> real = real_operands(a, n, op);
    real.probs = r(a.probs, s.B * s.H * s.T * s.T, op);
    run([=, this] { inner_.attention_forward(real); });
  }
  void attention_backward(const AttentionBackwardArgs<T>& a) override {
    covered(OpId::attention_backward);
    const char* op = "attention_backward";
    check_attention_operands(a, op);  // at the call, as a device's op would
    const AttentionShape& s = a.shape;
    const int64_t n = s.B * s.T * s.H * s.Dh;
    AttentionBackwardArgs<T> real = real_operands(a, n, op);
    real.probs = r(a.probs, s.B * s.H * s.T * s.T, op);
    real.dout = r(a.dout, n, op);
    real.dq = r(a.dq, n, op), real.dk = r(a.dk, n, op), real.dv = r(a.dv, n, op);
    real.scratch = r(a.scratch, s.T * s.T, op);
    run([=, this] { inner_.attention_backward(real); });
  }
  bool fused_attention_supported(const AttentionShape& s) override {
    covered(OpId::fused_attention_supported);
    stream_.synchronize();
    apply(settings());
    return inner_.fused_attention_supported(s);
  }
  void attention_forward_fused(const FusedAttentionForwardArgs<T>& a) override {
    covered(OpId::attention_forward_fused);
    const char* op = "attention_forward_fused";
    check_attention_operands(a, op);  // at the call, as a device's op would
    const AttentionShape& s = a.shape;
    const int64_t n = s.B * s.T * s.H * s.Dh;
    FusedAttentionForwardArgs<T> real = real_operands(a, n, op);
    real.stats = r(a.stats, s.B * s.H * s.T, op);
    run([=, this] { inner_.attention_forward_fused(real); });
  }
  void attention_backward_fused(const FusedAttentionBackwardArgs<T>& a) override {
    covered(OpId::attention_backward_fused);
    const char* op = "attention_backward_fused";
    check_attention_operands(a, op);  // at the call, as a device's op would
    const AttentionShape& s = a.shape;
    const int64_t n = s.B * s.T * s.H * s.Dh;
    FusedAttentionBackwardArgs<T> real = real_operands(a, n, op);
    real.stats = r(a.stats, s.B * s.H * s.T, op);
    real.dout = r(a.dout, n, op);
    real.dq = r(a.dq, n, op), real.dk = r(a.dk, n, op), real.dv = r(a.dv, n, op);
    run([=, this] { inner_.attention_backward_fused(real); });
  }
  void swiglu_forward(const T* ab, T* h, int64_t rows, int64_t F) override {
    covered(OpId::swiglu_forward);
    const char* op = "swiglu_forward";
    const auto p0 = r(ab, rows * 2 * F, op);
    const auto p1 = r(h, rows * F, op);
    run([=, this] { inner_.swiglu_forward(p0, p1, rows, F); });
  }
  void swiglu_forward_rounded(const Rounded<T>* ab, Rounded<T>* h, int64_t rows, int64_t F) override {
    covered(OpId::swiglu_forward_rounded);
    const char* op = "swiglu_forward_rounded";
    const auto p0 = r(ab, rows * 2 * F, op);
    const auto p1 = r(h, rows * F, op);
    run([=, this] { inner_.swiglu_forward_rounded(p0, p1, rows, F); });
  }
  void round_values(const T* x, Rounded<T>* out, int64_t n) override {
    covered(OpId::round_values);
    const auto p0 = r(x, n, "round_values");
    const auto p1 = r(out, n, "round_values");
    run([=, this] { inner_.round_values(p0, p1, n); });
  }
  void swiglu_backward_rounded(const Rounded<T>* ab, const T* dh, Rounded<T>* dab, int64_t rows, int64_t F) override {
    covered(OpId::swiglu_backward_rounded);
    const char* op = "swiglu_backward_rounded";
    const auto p0 = r(ab, rows * 2 * F, op);
    const auto p1 = r(dh, rows * F, op);
    const auto p2 = r(dab, rows * 2 * F, op);
    run([=, this] { inner_.swiglu_backward_rounded(p0, p1, p2, rows, F); });
  }
  void swiglu_backward(const T* ab, const T* dh, T* dab, int64_t rows, int64_t F) override {
    covered(OpId::swiglu_backward);
    const char* op = "swiglu_backward";
    const auto p0 = r(ab, rows * 2 * F, op);
    const auto p1 = r(dh, rows * F, op);
    const auto p2 = r(dab, rows * 2 * F, op);
    run([=, this] { inner_.swiglu_backward(p0, p1, p2, rows, F); });
  }
  void cross_entropy_forward(const T* logits, const int32_t* targets, T* losses, int64_t N, int64_t V) override {
    covered(OpId::cross_entropy_forward);
    const char* op = "cross_entropy_forward";
    const auto p0 = r(logits, N * V, op);
    const auto p1 = r(targets, N, op);
    const auto p2 = r(losses, N, op);
    run([=, this] { inner_.cross_entropy_forward(p0, p1, p2, N, V); });
  }
  void cross_entropy_backward(const T* logits, const int32_t* targets, T scale, T* dlogits, int64_t N,
                              int64_t V) override {
    logit_gradients(OpId::cross_entropy_backward, logits, targets, nullptr, dlogits, N, V,
                    [this, scale, N, V](const T* z, const int32_t* t, const T*, T* d) {
                      inner_.cross_entropy_backward(z, t, scale, d, N, V);
                    });
  }
  void cross_entropy_backward_rounded(const T* logits, const int32_t* targets, T scale, Rounded<T>* dlogits, int64_t N,
                                      int64_t V) override {
    logit_gradients(OpId::cross_entropy_backward_rounded, logits, targets, nullptr, dlogits, N, V,
                    [this, scale, N, V](const T* z, const int32_t* t, const T*, Rounded<T>* d) {
                      inner_.cross_entropy_backward_rounded(z, t, scale, d, N, V);
                    });
  }
  void logits_row_max(const T* logits, int64_t N, int64_t V, double* row_max) override {
    covered(OpId::logits_row_max);
    const char* op = "logits_row_max";
    const auto p0 = r(logits, N * V, op);
    const auto p1 = r(row_max, N, op);
    run([=, this] { inner_.logits_row_max(p0, N, V, p1); });
  }
  void logits_sum_exp(const T* logits, const int32_t* targets, int64_t first, const double* row_max, double* sums,
                      int64_t N, int64_t V) override {
    covered(OpId::logits_sum_exp);
    const char* op = "logits_sum_exp";
    const auto p0 = r(logits, N * V, op);
    const auto p1 = r(targets, N, op);
    const auto p2 = r(row_max, N, op);
    const auto p3 = r(sums, 2 * N, op);
    run([=, this] { inner_.logits_sum_exp(p0, p1, first, p2, p3, N, V); });
  }
  void logits_max_over_blocks(const double* block_max, double* row_max, int64_t P, int64_t N) override {
    covered(OpId::logits_max_over_blocks);
    const char* op = "logits_max_over_blocks";
    const auto p0 = r(block_max, P * N, op);
    const auto p1 = r(row_max, N, op);
    run([=, this] { inner_.logits_max_over_blocks(p0, p1, P, N); });
  }
  void logits_loss_finish(const double* row_max, const double* sums, T* lse, T* losses, int64_t N) override {
    covered(OpId::logits_loss_finish);
    const char* op = "logits_loss_finish";
    const auto p0 = r(row_max, N, op);
    const auto p1 = r(sums, 2 * N, op);
    const auto p2 = r(lse, N, op);
    const auto p3 = r(losses, N, op);
    run([=, this] { inner_.logits_loss_finish(p0, p1, p2, p3, N); });
  }
  void logits_softmax_backward(const T* logits, const int32_t* targets, int64_t first, const T* lse, T scale,
                               T* dlogits, int64_t N, int64_t V) override {
    logit_gradients(OpId::logits_softmax_backward, logits, targets, lse, dlogits, N, V,
                    [this, first, scale, N, V](const T* z, const int32_t* t, const T* l, T* d) {
                      inner_.logits_softmax_backward(z, t, first, l, scale, d, N, V);
                    });
  }
  void logits_softmax_backward_rounded(const T* logits, const int32_t* targets, int64_t first, const T* lse, T scale,
                                       Rounded<T>* dlogits, int64_t N, int64_t V) override {
    logit_gradients(OpId::logits_softmax_backward_rounded, logits, targets, lse, dlogits, N, V,
                    [this, first, scale, N, V](const T* z, const int32_t* t, const T* l, Rounded<T>* d) {
                      inner_.logits_softmax_backward_rounded(z, t, first, l, scale, d, N, V);
                    });
  }
  void add_inplace(T* y, const T* x, int64_t n) override {
    covered(OpId::add_inplace);
    const auto p0 = r(y, n, "add_inplace");
    const auto p1 = r(x, n, "add_inplace");
    run([=, this] { inner_.add_inplace(p0, p1, n); });
  }
  void add(const T* a, const T* b, T* y, int64_t n) override {
    covered(OpId::add);
    const auto p0 = r(a, n, "add");
    const auto p1 = r(b, n, "add");
    const auto p2 = r(y, n, "add");
    run([=, this] { inner_.add(p0, p1, p2, n); });
  }
  void copy(const T* x, T* y, int64_t n) override {
    covered(OpId::copy);
    const auto p0 = r(x, n, "copy");
    const auto p1 = r(y, n, "copy");
    run([=, this] { inner_.copy(p0, p1, n); });
  }
  void copy_strided(const T* x, int64_t ldx, T* y, int64_t ldy, int64_t rows, int64_t cols) override {
    covered(OpId::copy_strided);
    const char* op = "copy_strided";
    const auto p0 = r(x, strided(rows, cols, ldx), op);
    const auto p1 = r(y, strided(rows, cols, ldy), op);
    run([=, this] { inner_.copy_strided(p0, ldx, p1, ldy, rows, cols); });
  }
  void fill(T* y, T value, int64_t n) override {
    covered(OpId::fill);
    const auto p0 = r(y, n, "fill");
    run([=, this] { inner_.fill(p0, value, n); });
  }
  void scale(T* y, T factor, int64_t n) override {
    covered(OpId::scale);
    const auto p0 = r(y, n, "scale");
    run([=, this] { inner_.scale(p0, factor, n); });
  }
  void sum_squares_into(const T* x, int64_t n, double* out) override {
    covered(OpId::sum_squares_into);
    const auto p0 = r(x, n, "sum_squares_into");
    const auto p1 = r(out, 1, "sum_squares_into");
    run([=, this] { inner_.sum_squares_into(p0, n, p1); });
  }
  // Each segment's read checked, and all of them within base's buffer (the CPU's op reads them from base); the
  // host array is copied at the call.
  void sum_squares_segments_into(const T* base, const SumSegment* segments, int64_t count, double* out) override {
    covered(OpId::sum_squares_segments_into);
    const char* op = "sum_squares_segments_into";
    std::vector<SumSegment> list(segments, segments + std::max<int64_t>(count, 0));
    int64_t extent = 0;
    for (const SumSegment& s : list) {
      MOE_CHECK(s.offset >= 0 && s.length >= 0,
                op << ": a segment at offset " << s.offset << " of length " << s.length << "; both must be >= 0");
      r(base + s.offset, s.length, op);
      extent = std::max(extent, s.offset + s.length);
    }
    const auto p0 = r(base, extent, op);
    const auto p1 = r(out, count, op);
    run([=, this, list = std::move(list)] { inner_.sum_squares_segments_into(p0, list.data(), count, p1); });
  }
  double sum_squares_to_host(const T* x, int64_t n) override {
    covered(OpId::sum_squares);
    stream_.synchronize();
    apply(settings());
    return inner_.sum_squares(r(x, n, "sum_squares"), n);
  }

  void run_grouped_gemm(const typename Ops<T>::GroupedGemm& g) override {
    covered(OpId::grouped_gemm);
    const char* op = "grouped_gemm";
    const int64_t rows = g.groups > 0 ? g.row_offset[g.groups] : 0, N = g.N, K = g.K;
    typename Ops<T>::GroupedGemm real = g;
    real.A = r(g.A, rows * K, op);
    real.A_rounded = r(g.A_rounded, rows * K, op);
    real.B = r(g.B, g.trans_a ? rows * N : g.groups * K * N, op);
    real.B_rounded = r(g.B_rounded, g.trans_a ? rows * N : g.groups * K * N, op);
    real.C = r(g.C, g.trans_a ? g.groups * K * N : rows * N, op);
    real.C_rounded = r(g.C_rounded, rows * N, op);
    const std::vector<int64_t> offsets = host_offsets(g.groups, g.row_offset);
    run([=, this] {
      typename Ops<T>::GroupedGemm call = real;
      call.row_offset = offsets.data();
      inner_.grouped_gemm(call);
    });
  }
  void expert_mlp_forward(const typename Ops<T>::ExpertMlp& e, const T* x, T* ab, T* h, T* y) override {
    covered(OpId::expert_mlp_forward);
    const char* op = "expert_mlp_forward";
    const int64_t rows = e.groups > 0 ? e.row_offset[e.groups] : 0;
    const auto p0 = real_weights(e, op);
    const auto p1 = r(x, rows * e.D, op);
    const auto p2 = r(ab, rows * 2 * e.F, op);
    const auto p3 = r(h, rows * e.F, op);
    const auto p4 = r(y, rows * e.D, op);
    const std::vector<int64_t> offsets = host_offsets(e.groups, e.row_offset);
    run([=, this] { inner_.expert_mlp_forward(with_offsets(p0, offsets), p1, p2, p3, p4); });
  }
  void expert_mlp_backward(const typename Ops<T>::ExpertMlp& e, const T* x, const T* ab, const T* h, const T* dy, T* dh,
                           T* dab, T* dx) override {
    covered(OpId::expert_mlp_backward);
    const char* op = "expert_mlp_backward";
    const int64_t rows = e.groups > 0 ? e.row_offset[e.groups] : 0, rf = rows * e.F, rd = rows * e.D;
    const auto p0 = real_weights(e, op);
    const auto p1 = r(x, rd, op);
    const auto p2 = r(ab, 2 * rf, op);
    const auto p3 = r(h, rf, op);
    const auto p4 = r(dy, rd, op);
    const auto p5 = r(dh, rf, op);
    const auto p6 = r(dab, 2 * rf, op);
    const auto p7 = r(dx, rd, op);
    const std::vector<int64_t> offsets = host_offsets(e.groups, e.row_offset);
    run([=, this] { inner_.expert_mlp_backward(with_offsets(p0, offsets), p1, p2, p3, p4, p5, p6, p7); });
  }
  void expert_mlp_forward_rounded(const typename Ops<T>::ExpertMlp& e, const Rounded<T>* x, Rounded<T>* ab,
                                  Rounded<T>* h, T* y) override {
    covered(OpId::expert_mlp_forward_rounded);
    const char* op = "expert_mlp_forward_rounded";
    const int64_t rows = e.groups > 0 ? e.row_offset[e.groups] : 0;
    const auto p0 = real_weights(e, op);
    const auto p1 = r(x, rows * e.D, op);
    const auto p2 = r(ab, rows * 2 * e.F, op);
    const auto p3 = r(h, rows * e.F, op);
    const auto p4 = r(y, rows * e.D, op);
    const std::vector<int64_t> offsets = host_offsets(e.groups, e.row_offset);
    run([=, this] { inner_.expert_mlp_forward_rounded(with_offsets(p0, offsets), p1, p2, p3, p4); });
  }
  void expert_mlp_backward_rounded(const typename Ops<T>::ExpertMlp& e, const Rounded<T>* x, const Rounded<T>* ab,
                                   const Rounded<T>* h, const T* dy, Rounded<T>* dy_held, T* dh, Rounded<T>* dab,
                                   T* dx) override {
    covered(OpId::expert_mlp_backward_rounded);
    const char* op = "expert_mlp_backward_rounded";
    const int64_t rows = e.groups > 0 ? e.row_offset[e.groups] : 0, rf = rows * e.F, rd = rows * e.D;
    const auto p0 = real_weights(e, op);
    const auto p1 = r(x, rd, op);
    const auto p2 = r(ab, 2 * rf, op);
    const auto p3 = r(h, rf, op);
    const auto p4 = r(dy, rd, op);
    const auto p5 = r(dy_held, rd, op);
    const auto p6 = r(dh, rf, op);
    const auto p7 = r(dab, 2 * rf, op);
    const auto p8 = r(dx, rd, op);
    const std::vector<int64_t> offsets = host_offsets(e.groups, e.row_offset);
    run([=, this] { inner_.expert_mlp_backward_rounded(with_offsets(p0, offsets), p1, p2, p3, p4, p5, p6, p7, p8); });
  }

  void gumbel_noise(uint64_t key, uint64_t step, uint64_t first_counter, double* out, int64_t n) override {
    covered(OpId::gumbel_noise);
    const auto p0 = r(out, n, "gumbel_noise");
    run([=, this] { inner_.gumbel_noise(key, step, first_counter, p0, n); });
  }
  void softmax_rows(const T* z, const double* noise, double tau, T* p, int64_t N, int64_t E) override {
    covered(OpId::softmax_rows);
    const char* op = "softmax_rows";
    const auto p0 = r(z, N * E, op);
    const auto p1 = r(noise, N * E, op);
    const auto p2 = r(p, N * E, op);
    run([=, this] { inner_.softmax_rows(p0, p1, tau, p2, N, E); });
  }
  void sigmoid_rows(const T* z, const double* noise, double tau, T* p, int64_t N, int64_t E) override {
    covered(OpId::sigmoid_rows);
    const char* op = "sigmoid_rows";
    const auto p0 = r(z, N * E, op);
    const auto p1 = r(noise, N * E, op);
    const auto p2 = r(p, N * E, op);
    run([=, this] { inner_.sigmoid_rows(p0, p1, tau, p2, N, E); });
  }
  void topk_rows(const T* p, const float* bias, const uint8_t* mask, int32_t* index, int64_t N, int64_t E,
                 int64_t K) override {
    covered(OpId::topk_rows);
    const char* op = "topk_rows";
    const auto p0 = r(p, N * E, op);
    const auto p1 = r(bias, E, op);
    const auto p2 = r(mask, E, op);
    const auto p3 = r(index, N * K, op);
    run([=, this] { inner_.topk_rows(p0, p1, p2, p3, N, E, K); });
  }
  // The rows a gather reads and a scatter writes are named by indices in backend memory: only the start of
  // that operand is checked.
  void gather_rows(const T* src, const int32_t* index, const T* scale, T* dst, int64_t rows, int64_t D) override {
    covered(OpId::gather_rows);
    const char* op = "gather_rows";
    const auto p0 = r(src, 0, op);
    const auto p1 = r(index, rows, op);
    const auto p2 = r(scale, rows, op);
    const auto p3 = r(dst, rows * D, op);
    run([=, this] { inner_.gather_rows(p0, p1, p2, p3, rows, D); });
  }
  void gather_rows_rounded(const T* src, const int32_t* index, Rounded<T>* dst, int64_t rows, int64_t D) override {
    covered(OpId::gather_rows_rounded);
    const char* op = "gather_rows_rounded";
    const auto p0 = r(src, 0, op);
    const auto p1 = r(index, rows, op);
    const auto p2 = r(dst, rows * D, op);
    run([=, this] { inner_.gather_rows_rounded(p0, p1, p2, rows, D); });
  }
  void scatter_add_rows(const T* src, const int32_t* index, const T* scale, T* dst, int64_t rows, int64_t D) override {
    covered(OpId::scatter_add_rows);
    const char* op = "scatter_add_rows";
    const auto p0 = r(src, rows * D, op);
    const auto p1 = r(index, rows, op);
    const auto p2 = r(scale, rows, op);
    const auto p3 = r(dst, 0, op);
    run([=, this] { inner_.scatter_add_rows(p0, p1, p2, p3, rows, D); });
  }
  void combine_rows(const T* src, const int32_t* index, const T* weight, T* dst, int64_t N, int64_t K, int64_t D,
                    bool accumulate) override {
    covered(OpId::combine_rows);
    const char* op = "combine_rows";
    const auto p0 = r(src, 0, op);
    const auto p1 = r(index, N * K, op);
    const auto p2 = r(weight, N * K, op);
    const auto p3 = r(dst, N * D, op);
    run([=, this] { inner_.combine_rows(p0, p1, p2, p3, N, K, D, accumulate); });
  }
  void row_dots(const T* a, const int32_t* index, const T* b, T* out, int64_t rows, int64_t D) override {
    covered(OpId::row_dots);
    const char* op = "row_dots";
    const auto p0 = r(a, 0, op);
    const auto p1 = r(index, rows, op);
    const auto p2 = r(b, rows * D, op);
    const auto p3 = r(out, rows, op);
    run([=, this] { inner_.row_dots(p0, p1, p2, p3, rows, D); });
  }

  void gate_weights(const T* scores, const int32_t* preference, int64_t W, bool renormalised, int32_t* selected,
                    T* selected_score, T* gate, T* denom, uint8_t* clamped, int64_t N, int64_t E, int64_t K) override {
    covered(OpId::gate_weights);
    const char* op = "gate_weights";
    const auto p0 = r(scores, N * E, op);
    const auto p1 = r(preference, N * W, op);
    const auto p2 = r(selected, N * K, op);
    const auto p3 = r(selected_score, N * K, op);
    const auto p4 = r(gate, N * K, op);
    const auto p5 = r(denom, N, op);
    const auto p6 = r(clamped, N, op);
    run([=, this] { inner_.gate_weights(p0, p1, W, renormalised, p2, p3, p4, p5, p6, N, E, K); });
  }
  void expert_fractions(const int32_t* top, T* f, int64_t N, int64_t K, int64_t E) override {
    covered(OpId::expert_fractions);
    const auto p0 = r(top, N * K, "expert_fractions");
    const auto p1 = r(f, E, "expert_fractions");
    run([=, this] { inner_.expert_fractions(p0, p1, N, K, E); });
  }
  void router_loss_sums(const T* logits, const T* scores, double* out, int64_t N, int64_t E) override {
    covered(OpId::router_loss_sums);
    const char* op = "router_loss_sums";
    const auto p0 = r(logits, N * E, op);
    const auto p1 = r(scores, N * E, op);
    const auto p2 = r(out, E + 2, op);
    run([=, this] { inner_.router_loss_sums(p0, p1, p2, N, E); });
  }
  void capacity_keep(const int32_t* selected, const T* score, bool by_score, int64_t capacity, int32_t* assigned,
                     int64_t M, int64_t E) override {
    covered(OpId::capacity_keep);
    const char* op = "capacity_keep";
    const auto p0 = r(selected, M, op);
    const auto p1 = r(by_score ? score : nullptr, M, op);
    const auto p2 = r(assigned, M, op);
    run([=, this] { inner_.capacity_keep(p0, p1, by_score, capacity, p2, M, E); });
  }
  void reroute_overflow(const int32_t* preference, int64_t W, const T* score, bool by_score, int64_t capacity,
                        int32_t* assigned, int64_t* rerouted, int64_t N, int64_t K, int64_t E) override {
    covered(OpId::reroute_overflow);
    const char* op = "reroute_overflow";
    const auto p0 = r(preference, N * W, op);
    const auto p1 = r(by_score ? score : nullptr, N * K, op);
    const auto p2 = r(assigned, N * K, op);
    const auto p3 = r(rerouted, 1, op);
    run([=, this] { inner_.reroute_overflow(p0, W, p1, by_score, capacity, p2, p3, N, K, E); });
  }
  void fallback_rows(const int32_t* selected, const int32_t* assigned, const T* gate, int64_t K, int32_t* token,
                     T* weight, int32_t* source, int32_t* slot, int64_t* count, int64_t N) override {
    covered(OpId::fallback_rows);
    const char* op = "fallback_rows";
    const auto p0 = r(selected, N * K, op);
    const auto p1 = r(assigned, N * K, op);
    const auto p2 = r(gate, N * K, op);
    const auto p3 = r(token, N, op);
    const auto p4 = r(weight, N, op);
    const auto p5 = r(source, N * K, op);
    const auto p6 = r(slot, N * K, op);
    const auto p7 = r(count, 2, op);
    run([=, this] { inner_.fallback_rows(p0, p1, p2, K, p3, p4, p5, p6, p7, N); });
  }
  void permute_by_expert(const int32_t* assigned, int64_t* offset, int32_t* perm_slot, int32_t* row_of_slot, int64_t M,
                         int64_t E) override {
    covered(OpId::permute_by_expert);
    const char* op = "permute_by_expert";
    const auto p0 = r(assigned, M, op);
    const auto p1 = r(offset, E + 1, op);
    const auto p2 = r(perm_slot, M, op);
    const auto p3 = r(row_of_slot, M, op);
    run([=, this] { inner_.permute_by_expert(p0, p1, p2, p3, M, E); });
  }
  void restrict_permutation(const int64_t* offset, const int32_t* perm_slot, int64_t lo, int64_t hi,
                            int64_t* part_offset, int32_t* part_perm_slot, int32_t* part_row_of_slot, int64_t M,
                            int64_t E) override {
    covered(OpId::restrict_permutation);
    const char* op = "restrict_permutation";
    MOE_CHECK(0 <= lo && lo <= hi && hi <= M, op << ": part [" << lo << ", " << hi << ") of " << M << " slots");
    const auto p0 = r(offset, E + 1, op);
    const auto p1 = r(perm_slot, M, op);
    const auto p2 = r(part_offset, E + 1, op);
    const auto p3 = r(part_perm_slot, hi - lo, op);
    const auto p4 = r(part_row_of_slot, hi - lo, op);
    run([=, this] { inner_.restrict_permutation(p0, p1, lo, hi, p2, p3, p4, M, E); });
  }
  void permuted_rows(const int32_t* perm_slot, const T* gate, int64_t K, int32_t* perm_token, T* perm_gate,
                     int64_t M) override {
    covered(OpId::permuted_rows);
    const char* op = "permuted_rows";
    const auto p0 = r(perm_slot, M, op);
    const auto p1 = r(gate, M, op);
    const auto p2 = r(perm_token, M, op);
    const auto p3 = r(perm_gate, M, op);
    run([=, this] { inner_.permuted_rows(p0, p1, K, p2, p3, M); });
  }
  void gate_backward(const T* gate, const int32_t* selected, const T* dw, const T* denom, const uint8_t* clamped,
                     bool renormalised, T* dp, int64_t N, int64_t K, int64_t E) override {
    covered(OpId::gate_backward);
    const char* op = "gate_backward";
    const auto p0 = r(gate, N * K, op);
    const auto p1 = r(selected, N * K, op);
    const auto p2 = r(dw, N * K, op);
    const auto p3 = r(denom, N, op);
    const auto p4 = r(clamped, N, op);
    const auto p5 = r(dp, N * E, op);
    run([=, this] { inner_.gate_backward(p0, p1, p2, p3, p4, renormalised, p5, N, K, E); });
  }
  void router_loss_backward(const T* logits, const T* scores, const T* f, const typename Ops<T>::RouterLossGrad& c,
                            T* dp, T* dz, int64_t N, int64_t E) override {
    covered(OpId::router_loss_backward);
    const char* op = "router_loss_backward";
    const auto p0 = r(logits, N * E, op);
    const auto p1 = r(scores, N * E, op);
    const auto p2 = r(f, E, op);
    const auto p3 = r(dp, N * E, op);
    const auto p4 = r(dz, N * E, op);
    run([=, this] { inner_.router_loss_backward(p0, p1, p2, c, p3, p4, N, E); });
  }
  void score_backward(const T* scores, const T* dp, double tau, bool sigmoid, const T* logits, const double* noise,
                      int64_t own_first, int64_t own_count, double* d_log_tau, T* dz, int64_t N, int64_t E) override {
    covered(OpId::score_backward);
    const char* op = "score_backward";
    const auto p0 = r(scores, N * E, op);
    const auto p1 = r(dp, N * E, op);
    const auto p2 = r(logits, N * E, op);
    const auto p3 = r(noise, N * E, op);
    const auto p4 = r(d_log_tau, logits ? 1 : 0, op);
    const auto p5 = r(dz, N * E, op);
    run([=, this] { inner_.score_backward(p0, p1, tau, sigmoid, p2, p3, own_first, own_count, p4, p5, N, E); });
  }

  void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const typename Ops<T>::AdamWStep& step) override {
    covered(OpId::adamw_update);
    const char* op = "adamw_update";
    const auto p0 = r(p, n, op);
    const auto p1 = r(g, n, op);
    const auto p2 = r(m, n, op);
    const auto p3 = r(v, n, op);
    run([=, this] { inner_.adamw_update(p0, p1, p2, p3, n, step); });
  }

 private:
  // Elements from the first of `rows` rows of `cols`, `ld` apart, to the last one's end.
  static int64_t strided(int64_t rows, int64_t cols, int64_t ld) { return rows > 0 ? (rows - 1) * ld + cols : 0; }
  // A residual norm's checks (as stored or, Y = Rounded<T>, its output held rounded), then `call` with the real
  // pointers (x, r, sum, gain, y, rstd) on the stream.
  template <typename Y, typename Call>
  void residual_norm(OpId id, const T* x, const T* res, T* sum, const T* gain, Y* y, T* rstd, int64_t N, int64_t D,
                     Call call) {
    covered(id);
    const char* op = kOpNames[size_t(id)];
    const auto p0 = r(x, N * D, op);
    const T* p1 = res ? r(res, N * D, op) : nullptr;
    const auto p2 = r(sum, N * D, op);
    const auto p3 = r(gain, D, op);
    const auto p4 = r(y, N * D, op);
    const auto p5 = r(rstd, N, op);
    run([=] { call(p0, p1, p2, p3, p4, p5); });
  }
  // The logits' gradient's checks (lse, N values, where given; dlogits as stored or held rounded), then `call` with
  // the real logits, targets, lse and dlogits on the stream.
  template <typename Y, typename Call>
  void logit_gradients(OpId id, const T* logits, const int32_t* targets, const T* lse, Y* dlogits, int64_t N, int64_t V,
                       Call call) {
    covered(id);
    const char* op = kOpNames[size_t(id)];
    const auto p0 = r(logits, N * V, op);
    const auto p1 = r(targets, N, op);
    const T* p2 = lse ? r(lse, N, op) : nullptr;
    const auto p3 = r(dlogits, N * V, op);
    run([=] { call(p0, p1, p2, p3); });
  }

  template <typename P>
  P* r(P* p, int64_t n, const char* op) const {
    using Bare = std::remove_const_t<P>;
    return static_cast<P*>(shadow_.real(const_cast<Bare*>(p), size_t(n > 0 ? n : 0) * sizeof(P), op));
  }
  // An attention call's q, k, v and out (where it has one), as stored or held rounded, n elements each.
  template <typename A>
  A real_operands(A a, int64_t n, const char* op) const {
    a.q = r(a.q, n, op), a.k = r(a.k, n, op), a.v = r(a.v, n, op);
    a.q_rounded = r(a.q_rounded, n, op), a.k_rounded = r(a.k_rounded, n, op), a.v_rounded = r(a.v_rounded, n, op);
    if constexpr (requires { a.out; }) a.out = r(a.out, n, op), a.out_rounded = r(a.out_rounded, n, op);
    return a;
  }
  typename Ops<T>::ExpertMlp real_weights(typename Ops<T>::ExpertMlp e, const char* op) const {
    const int64_t n = e.groups * e.D * e.F;
    e.w13 = r(e.w13, 2 * n, op), e.w2 = r(e.w2, n, op);
    e.dw13 = r(e.dw13, 2 * n, op), e.dw2 = r(e.dw2, n, op);
    return e;
  }
  // The row offsets as they are now (host memory the caller may change once the op is queued; the CUDA
  // backend reads them at the call too).
  static std::vector<int64_t> host_offsets(int64_t groups, const int64_t* row_offset) {
    return groups > 0 ? std::vector<int64_t>(row_offset, row_offset + groups + 1) : std::vector<int64_t>{};
  }
  static typename Ops<T>::ExpertMlp with_offsets(typename Ops<T>::ExpertMlp e, const std::vector<int64_t>& offsets) {
    e.row_offset = offsets.data();
    return e;
  }

  // The settings callers make on these ops (fused attention, the parameters' memory) when an op is queued, handed
  // to the CPU backend's ops that do the work when it runs.
  struct Settings {
    bool fused;
    uint64_t version;
    const T* parameters;  // the storage
    int64_t count;
  };
  Settings settings() {
    if (queued_version_ != this->parameter_version()) {
      queued_version_ = this->parameter_version();
      queued_parameters_ = r(this->parameter_memory(), this->parameter_count(), "the parameters' memory");
    }
    return {this->fused_attention_allowed(), queued_version_, queued_parameters_, this->parameter_count()};
  }
  void apply(const Settings& s) {
    inner_.set_fused_attention(s.fused);
    if (applied_version_ == s.version) return;
    applied_version_ = s.version;
    inner_.set_parameter_memory(s.parameters, s.count);
  }
  // Queues `op` on the stream, to run with the settings of now.
  void run(std::function<void()> op) {
    stream_.enqueue([this, s = settings(), op = std::move(op)] {
      apply(s);
      op();
    });
  }

  Ops<T>& inner_;
  const ShadowMemory& shadow_;
  DeferredStream& stream_;
  uint64_t queued_version_ = ~uint64_t(0), applied_version_ = ~uint64_t(0);
  const T* queued_parameters_ = nullptr;
};

}  // namespace moe
