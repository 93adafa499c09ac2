// The backend seam: the narrow set of ops every layer is written with (docs/design.md "The backend seam").
// Pointers are in the backend's memory (host for the CPU backend); the ops of a backend are reached
// through its Backend object (core/backend/backend.h), which also owns that memory. Every op has a CPU reference in
// core/backend/cpu/ and a conformance test; another backend implements this interface and must pass it.
//
// Gradient contract (docs/design.md "Conventions"): parameter gradients accumulate (+=); activation gradients are
// written (=), except where an op says it accumulates (the residual stream).
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"

namespace moe {

// What GEMM operands are read as (docs/design.md "Precision"; train.precision). Fp32: as stored. Bf16: each
// operand rounded to bf16 (round to nearest even), the products exact and summed in fp32 into C as stored
// (fp32): what tensor cores' bf16 GEMMs compute, so the CPU backend is their reference. Each call states its own
// (GemmArgs, GroupedGemmArgs, Ops::ExpertMlp, AttentionShape; the ops keep no precision between calls): the layers
// theirs from train.precision, the router fp32 whatever it is. It applies to gemm, grouped_gemm, the experts' MLPs
// and the four products inside attention (q k^T, p v and their gradients; the softmax stays in the storage type),
// never to anything else.
enum class GemmPrecision : uint8_t { Fp32, Bf16 };

// Which operand of a GEMM is a weight: a slice of the parameters' memory (Ops::set_parameter_memory), which a bf16
// GEMM reads from their rounded copy instead of rounding it again. None: both operands are rounded at the call.
enum class GemmWeight : uint8_t { None, A, B };

// One GEMM: C(M,N) = alpha * op(A) * op(B) + beta * C, row-major; op(A) is (M,K), op(B) is (K,N). Each call states
// how its operands are read (precision) and which of them, if any, is a weight; the defaults are the safe ones
// (alpha 1, beta 0, as stored, no weight). A_rounded: operand A as its producer holds it rounded (Rounded), in A's
// place (A null, same lda), for a bf16 GEMM only, and not a weight; B_rounded likewise for B.
template <typename T>
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  T alpha = T(1);
  const T* A = nullptr;
  const Rounded<T>* A_rounded = nullptr;
  int64_t lda = 0;
  const T* B = nullptr;
  const Rounded<T>* B_rounded = nullptr;
  int64_t ldb = 0;
  T beta = T(0);
  T* C = nullptr;
  int64_t ldc = 0;
  GemmPrecision precision = GemmPrecision::Fp32;
  GemmWeight weight = GemmWeight::None;
};

// A grouped GEMM over experts: group g owns the rows [row_offset[g], row_offset[g + 1]) of the row-blocked operands
// (row_offset: groups + 1 values, host memory). Empty groups are skipped.
//   trans_a = false: C_g (m_g, N) = alpha A_g (m_g, K) op(B_g) + beta C_g, with A and C row-blocked
//                    (A: (rows, K), C: (rows, N)) and B_g = B + g K N, (K, N) or, trans_b, (N, K).
//   trans_a = true:  C_g (K, N) = alpha A_g^T B_g + beta C_g, with A: (rows, K) and B: (rows, N)
//                    row-blocked and C_g = C + g K N (the weight gradients); trans_b must be false.
// precision, weight and A_rounded as GemmArgs's (the experts' weight stacks are operand B), B_rounded likewise for B
// (not a weight). C_rounded: C written held rounded (the fp32 result rounded as it is stored; bf16 GEMMs, beta 0,
// trans_a false) in C's place (C null).
template <typename T>
struct GroupedGemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t groups = 0;
  const int64_t* row_offset = nullptr;
  int64_t N = 0, K = 0;
  T alpha = T(1);
  const T* A = nullptr;
  const Rounded<T>* A_rounded = nullptr;
  const T* B = nullptr;
  const Rounded<T>* B_rounded = nullptr;
  T beta = T(0);
  T* C = nullptr;
  Rounded<T>* C_rounded = nullptr;
  GemmPrecision precision = GemmPrecision::Fp32;
  GemmWeight weight = GemmWeight::None;
};

// The shape of one causal attention call, B sequences of T tokens, H heads of width Dh, and the precision of its
// four products (q k^T, p v and their gradients; their operands are activations, never weights). Head (b, h) has its
// columns at offset(b, h) of q, k, v and out, (B, T, H*Dh) each.
struct AttentionShape {
  int64_t B = 0, T = 0, H = 0, Dh = 0;
  GemmPrecision precision = GemmPrecision::Fp32;
  int64_t D() const { return H * Dh; }
  int64_t offset(int64_t bh) const { return (bh / H) * T * D() + (bh % H) * Dh; }
  double scale() const { return 1.0 / std::sqrt(double(Dh)); }
};

// Held operands (bf16 GEMMs only, shape.precision Bf16): q, k and v may come held rounded by their producer, all three
// (q_rounded, k_rounded, v_rounded in q, k and v's places, those null), and out may be held rounded (out_rounded in
// out's place): the four products read bf16 operands anyway, and D_i = dO_i . O_i of the fused backward reads O
// rounded, so holding them gives the bits of rounding them at every call (MhaAttention keeps them so: half the
// memory, and the rounding passes gone).

// The plain form's operands: probs (B, H, T, T) written by forward (upper triangle zero), read by backward.
template <typename T>
struct AttentionForwardArgs {
  AttentionShape shape;
  const T *q = nullptr, *k = nullptr, *v = nullptr;
  T* out = nullptr;
  T* probs = nullptr;
  const Rounded<T>*q_rounded = nullptr, *k_rounded = nullptr, *v_rounded = nullptr;
  Rounded<T>* out_rounded = nullptr;
};
// dq, dk, dv written; scratch: (T, T).
template <typename T>
struct AttentionBackwardArgs {
  AttentionShape shape;
  const T *q = nullptr, *k = nullptr, *v = nullptr, *probs = nullptr, *dout = nullptr;
  T *dq = nullptr, *dk = nullptr, *dv = nullptr;
  T* scratch = nullptr;
  const Rounded<T>*q_rounded = nullptr, *k_rounded = nullptr, *v_rounded = nullptr;
};
// The fused form's: stats (B, H, T), row i of head (b, h) the log-sum-exp over j <= i of the scaled scores
// q_i . k_j / sqrt(Dh), written by forward and read by backward with its out.
template <typename T>
struct FusedAttentionForwardArgs {
  AttentionShape shape;
  const T *q = nullptr, *k = nullptr, *v = nullptr;
  T* out = nullptr;
  T* stats = nullptr;
  const Rounded<T>*q_rounded = nullptr, *k_rounded = nullptr, *v_rounded = nullptr;
  Rounded<T>* out_rounded = nullptr;
};
template <typename T>
struct FusedAttentionBackwardArgs {
  AttentionShape shape;
  const T *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr, *stats = nullptr, *dout = nullptr;
  T *dq = nullptr, *dk = nullptr, *dv = nullptr;
  const Rounded<T>*q_rounded = nullptr, *k_rounded = nullptr, *v_rounded = nullptr, *out_rounded = nullptr;
};

// An attention call's q, k, v as a layer keeps them, as stored or held rounded: `into` sets them on any of the four
// argument structs above.
template <typename T>
struct AttentionInputs {
  const T *q = nullptr, *k = nullptr, *v = nullptr;
  const Rounded<T>*q_rounded = nullptr, *k_rounded = nullptr, *v_rounded = nullptr;
  template <typename A>
  A into(A a) const {
    a.q = q, a.k = k, a.v = v, a.q_rounded = q_rounded, a.k_rounded = k_rounded, a.v_rounded = v_rounded;
    return a;
  }
};

// An attention call's operands as held or as stored (each backend's attention ops check them so): q, k, v all held
// or none, each given once, held ones under bf16 GEMMs only; out (where the call has one) given once.
template <typename A>
void check_attention_operands(const A& a, const char* op) {
  bool held = a.q_rounded || a.k_rounded || a.v_rounded;
  MOE_CHECK(held ? (a.q_rounded && a.k_rounded && a.v_rounded && !a.q && !a.k && !a.v) : (a.q && a.k && a.v),
            op << ": q, k and v are given all as stored or all held rounded (q_rounded, k_rounded, v_rounded), "
               << "each once");
  if constexpr (requires { a.out_rounded; }) {
    MOE_CHECK(!a.out != !a.out_rounded, op << ": out is given as stored or held rounded (out_rounded), once");
    held = held || a.out_rounded;
  }
  MOE_CHECK(!held || a.shape.precision == GemmPrecision::Bf16,
            op << ": held operands are read by bf16 products only (shape.precision Bf16)");
}

// One segment of a sum of squares over many (Ops::sum_squares_segments_into): `length` elements from `offset`,
// counted from the call's base pointer.
struct SumSegment {
  int64_t offset = 0, length = 0;
};

template <typename T>
class Ops {
 public:
  using Gemm = GemmArgs<T>;
  using GroupedGemm = GroupedGemmArgs<T>;

  virtual ~Ops() = default;
  virtual const char* name() const = 0;

  // The parameters' memory (n elements from `first`, the model's flat buffer; null: none). A bf16 GEMM reads an
  // operand it names as a weight (GemmWeight) from their copy rounded to bf16, which the backend makes once, at the
  // first such GEMM after a change (the weights are rounded once per step instead of once per GEMM; PyTorch's
  // autocast keeps such a cache too). While it is registered, a GEMM that names a weight outside it is refused;
  // with none registered a named weight is rounded at the call as the other operand is. parameters_changed() drops
  // the copy; adamw_update keeps it (it writes the rounded values of what it updates beside them), so the trainer
  // calls parameters_changed() only where something else wrote the parameters (the initialisation or a load, ZeRO's
  // all-gather, a frozen backbone's restore). The results are the same bits either way.
  void set_parameter_memory(const T* first, int64_t n) {
    parameters_ = first, parameter_count_ = n;
    parameters_changed();
  }
  void parameters_changed() { ++parameter_version_; }
  const T* parameter_memory() const { return parameters_; }
  int64_t parameter_count() const { return parameter_count_; }
  // Changes at every parameters_changed(): a backend's rounded copy is current while it holds the same value.
  uint64_t parameter_version() const { return parameter_version_; }
  // Whether `x` points into the parameters' memory.
  bool in_parameters(const T* x) const { return parameters_ && x >= parameters_ && x < parameters_ + parameter_count_; }

  // C = alpha op(A) op(B) + beta C as `g` says (GemmArgs).
  void gemm(const Gemm& g) {
    check_rounded_operand(g.A, g.A_rounded, g.precision, g.weight == GemmWeight::A, "gemm", 'A');
    check_rounded_operand(g.B, g.B_rounded, g.precision, g.weight == GemmWeight::B, "gemm", 'B');
    if (g.weight == GemmWeight::A && g.M > 0 && g.K > 0)  // A as stored: (M, K), or (K, M) transposed
      check_weight(g.A, g.trans_a ? (g.K - 1) * g.lda + g.M : (g.M - 1) * g.lda + g.K, "gemm");
    if (g.weight == GemmWeight::B && g.K > 0 && g.N > 0)  // B as stored: (K, N), or (N, K) transposed
      check_weight(g.B, g.trans_b ? (g.N - 1) * g.ldb + g.K : (g.K - 1) * g.ldb + g.N, "gemm");
    run_gemm(g);
  }
  // The grouped GEMM `g` says (GroupedGemmArgs).
  void grouped_gemm(const GroupedGemm& g) {
    check_rounded_operand(g.A, g.A_rounded, g.precision, g.weight == GemmWeight::A, "grouped_gemm", 'A');
    check_rounded_operand(g.B, g.B_rounded, g.precision, g.weight == GemmWeight::B, "grouped_gemm", 'B');
    MOE_CHECK(
        !g.C_rounded || (!g.C && g.precision == GemmPrecision::Bf16 && g.beta == T(0) && !g.trans_a && !g.B_rounded),
        "grouped_gemm: a rounded C is written in C's place (C null) by a bf16 GEMM with beta 0 of A by a weight "
        "stack");
    const int64_t rows = g.groups > 0 ? g.row_offset[g.groups] - g.row_offset[0] : 0;
    if (g.weight == GemmWeight::A && rows > 0 && g.K > 0)  // row-blocked (rows, K)
      check_weight(g.A + g.row_offset[0] * g.K, rows * g.K, "grouped_gemm");
    if (g.weight == GemmWeight::B && g.groups > 0 && g.K > 0 && g.N > 0)  // a (K, N) stack per group, or row-blocked
      check_weight(g.trans_a ? g.B + g.row_offset[0] * g.N : g.B, g.trans_a ? rows * g.N : g.groups * g.K * g.N,
                   "grouped_gemm");
    run_grouped_gemm(g);
  }

  // The table holds the rows of ids [first, first + rows) (all of them: first 0, rows V; a block of the
  // vocabulary under tensor parallelism). out: (N, D) = table[tokens - first], and 0 for a token outside
  // the block; tokens: (N).
  virtual void embedding_forward(const int32_t* tokens, const T* table, int64_t first, int64_t rows, T* out, int64_t N,
                                 int64_t D) = 0;
  // dtable[tokens[i] - first] += dout[i] for the tokens inside the block (parameter gradient: accumulates).
  virtual void embedding_backward(const int32_t* tokens, const T* dout, int64_t first, int64_t rows, T* dtable,
                                  int64_t N, int64_t D) = 0;

  // y = x / sqrt(mean(x^2) + eps) * gain; x, y: (N, D); rstd: (N) saved for backward.
  virtual void rmsnorm_forward(const T* x, const T* gain, T* y, T* rstd, int64_t N, int64_t D) = 0;
  // dx = (written); dgain += (accumulates).
  virtual void rmsnorm_backward(const T* x, const T* gain, const T* rstd, const T* dy, T* dx, T* dgain, int64_t N,
                                int64_t D) = 0;
  // The residual stream's fused forms (docs/gpu.md "Fused memory-bound ops"), the same bits as the ops they replace:
  // sum = x + r (r null: sum = x, a copy) and y = RMSNorm(sum) as rmsnorm_forward, one pass over the rows instead of
  // an add (or copy) and a norm. x, r, sum, y: (N, D); rstd: (N).
  virtual void rmsnorm_forward_residual(const T* x, const T* r, T* sum, const T* gain, T* y, T* rstd, int64_t N,
                                        int64_t D) = 0;
  // rmsnorm_forward_residual with y written held rounded (for a layer whose bf16 GEMMs alone read it): the norm, the
  // residual copy and the cast in one pass, the bits of rounding its y.
  virtual void rmsnorm_forward_residual_rounded(const T* x, const T* r, T* sum, const T* gain, Rounded<T>* y, T* rstd,
                                                int64_t N, int64_t D) = 0;
  // rmsnorm_backward with dx added into the stream's gradient (dres += dx, accumulates) instead of written, without
  // the (N, D) dx in between; dgain += as rmsnorm_backward.
  virtual void rmsnorm_backward_add(const T* x, const T* gain, const T* rstd, const T* dy, T* dres, T* dgain, int64_t N,
                                    int64_t D) = 0;

  // Rotary embedding in place on x: (B, T, H, Dh), pairs (2i, 2i+1) of each head rotated by
  // angle t * base^(-2i/Dh). inverse = true applies the transpose (the backward of the forward).
  virtual void rope(T* x, int64_t B, int64_t T_, int64_t H, int64_t Dh, bool inverse) = 0;
  // The rotation in the cast: y = rope(x) held rounded (x unchanged; y (B, T, H, Dh)), the bits of rope then
  // round_values, in one pass (attention's q and k as its products read them, and dq, dk as their GEMMs do).
  virtual void rope_rounded(const T* x, Rounded<T>* y, int64_t B, int64_t T_, int64_t H, int64_t Dh, bool inverse) = 0;

  // Grouped-query attention's key and value heads (docs/model.md): x (N, Hkv*Dh), y (N, Hkv*group*Dh) with
  // y's head h*group + g a copy of x's head h (each of x's heads read by its group of query heads).
  virtual void expand_heads(const T* x, T* y, int64_t N, int64_t Hkv, int64_t group, int64_t Dh) = 0;
  // Its backward: dx's head h = the sum of dy's heads [h*group, (h+1)*group), in that order (written).
  virtual void expand_heads_backward(const T* dy, T* dx, int64_t N, int64_t Hkv, int64_t group, int64_t Dh) = 0;

  // Causal softmax attention per head (AttentionForwardArgs), the probabilities saved for backward.
  virtual void attention_forward(const AttentionForwardArgs<T>& a) = 0;
  virtual void attention_backward(const AttentionBackwardArgs<T>& a) = 0;

  // ---- Fused causal attention (FlashAttention-2's form) -----------------------------------------------
  // The same attention without the (B, H, T, T) probabilities: forward keeps each row's log-sum-exp, backward
  // recomputes the probabilities from q, k and it (docs/design.md "Attention memory"). A layer asks
  // fused_attention_supported once per shape (its precision included), before it sizes its memory, and uses the
  // fused form where it says yes; the answer for a shape stays the same while set_fused_attention does.
  //   CPU: the reference, deterministic at any thread count; yes only after set_fused_attention(true) (tests:
  //        CPU training keeps the plain form, its bits and the README's losses).
  //   CUDA: cuDNN's fused flash attention, for fp32 storage under bf16 GEMMs (its operands rounded to bf16, as
  //        the plain form's products read them); no where cuDNN refuses the shape (said once on stderr), for
  //        fp32 GEMMs, fp64, or with train.fused_attention = "off".
  virtual bool fused_attention_supported(const AttentionShape& s) {
    (void)s;
    return false;
  }
  // Whether layers may use the fused form at all (default: yes; the CPU backend starts with no).
  void set_fused_attention(bool allowed) { fused_attention_ = allowed; }
  bool fused_attention_allowed() const { return fused_attention_; }
  // out as attention_forward, and the statistics (FusedAttentionForwardArgs).
  virtual void attention_forward_fused(const FusedAttentionForwardArgs<T>& a) = 0;
  // After attention_forward_fused (out, stats: its outputs); dout: (B, T, H*Dh). dq, dk, dv written:
  // P = exp(S - stats), D_i = dO_i . O_i, dS = P * (dO V^T - D) scale, dq = dS K, dk = dS^T Q, dv = P^T dO.
  virtual void attention_backward_fused(const FusedAttentionBackwardArgs<T>& a) = 0;

  // The gated unit of the SwiGLU MLPs over `rows` rows of F: each row of ab (rows, 2F) is [a | b] (the two halves of
  // x W13, W13 = [W1 | W3]), and h (rows, F) = silu(a) * b.
  virtual void swiglu_forward(const T* ab, T* h, int64_t rows, int64_t F) = 0;
  // h = silu(a) * b of ab held rounded, as swiglu_forward computes it on their values, h held rounded.
  virtual void swiglu_forward_rounded(const Rounded<T>* ab, Rounded<T>* h, int64_t rows, int64_t F) = 0;
  // dab (rows, 2F) written: each row [da | db] of the row's a, b and dh (rows, F).
  virtual void swiglu_backward(const T* ab, const T* dh, T* dab, int64_t rows, int64_t F) = 0;
  // swiglu_backward on ab held rounded, dab written held rounded (only bf16 GEMMs read it).
  virtual void swiglu_backward_rounded(const Rounded<T>* ab, const T* dh, Rounded<T>* dab, int64_t rows, int64_t F) = 0;
  // out = x held rounded, elementwise over n.
  virtual void round_values(const T* x, Rounded<T>* out, int64_t n) = 0;

  // Cross-entropy of logits (N, V) against targets (N); losses: (N) per-token -log p[target].
  virtual void cross_entropy_forward(const T* logits, const int32_t* targets, T* losses, int64_t N, int64_t V) = 0;
  // dlogits = (softmax(logits) - onehot(target)) * scale (written).
  virtual void cross_entropy_backward(const T* logits, const int32_t* targets, T scale, T* dlogits, int64_t N,
                                      int64_t V) = 0;
  // cross_entropy_backward's dlogits written held rounded (for the head's bf16 GEMMs, its only readers): the bits
  // of rounding its values, without their (N, V) in the storage type.
  virtual void cross_entropy_backward_rounded(const T* logits, const int32_t* targets, T scale, Rounded<T>* dlogits,
                                              int64_t N, int64_t V) = 0;

  // Cross-entropy over a vocabulary split over ranks (parallel/vocab_parallel.h), on this rank's block of V
  // logits per row, vocabulary ids [first, first + V). row_max (N, double): each row's largest logit.
  virtual void logits_row_max(const T* logits, int64_t N, int64_t V, double* row_max) = 0;
  // sums (2 N, double): [0, N) each row's sum of exp(logit - row_max) over the block; [N, 2 N) the target's
  // logit where the block holds the row's target, else 0.
  virtual void logits_sum_exp(const T* logits, const int32_t* targets, int64_t first, const double* row_max,
                              double* sums, int64_t N, int64_t V) = 0;
  // row_max (N): each row's largest of the P blocks' maxima in block_max (P, N: every rank's logits_row_max).
  virtual void logits_max_over_blocks(const double* block_max, double* row_max, int64_t P, int64_t N) = 0;
  // From row_max (N) and the whole vocabulary's sums (2 N, as logits_sum_exp's summed over the blocks): each row's
  // log-sum-exp l = row_max + log(sum), lse = l and losses = l - the target's logit (N each, written).
  virtual void logits_loss_finish(const double* row_max, const double* sums, T* lse, T* losses, int64_t N) = 0;
  // dlogits = exp(logit - lse) * scale, less scale at the target's column where the block holds it (written).
  virtual void logits_softmax_backward(const T* logits, const int32_t* targets, int64_t first, const T* lse, T scale,
                                       T* dlogits, int64_t N, int64_t V) = 0;
  // logits_softmax_backward's dlogits written held rounded, as cross_entropy_backward_rounded.
  virtual void logits_softmax_backward_rounded(const T* logits, const int32_t* targets, int64_t first, const T* lse,
                                               T scale, Rounded<T>* dlogits, int64_t N, int64_t V) = 0;

  // y += x over n (the residual stream).
  virtual void add_inplace(T* y, const T* x, int64_t n) = 0;
  // y = a + b over n.
  virtual void add(const T* a, const T* b, T* y, int64_t n) = 0;
  virtual void copy(const T* x, T* y, int64_t n) = 0;
  // y[r ldy + c] = x[r ldx + c] for r < rows, c < cols: a block of rows between strided matrices (a column block of
  // a wider one), within the backend's memory.
  virtual void copy_strided(const T* x, int64_t ldx, T* y, int64_t ldy, int64_t rows, int64_t cols) = 0;
  virtual void fill(T* y, T value, int64_t n) = 0;
  virtual void scale(T* y, T factor, int64_t n) = 0;
  // Sum of squares in double, in a fixed order (same result whatever the thread count). A value for the host: a
  // wait for the backend, counted (host_reads).
  double sum_squares(const T* x, int64_t n) {
    ++host_reads_;
    return sum_squares_to_host(x, n);
  }
  // The same sum written to backend memory (*out, one double) instead of returned: no wait, so that the sums of
  // many segments reach the host in one download.
  virtual void sum_squares_into(const T* x, int64_t n, double* out) = 0;
  // The sums of squares of `count` segments of one buffer: out[i] (count doubles in backend memory, written) is
  // bit for bit what sum_squares_into(base + segments[i].offset, segments[i].length, out + i) writes on the same
  // backend (an empty segment's is 0); `segments` is a host array, read at the call, of offsets and lengths >= 0,
  // each segment inside the buffer that holds base. The gradient norm's sums in one call: on CUDA two launches
  // whatever the count (every chunk of every segment in one, then a block per segment finishing its chunks'
  // partials in a fixed tree), so the order depends on the segments' lengths alone and a run repeats bit for bit.
  virtual void sum_squares_segments_into(const T* base, const SumSegment* segments, int64_t count, double* out) = 0;
  // The ops so far that returned a value to the host (Backend::host_traffic).
  int64_t host_reads() const { return host_reads_.load(); }

  // ---- The MoE path ----------------------------------------------------------------------------
  // The routed experts' SwiGLU MLPs (core/moe/experts.h): `groups` of them over the row blocks of row_offset
  // (as grouped_gemm's), with weight stacks w13 (groups, D, 2F: each row [W1 row | W3 row], so that x W1 and x W3
  // are one GEMM, x W13) and w2 (groups, F, D), and their gradients.
  struct ExpertMlp {
    int64_t groups;
    const int64_t* row_offset;
    int64_t D, F;
    const T *w13, *w2;
    T *dw13, *dw2;
    GemmPrecision precision = GemmPrecision::Fp32;  // of its GEMMs (w13, w2 are weights)
  };
  // x: (rows, D). Writes ab = x W13 (rows, 2F: each row [a | b], a = x W1, b = x W3), h = silu(a) * b (rows, F) and
  // y = h W2 (rows, D), block by block. This default is the grouped GEMMs and the SwiGLU over all blocks, op after
  // op; a backend may instead run each block's whole sequence at once (the CPU backend does), with the same bits.
  virtual void expert_mlp_forward(const ExpertMlp& e, const T* x, T* ab, T* h, T* y) {
    expert_mlp_forward_as<false>(e, x, ab, h, y);
  }
  // After expert_mlp_forward (x, ab, h its operands and outputs); dy: (rows, D). dh (rows, F) and dab (rows, 2F:
  // [da | db]) workspace; dx = dab W13^T (rows, D) written, one GEMM; dw13, dw2 accumulate. Default: op after op.
  virtual void expert_mlp_backward(const ExpertMlp& e, const T* x, const T* ab, const T* h, const T* dy, T* dh, T* dab,
                                   T* dx) {
    expert_mlp_backward_as<false>(e, x, ab, h, dy, dh, dab, dx);
  }
  // The experts' MLP keeping its tensors held rounded (Rounded; bf16 GEMMs, e.precision Bf16): x as the dispatch
  // gathered it, ab as the GEMM's fp32 results rounded as they are stored (GroupedGemmArgs::C_rounded), h the
  // SwiGLU of their values rounded (swiglu_forward_rounded), and the backward's SwiGLU on them
  // (swiglu_backward_rounded): half the memory of expert_mlp_forward's, its results within bf16's rounding of a and
  // b. The backward's operands that only its GEMMs read are held rounded too, each rounded once: dy into dy_held
  // (rows, D), dab (rows, 2F) as the SwiGLU's backward writes it; dh (rows, F) stays in T. The default: op after op.
  virtual void expert_mlp_forward_rounded(const ExpertMlp& e, const Rounded<T>* x, Rounded<T>* ab, Rounded<T>* h,
                                          T* y) {
    expert_mlp_forward_as<true>(e, x, ab, h, y);
  }
  virtual void expert_mlp_backward_rounded(const ExpertMlp& e, const Rounded<T>* x, const Rounded<T>* ab,
                                           const Rounded<T>* h, const T* dy, Rounded<T>* dy_held, T* dh,
                                           Rounded<T>* dab, T* dx) {
    const int64_t first = e.row_offset[0], rows = e.row_offset[e.groups] - first;
    round_values(dy + first * e.D, dy_held + first * e.D, rows * e.D);
    expert_mlp_backward_as<true>(e, x, ab, h, dy_held, dh, dab, dx);
  }

  // Standard Gumbel noise of one Philox stream (core/philox.h, RngStream with this key):
  // out[i] = gumbel(a = step, b = first_counter + i) for i < n, in double.
  virtual void gumbel_noise(uint64_t key, uint64_t step, uint64_t first_counter, double* out, int64_t n) = 0;
  // Row scores of (z + noise) / tau in double (noise: (N, E) or null): p = softmax over each row, or
  // p = sigmoid elementwise. z, p: (N, E).
  virtual void softmax_rows(const T* z, const double* noise, double tau, T* p, int64_t N, int64_t E) = 0;
  virtual void sigmoid_rows(const T* z, const double* noise, double tau, T* p, int64_t N, int64_t E) = 0;
  // The K best columns of each row by double(p) + bias (bias: (E) or null), ties to the lower column,
  // masked columns (mask: (E), nonzero = masked; or null) never chosen, best first, -1 after the last
  // usable one. p: (N, E); index: (N, K).
  virtual void topk_rows(const T* p, const float* bias, const uint8_t* mask, int32_t* index, int64_t N, int64_t E,
                         int64_t K) = 0;

  // dst[r] = scale[r] * src[index[r]] (scale null: a copy); index < 0 gives a zero row. dst: (rows, D).
  virtual void gather_rows(const T* src, const int32_t* index, const T* scale, T* dst, int64_t rows, int64_t D) = 0;
  // dst[r] = src[index[r]] held rounded (for the bf16 GEMMs that read it); index < 0 gives a zero row.
  virtual void gather_rows_rounded(const T* src, const int32_t* index, Rounded<T>* dst, int64_t rows, int64_t D) = 0;
  // dst[index[r]] += scale[r] * src[r] (scale null: src[r]); rows sharing a destination add in row order.
  virtual void scatter_add_rows(const T* src, const int32_t* index, const T* scale, T* dst, int64_t rows,
                                int64_t D) = 0;
  // The combine, a scatter-add written as a gather so that each token sums its K rows in choice order:
  // dst[n] = (accumulate ? dst[n] : 0) + sum_j weight[n K + j] * src[index[n K + j]] over j < K with
  // index >= 0 (weight null: 1). src: (rows, D); index, weight: (N, K); dst: (N, D).
  virtual void combine_rows(const T* src, const int32_t* index, const T* weight, T* dst, int64_t N, int64_t K,
                            int64_t D, bool accumulate) = 0;
  // out[r] = sum_d a[index[r], d] * b[r, d], accumulated in double. a: (*, D); b: (rows, D); out: (rows).
  virtual void row_dots(const T* a, const int32_t* index, const T* b, T* out, int64_t rows, int64_t D) = 0;

  // ---- The router's forward after the scores (core/moe/router.h, docs/moe.md) ----------------------
  // Per token n < N: selected[n K + j] = preference[n W + j] for j < K (W >= K, the preference row's width), its
  // score p[n, selected] in selected_score (0 where -1), and the gate weights: raw w_j = p[e_j] (denom 1), or
  // renormalised w_j = p[e_j] / max(sum_i p[e_i], 1e-6), clamped[n] = 1 where the floor holds. scores: (N, E);
  // preference: (N, W); selected, selected_score, gate: (N, K); denom, clamped: (N).
  virtual void gate_weights(const T* scores, const int32_t* preference, int64_t W, bool renormalised, int32_t* selected,
                            T* selected_score, T* gate, T* denom, uint8_t* clamped, int64_t N, int64_t E,
                            int64_t K) = 0;
  // f (E): the share of the N K entries of top (N, K) that name each expert (every entry names one).
  virtual void expert_fractions(const int32_t* top, T* f, int64_t N, int64_t K, int64_t E) = 0;
  // The sums behind the router losses' values (MODEL.md "Router losses"), over the rows in order, in double:
  // out[e] = sum_n p[n, e] for e < E, out[E] = sum_n lse(z_n)^2, out[E + 1] = sum_n -sum_e p log max(p, 1e-30).
  // logits, scores: (N, E); out: (E + 2).
  virtual void router_loss_sums(const T* logits, const T* scores, double* out, int64_t N, int64_t E) = 0;

  // ---- The dispatch plan (core/moe/dispatch_plan.h, MODEL.md "Capacity") ------------------------------
  // Slot s = n K + j of the M = N K assignments is token n's j-th choice; selected (M): its expert, -1 if none.
  // assigned[s] (M, written) = selected[s] where s is among the `capacity` first slots of its expert in priority
  // order (by_score: the higher score[s] first, ties to the lower slot; else the lower slot first), else -1.
  // capacity INT64_MAX: no limit (dropless). score: (M), not read unless by_score.
  virtual void capacity_keep(const int32_t* selected, const T* score, bool by_score, int64_t capacity,
                             int32_t* assigned, int64_t M, int64_t E) = 0;
  // Overflow rerouted (moe.overflow reroute; dispatch_plan.h): after capacity_keep, the overflowed slots (selected,
  // the first K of their token's preference row, but not assigned) in the same priority order, one after another,
  // each to the first expert e further down its token's row with fewer than `capacity` assigned slots that the
  // token neither selected nor was assigned: assigned[s] = e; what finds none stays -1. preference: (N, W), -1
  // after the last; score: (M), not read unless by_score; assigned: (M), updated; *rerouted (1, written): the slots
  // rerouted. M = N K.
  virtual void reroute_overflow(const int32_t* preference, int64_t W, const T* score, bool by_score, int64_t capacity,
                                int32_t* assigned, int64_t* rerouted, int64_t N, int64_t K, int64_t E) = 0;
  // The dense fallback's rows (moe.overflow dense, and the cascade's last level): slot s is the fallback's where
  // selected[s] >= 0 and assigned[s] < 0. token (N): the tokens with such a slot, in order, then -1; weight (N):
  // each one's such slots' gate weights summed in double in slot order, then 0; source, slot (M): each such slot in
  // order, its token's row in `token` and the slot, then -1; count (2): the tokens and the slots. All written.
  virtual void fallback_rows(const int32_t* selected, const int32_t* assigned, const T* gate, int64_t K, int32_t* token,
                             T* weight, int32_t* source, int32_t* slot, int64_t* count, int64_t N) = 0;
  // The permutation that puts each expert's rows in one block, a stable sort of the slots by assigned expert
  // (assigned: (M), -1 if no expert): offset (E + 1): expert e's rows are [offset[e], offset[e + 1]); perm_slot
  // (M): row -> slot, slots in order within an expert, -1 from offset[E] on; row_of_slot (M): slot -> row, -1
  // where assigned is. All written.
  virtual void permute_by_expert(const int32_t* assigned, int64_t* offset, int32_t* perm_slot, int32_t* row_of_slot,
                                 int64_t M, int64_t E) = 0;
  // One part of a permutation, a routing group's when its tokens are split over ranks: the rows of permute_by_expert's
  // offset (E + 1) and perm_slot (offset[E] rows) whose slots lie in [lo, hi), in the same order (by expert, slots
  // in order), renumbered from 0, and their slots renumbered from lo: part_offset (E + 1), part_perm_slot (hi - lo):
  // row -> slot - lo, -1 from part_offset[E] on; part_row_of_slot (hi - lo): slot - lo -> row, -1 where the slot
  // has none. All written; the same as permute_by_expert of the part's own assignments.
  virtual void restrict_permutation(const int64_t* offset, const int32_t* perm_slot, int64_t lo, int64_t hi,
                                    int64_t* part_offset, int32_t* part_perm_slot, int32_t* part_row_of_slot, int64_t M,
                                    int64_t E) = 0;
  // What the row-moving ops take from the permutation: each permuted row's token and gate weight,
  // perm_token[r] = perm_slot[r] / K and perm_gate[r] = gate[perm_slot[r]], -1 and 0 where perm_slot[r] < 0.
  // perm_slot, perm_token, perm_gate: (M); gate: (M), by slot.
  virtual void permuted_rows(const int32_t* perm_slot, const T* gate, int64_t K, int32_t* perm_token, T* perm_gate,
                             int64_t M) = 0;

  // ---- The router's backward (core/moe/router.h, docs/moe.md) ---------------------------------------
  // Gate weights -> scores, per token n < N: dp[n, selected[n K + j]] += dw[n K + j] / denom[n] for raw gates;
  // renormalised ones (w_j = p[e_j] / denom) add (dw_j - sum_i dw_i gate_i) / denom, the sum 0 where
  // clamped[n] (a clamped denominator is a constant). selected < 0 is skipped. gate, selected, dw: (N, K);
  // denom, clamped: (N); dp: (N, E), accumulates.
  virtual void gate_backward(const T* gate, const int32_t* selected, const T* dw, const T* denom,
                             const uint8_t* clamped, bool renormalised, T* dp, int64_t N, int64_t K, int64_t E) = 0;
  // The router losses' coefficients (MODEL.md "Router losses"; docs/moe.md for the warm-up term), each
  // gradient scaled by `scale` (the group's share of the step's loss).
  struct RouterLossGrad {
    double scale, coef_aux, coef_z, coef_entropy, coef_death, death_floor, coef_warmup;
    bool warming;  // the warm-up term is on this step
  };
  // With P_e the column means of the scores and f (E) the top-k fractions: dp[n, e] += scale (coef_aux E f_e / N
  // + coef_entropy (log max(p, 1e-30) + 1) / N - (P_e < floor) coef_death / N + warm-up); dz[n, e] += scale coef_z
  // 2 lse_n softmax(z_n)_e / N. logits, scores, dp, dz: (N, E).
  virtual void router_loss_backward(const T* logits, const T* scores, const T* f, const RouterLossGrad& c, T* dp, T* dz,
                                    int64_t N, int64_t E) = 0;
  // Scores -> logits: dz[n] += J(p_n)^T dp[n] / tau, J the softmax's Jacobian (or the sigmoid's, elementwise).
  // With logits (a learned temperature), also *d_log_tau (one double, written) = -sum over rows
  // [own_first, own_first + own_count) of that row's term times (z + noise) (noise: (N, E) or null); without,
  // own_first, own_count and d_log_tau are not read. scores, dp, dz: (N, E).
  virtual void score_backward(const T* scores, const T* dp, double tau, bool sigmoid, const T* logits,
                              const double* noise, int64_t own_first, int64_t own_count, double* d_log_tau, T* dz,
                              int64_t N, int64_t E) = 0;

  // ---- The optimizer ---------------------------------------------------------------------------
  // One AdamW update over n elements, decoupled weight decay (optim/adamw.h):
  //   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  p -= decay p;  p -= step_size m / (sqrt(v inv_bc2) + eps)
  // Where p lies in the parameters' memory and their rounded copy is current (set_parameter_memory), the same
  // pass writes the new p rounded into the copy, so that the copy stays current without a rounding pass.
  struct AdamWStep {
    T beta1, beta2, step_size, inv_bc2, eps, decay;
  };
  virtual void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const AdamWStep& step) = 0;

 protected:
  virtual double sum_squares_to_host(const T* x, int64_t n) = 0;  // sum_squares
  virtual void run_gemm(const Gemm& g) = 0;                       // gemm, its weight checked
  virtual void run_grouped_gemm(const GroupedGemm& g) = 0;        // grouped_gemm, its weight checked
  // The default expert MLP, op after op: its tensors as stored (X = T), or held rounded (kRounded, X = Rounded<T>),
  // read and written through the GEMM arguments' plain or rounded operands.
  template <bool kRounded>
  using Held = std::conditional_t<kRounded, Rounded<T>, T>;
  template <bool kRounded>
  static GroupedGemm reading(GroupedGemm g, const Held<kRounded>* A) {
    if constexpr (kRounded)
      g.A_rounded = A;
    else
      g.A = A;
    return g;
  }
  template <bool kRounded>
  static GroupedGemm writing(GroupedGemm g, Held<kRounded>* C) {
    if constexpr (kRounded)
      g.C_rounded = C;
    else
      g.C = C;
    return g;
  }
  template <bool kRounded, typename X = Held<kRounded>>
  void expert_mlp_forward_as(const ExpertMlp& e, const X* x, X* ab, X* h, T* y) {
    const int64_t G = e.groups, D = e.D, F = e.F, first = e.row_offset[0], R = e.row_offset[G] - first;
    const GroupedGemm g{.groups = G, .row_offset = e.row_offset, .precision = e.precision, .weight = GemmWeight::B};
    auto shape = [](GroupedGemm s, const T* w, int64_t N, int64_t K) { return s.B = w, s.N = N, s.K = K, s; };
    grouped_gemm(writing<kRounded>(reading<kRounded>(shape(g, e.w13, 2 * F, D), x), ab));  // [a | b] = x W13
    if constexpr (kRounded)
      swiglu_forward_rounded(ab + first * 2 * F, h + first * F, R, F);
    else
      swiglu_forward(ab + first * 2 * F, h + first * F, R, F);
    GroupedGemm out = reading<kRounded>(shape(g, e.w2, D, F), h);  // y = h W2
    out.C = y;
    grouped_gemm(out);
  }
  template <bool kRounded>
  static GroupedGemm reading_b(GroupedGemm g, const Held<kRounded>* B) {
    if constexpr (kRounded)
      g.B_rounded = B;
    else
      g.B = B;
    return g;
  }
  // Its backward, dy as its GEMMs read it (held rounded with kRounded: Ops::expert_mlp_backward_rounded's dy_held).
  template <bool kRounded, typename X = Held<kRounded>>
  void expert_mlp_backward_as(const ExpertMlp& e, const X* x, const X* ab, const X* h, const X* dy, T* dh, X* dab,
                              T* dx) {
    const int64_t G = e.groups, D = e.D, F = e.F, first = e.row_offset[0], R = e.row_offset[G] - first;
    const GroupedGemm g{.groups = G, .row_offset = e.row_offset, .precision = e.precision};
    auto grad = [&](const X* A, const X* B, T* dW, int64_t N, int64_t K) {  // dW += A^T B
      GroupedGemm s = reading_b<kRounded>(reading<kRounded>(g, A), B);
      s.trans_a = true, s.N = N, s.K = K, s.beta = T(1), s.C = dW;
      grouped_gemm(s);
    };
    auto input = [&](const X* A, const T* w, T* C, int64_t N, int64_t K) {  // C = A w^T
      GroupedGemm s = reading<kRounded>(g, A);
      s.trans_b = true, s.N = N, s.K = K, s.B = w, s.C = C, s.weight = GemmWeight::B;
      grouped_gemm(s);
    };
    grad(h, dy, e.dw2, D, F);   // dW2 += h^T dy
    input(dy, e.w2, dh, F, D);  // dh = dy W2^T
    if constexpr (kRounded)
      swiglu_backward_rounded(ab + first * 2 * F, dh + first * F, dab + first * 2 * F, R, F);
    else
      swiglu_backward(ab + first * 2 * F, dh + first * F, dab + first * 2 * F, R, F);
    grad(x, dab, e.dw13, 2 * F, D);   // dW13 += x^T [da | db]
    input(dab, e.w13, dx, D, 2 * F);  // dx = [da | db] W13^T
  }

  // A producer's rounded operand stands in for operand `name` under a bf16 GEMM, never beside it nor as a weight.
  static void check_rounded_operand(const T* X, const Rounded<T>* X_rounded, GemmPrecision precision, bool weight,
                                    const char* op, char name) {
    MOE_CHECK(!X_rounded || (!X && precision == GemmPrecision::Bf16 && !weight),
              op << ": a rounded operand " << name << " is read in " << name << "'s place (" << name
                 << " null) by a bf16 GEMM, and is not a weight");
  }
  // A GEMM operand named as a weight, `extent` elements from w, must lie inside the parameters' memory while one is
  // registered: the rounded copy holds nothing else, so a weight outside it is a caller's mistake, refused.
  void check_weight(const T* w, int64_t extent, const char* op) const {
    MOE_CHECK(!parameters_ || (w >= parameters_ && w + extent <= parameters_ + parameter_count_),
              op << ": the operand named as a weight (" << extent << " elements) does not lie in the parameters' "
                 << "memory (" << parameter_count_ << " elements); name only a slice of the parameters as a weight");
  }

 private:
  std::atomic<int64_t> host_reads_{0};
  bool fused_attention_ = true;
  const T* parameters_ = nullptr;
  int64_t parameter_count_ = 0;
  uint64_t parameter_version_ = 0;
};

}  // namespace moe
