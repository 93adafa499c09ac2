// The op conformance suite, operands held rounded by their producers (train.precision = bf16): the rotation in the
// cast (rope_rounded) and attention reading q, k, v held rounded and writing or reading its output so, plain and
// fused, give the bits of the same ops on the stored values (rounded as the products read them); a held operand
// cuDNN cannot read in place (misaligned) is copied, with the same bits; held operands where they do not belong are
// refused. Also the GEMMs reading a rounded operand in its place, the producers that write their results rounded
// (SwiGLU, the logits' gradient, the residual norms, the gathered rows) and the experts' MLP keeping its tensors
// rounded. Every backend, fp32 and fp64 (whose held values are its own type, rounded).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "core/backend/ops.h"
#include "core/dtype.h"
#include "tests/core/conformance.h"

namespace moe::conformance {
namespace {

// The bits of `want` where the backend is the reference's kind (cpu, and the strict device running its ops); within
// T's bound elsewhere (a device's library may order a held call's sums differently).
template <typename T>
void expect_same(Backend& b, const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
                 int64_t reduction_length) {
  if (std::string(b.ops<T>().name()) == "cpu")
    EXPECT_EQ(got, want) << what;
  else
    expect_close<T>(what, got, want, reduction_length);
}

template <typename T>
void rope_rounded_cases(Backend& b) {
  Ops<T>& o = b.ops<T>();
  const int64_t B = 2, T_ = 5, H = 3, Dh = 8, n = B * T_ * H * Dh;
  const auto X = randn(n, "rope x");
  for (const bool inverse : {false, true}) {
    Buffer x = put<T>(b, X), rotated = put<T>(b, X), y = b.allocate(dtype_of<Rounded<T>>(), n);
    o.rope(rotated.data<T>(), B, T_, H, Dh, inverse);
    o.rope_rounded(x.data<T>(), y.data<Rounded<T>>(), B, T_, H, Dh, inverse);
    EXPECT_EQ(values<T>(b.download<Rounded<T>>(y)), rounded_values<T>(get<T>(b, rotated))) << "inverse " << inverse;
    EXPECT_EQ(get<T>(b, x), get<T>(b, put<T>(b, X))) << "x unchanged";
  }
}

TEST_P(Conformance, RopeRoundedIsRopeThenRounding) {
  rope_rounded_cases<float>(backend());
  rope_rounded_cases<double>(backend());
}

constexpr int64_t kB = 2, kT = 17, kH = 3, kDh = 8, kN = kB * kT * kH * kDh;
const AttentionShape kShape{kB, kT, kH, kDh, GemmPrecision::Bf16};

// One attention's operands on a backend: q, k, v, dout as stored and q, k, v held (q one element into its buffer
// where `offset`: not 16-byte aligned).
template <typename T>
struct Operands {
  Operands(Backend& b, bool offset)
      : q(put<T>(b, Q)),
        k(put<T>(b, K)),
        v(put<T>(b, V)),
        dout(put<T>(b, DO)),
        qr(b.upload(shifted(Q, offset))),
        kr(b.upload(held<T>(K))),
        vr(b.upload(held<T>(V))),
        first(offset ? 1 : 0) {}
  static std::vector<Rounded<T>> shifted(const std::vector<double>& x, bool offset) {
    std::vector<Rounded<T>> h = held<T>(x);
    if (offset) h.insert(h.begin(), Rounded<T>{});
    return h;
  }
  const Rounded<T>* q_held() const { return qr.data<Rounded<T>>() + first; }
  const Rounded<T>* k_held() const { return kr.data<Rounded<T>>(); }
  const Rounded<T>* v_held() const { return vr.data<Rounded<T>>(); }
  inline static const std::vector<double> Q = randn(kN, "q"), K = randn(kN, "k"), V = randn(kN, "v"),
                                          DO = randn(kN, "do");
  Buffer q, k, v, dout, qr, kr, vr;
  int64_t first;
};

// The plain form: held q, k, v with the output held and as stored (selective recompute's form), and the backward.
template <typename T>
void held_plain_attention_cases(Backend& b) {
  Ops<T>& o = b.ops<T>();
  const Operands<T> in(b, false);
  constexpr DType t = dtype_of<T>(), h = dtype_of<Rounded<T>>();
  const int64_t P = kB * kH * kT * kT;
  Buffer out = b.allocate(t, kN), probs = b.allocate(t, P), out_held = b.allocate(h, kN), probs2 = b.allocate(t, P),
         out2 = b.allocate(t, kN), probs3 = b.allocate(t, P);
  o.attention_forward({.shape = kShape,
                       .q = in.q.template data<T>(),
                       .k = in.k.template data<T>(),
                       .v = in.v.template data<T>(),
                       .out = out.data<T>(),
                       .probs = probs.data<T>()});
  o.attention_forward({.shape = kShape,
                       .probs = probs2.data<T>(),
                       .q_rounded = in.q_held(),
                       .k_rounded = in.k_held(),
                       .v_rounded = in.v_held(),
                       .out_rounded = out_held.data<Rounded<T>>()});
  o.attention_forward({.shape = kShape,
                       .out = out2.data<T>(),
                       .probs = probs3.data<T>(),
                       .q_rounded = in.q_held(),
                       .k_rounded = in.k_held(),
                       .v_rounded = in.v_held()});
  EXPECT_EQ(values<T>(b.download<Rounded<T>>(out_held)), rounded_values<T>(get<T>(b, out))) << "output held";
  expect_same<T>(b, "probabilities", get<T>(b, probs2), get<T>(b, probs), kDh);
  expect_same<T>(b, "output as stored", get<T>(b, out2), get<T>(b, out), kT);
  Buffer g[6] = {b.allocate(t, kN), b.allocate(t, kN), b.allocate(t, kN),
                 b.allocate(t, kN), b.allocate(t, kN), b.allocate(t, kN)};
  Buffer scratch = b.allocate(t, kT * kT);
  o.attention_backward({.shape = kShape,
                        .q = in.q.template data<T>(),
                        .k = in.k.template data<T>(),
                        .v = in.v.template data<T>(),
                        .probs = probs.data<T>(),
                        .dout = in.dout.template data<T>(),
                        .dq = g[0].data<T>(),
                        .dk = g[1].data<T>(),
                        .dv = g[2].data<T>(),
                        .scratch = scratch.data<T>()});
  o.attention_backward({.shape = kShape,
                        .probs = probs.data<T>(),
                        .dout = in.dout.template data<T>(),
                        .dq = g[3].data<T>(),
                        .dk = g[4].data<T>(),
                        .dv = g[5].data<T>(),
                        .scratch = scratch.data<T>(),
                        .q_rounded = in.q_held(),
                        .k_rounded = in.k_held(),
                        .v_rounded = in.v_held()});
  const char* names[3] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) expect_same<T>(b, names[i], get<T>(b, g[3 + i]), get<T>(b, g[i]), kT);
}

TEST_P(Conformance, AttentionReadsHeldOperandsAndWritesItsOutputHeld) {
  held_plain_attention_cases<float>(backend());
  held_plain_attention_cases<double>(backend());
}

// The fused form where the backend offers it (the CPU once allowed; cuDNN for fp32 storage): held q, k, v and output
// against the stored ones, q misaligned once (cuDNN then copies it).
template <typename T>
void held_fused_attention_cases(Backend& b, bool offset) {
  Ops<T>& o = b.ops<T>();
  const bool allowed = o.fused_attention_allowed();
  o.set_fused_attention(true);
  if (o.fused_attention_supported(kShape)) {
    const Operands<T> in(b, offset);
    constexpr DType t = dtype_of<T>(), h = dtype_of<Rounded<T>>();
    const int64_t S = kB * kH * kT;
    Buffer out = b.allocate(t, kN), stats = b.allocate(t, S), out_held = b.allocate(h, kN), stats2 = b.allocate(t, S);
    o.attention_forward_fused({.shape = kShape,
                               .q = in.q.template data<T>(),
                               .k = in.k.template data<T>(),
                               .v = in.v.template data<T>(),
                               .out = out.data<T>(),
                               .stats = stats.data<T>()});
    o.attention_forward_fused({.shape = kShape,
                               .stats = stats2.data<T>(),
                               .q_rounded = in.q_held(),
                               .k_rounded = in.k_held(),
                               .v_rounded = in.v_held(),
                               .out_rounded = out_held.data<Rounded<T>>()});
    EXPECT_EQ(values<T>(b.download<Rounded<T>>(out_held)), rounded_values<T>(get<T>(b, out))) << "fused output held";
    expect_same<T>(b, "fused log-sum-exp", get<T>(b, stats2), get<T>(b, stats), kDh);
    Buffer g[6] = {b.allocate(t, kN), b.allocate(t, kN), b.allocate(t, kN),
                   b.allocate(t, kN), b.allocate(t, kN), b.allocate(t, kN)};
    o.attention_backward_fused({.shape = kShape,
                                .q = in.q.template data<T>(),
                                .k = in.k.template data<T>(),
                                .v = in.v.template data<T>(),
                                .out = out.data<T>(),
                                .stats = stats.data<T>(),
                                .dout = in.dout.template data<T>(),
                                .dq = g[0].data<T>(),
                                .dk = g[1].data<T>(),
                                .dv = g[2].data<T>()});
    o.attention_backward_fused({.shape = kShape,
                                .stats = stats.data<T>(),
                                .dout = in.dout.template data<T>(),
                                .dq = g[3].data<T>(),
                                .dk = g[4].data<T>(),
                                .dv = g[5].data<T>(),
                                .q_rounded = in.q_held(),
                                .k_rounded = in.k_held(),
                                .v_rounded = in.v_held(),
                                .out_rounded = out_held.data<Rounded<T>>()});
    const char* names[3] = {"fused dq", "fused dk", "fused dv"};
    for (int i = 0; i < 3; ++i) expect_same<T>(b, names[i], get<T>(b, g[3 + i]), get<T>(b, g[i]), kT);
  }
  o.set_fused_attention(allowed);
}

TEST_P(Conformance, FusedAttentionReadsHeldOperandsInPlaceOrCopied) {
  for (const bool offset : {false, true}) {
    SCOPED_TRACE(offset ? "q misaligned" : "q aligned");
    held_fused_attention_cases<float>(backend(), offset);
    held_fused_attention_cases<double>(backend(), offset);
  }
}

// Held operands are for bf16 products, q, k and v together, each given once; out likewise once.
TEST_P(Conformance, HeldAttentionOperandsAreRefusedWhereTheyDoNotBelong) {
  Backend& b = backend();
  Ops<float>& o = b.ops<float>();
  const Operands<float> in(b, false);
  Buffer out = b.allocate(DType::F32, kN), probs = b.allocate(DType::F32, kB * kH * kT * kT),
         out_held = b.allocate(DType::BF16, kN);
  AttentionForwardArgs<float> a{.shape = kShape,
                                .out = out.data<float>(),
                                .probs = probs.data<float>(),
                                .q_rounded = in.q_held(),
                                .k_rounded = in.k_held(),
                                .v_rounded = in.v_held()};
  a.shape.precision = GemmPrecision::Fp32;
  EXPECT_THROW(o.attention_forward(a), Error) << "fp32 products";
  a.shape.precision = GemmPrecision::Bf16, a.k_rounded = nullptr, a.k = in.k.data<float>();
  EXPECT_THROW(o.attention_forward(a), Error) << "k stored beside q held";
  a.k_rounded = in.k_held();
  EXPECT_THROW(o.attention_forward(a), Error) << "k given twice";
  a.k = nullptr, a.out_rounded = out_held.data<bf16>();
  EXPECT_THROW(o.attention_forward(a), Error) << "out given twice";
  a.out = nullptr;
  EXPECT_NO_THROW(o.attention_forward(a)) << "held";
  b.synchronize();
}

// ---- Operands held rounded by their producers (dtype.h Rounded; train.precision = bf16) ----------------------

// A bf16 GEMM reads a rounded A in A's place: the same bits as rounding A at the call, every layout, plain and
// grouped (strided A for the plain one); a plain GEMM and a grouped weight gradient read B held rounded likewise.
template <typename T>
void rounded_operand_gemm_cases(Backend& b) {
  Ops<T>& o = b.ops<T>();
  const int64_t M = 9, N = 11, K = 14;
  for (int mode = 0; mode < 3; ++mode) {  // A B, A B^T, A^T B
    const bool ta = mode == 2, tb = mode == 1;
    const int64_t lda = (ta ? M : K) + 2;
    const auto A = randn((ta ? K : M) * lda, "rA"), B = randn(K * N, "rB"), C = randn(M * N, "rC");
    Buffer a = put<T>(b, A), held_a = b.upload(held<T>(A)), bb = put<T>(b, B), c1 = put<T>(b, C), c2 = put<T>(b, C);
    typename Ops<T>::Gemm g{.trans_a = ta,
                            .trans_b = tb,
                            .M = M,
                            .N = N,
                            .K = K,
                            .alpha = T(0.5),
                            .lda = lda,
                            .B = bb.data<T>(),
                            .ldb = tb ? K : N,
                            .beta = T(0.25),
                            .C = c1.data<T>(),
                            .ldc = N,
                            .precision = GemmPrecision::Bf16};
    g.A = a.data<T>();
    o.gemm(g);
    g.A = nullptr, g.A_rounded = held_a.data<Rounded<T>>(), g.C = c2.data<T>();
    o.gemm(g);
    EXPECT_EQ(get<T>(b, c1), get<T>(b, c2)) << "gemm mode " << mode;
    Buffer held_b = b.upload(held<T>(B)), c3 = put<T>(b, C), c4 = put<T>(b, C);
    g.B = nullptr, g.B_rounded = held_b.data<Rounded<T>>(), g.C = c3.data<T>();
    o.gemm(g);
    EXPECT_EQ(get<T>(b, c1), get<T>(b, c3)) << "gemm mode " << mode << ", A and B held rounded";
    g.A = a.data<T>(), g.A_rounded = nullptr, g.C = c4.data<T>();
    o.gemm(g);
    EXPECT_EQ(get<T>(b, c1), get<T>(b, c4)) << "gemm mode " << mode << ", B held rounded";
  }
  const int64_t G = int64_t(kExpertOffsets.size()) - 1, rows = kExpertOffsets.back();
  for (int mode = 0; mode < 3; ++mode) {
    const bool ta = mode == 2, tb = mode == 1;
    const auto A = randn(rows * K, "gA"), B = randn(ta ? rows * N : G * K * N, "gB");
    const auto C = randn(ta ? G * K * N : rows * N, "gC");
    Buffer a = put<T>(b, A), held_a = b.upload(held<T>(A)), bb = put<T>(b, B), c1 = put<T>(b, C), c2 = put<T>(b, C);
    typename Ops<T>::GroupedGemm g{.trans_a = ta,
                                   .trans_b = tb,
                                   .groups = G,
                                   .row_offset = kExpertOffsets.data(),
                                   .N = N,
                                   .K = K,
                                   .B = bb.data<T>(),
                                   .beta = T(1),
                                   .C = c1.data<T>(),
                                   .precision = GemmPrecision::Bf16};
    g.A = a.data<T>();
    o.grouped_gemm(g);
    g.A = nullptr, g.A_rounded = held_a.data<Rounded<T>>(), g.C = c2.data<T>();
    o.grouped_gemm(g);
    EXPECT_EQ(get<T>(b, c1), get<T>(b, c2)) << "grouped gemm mode " << mode;
    if (!ta) continue;  // B held rounded too: the weight gradients' row-blocked B
    Buffer held_b = b.upload(held<T>(B)), c3 = put<T>(b, C);
    g.B = nullptr, g.B_rounded = held_b.data<Rounded<T>>(), g.C = c3.data<T>();
    o.grouped_gemm(g);
    EXPECT_EQ(get<T>(b, c1), get<T>(b, c3)) << "grouped gemm, A and B held rounded";
  }
}

TEST_P(Conformance, GemmReadsARoundedOperandInAsPlace) {
  rounded_operand_gemm_cases<float>(backend());
  rounded_operand_gemm_cases<double>(backend());
}

// A rounded operand is for a bf16 GEMM, in A's place: beside A, with fp32 GEMMs or as a weight it is refused; a C
// held rounded likewise.
TEST_P(Conformance, ARoundedOperandIsRefusedOutsideABf16GemmsA) {
  Backend& b = backend();
  Buffer a = put<float>(b, randn(4, "x")), held_a = b.upload(held<float>(randn(4, "x"))),
         c = put<float>(b, randn(4, "c"));
  Ops<float>::Gemm g{.M = 2,
                     .N = 2,
                     .K = 2,
                     .A_rounded = held_a.data<bf16>(),
                     .lda = 2,
                     .B = a.data<float>(),
                     .ldb = 2,
                     .C = c.data<float>(),
                     .ldc = 2};
  EXPECT_THROW(b.ops<float>().gemm(g), Error) << "fp32";
  g.precision = GemmPrecision::Bf16, g.A = a.data<float>();
  EXPECT_THROW(b.ops<float>().gemm(g), Error) << "beside A";
  g.A = nullptr, g.weight = GemmWeight::A;
  EXPECT_THROW(b.ops<float>().gemm(g), Error) << "as a weight";
  // B held rounded likewise: in B's place, not a weight.
  g.A = a.data<float>(), g.A_rounded = nullptr, g.weight = GemmWeight::None, g.B_rounded = held_a.data<bf16>();
  EXPECT_THROW(b.ops<float>().gemm(g), Error) << "B beside B";
  g.B = nullptr, g.weight = GemmWeight::B;
  EXPECT_THROW(b.ops<float>().gemm(g), Error) << "B as a weight";
  g.weight = GemmWeight::None;
  EXPECT_NO_THROW(b.ops<float>().gemm(g)) << "B held rounded";
  // A grouped GEMM writing C held rounded: bf16, beta 0, not the weight-gradient form, in C's place.
  const std::vector<int64_t> offsets = {0, 2};
  Buffer c_held = b.allocate(DType::BF16, 4);
  Ops<float>::GroupedGemm gg{.groups = 1,
                             .row_offset = offsets.data(),
                             .N = 2,
                             .K = 2,
                             .A = a.data<float>(),
                             .B = a.data<float>(),
                             .C_rounded = c_held.data<bf16>()};
  EXPECT_THROW(b.ops<float>().grouped_gemm(gg), Error) << "fp32";
  gg.precision = GemmPrecision::Bf16, gg.beta = 1.0f;
  EXPECT_THROW(b.ops<float>().grouped_gemm(gg), Error) << "beta 1";
  gg.beta = 0.0f, gg.C = c.data<float>();
  EXPECT_THROW(b.ops<float>().grouped_gemm(gg), Error) << "beside C";
  gg.C = nullptr, gg.trans_a = true;
  EXPECT_THROW(b.ops<float>().grouped_gemm(gg), Error) << "trans_a";
  gg.trans_a = false;
  EXPECT_NO_THROW(b.ops<float>().grouped_gemm(gg)) << "the form it is for";
}

// The producers: the SwiGLU (forward and backward) on a and b held rounded is the plain one on their values, its h,
// da and db rounded; round_values rounds; the dispatch's gathered rows held rounded are the rows rounded; a grouped
// GEMM writing C held rounded writes its fp32 result rounded (exactly on the CPU backends; on a GPU, whose GEMM may sum
// in another order, within one bf16 unit of it). Each against the same backend's plain op.
// The head's logit gradients written held rounded: the op's own values rounded, over a whole vocabulary (an odd V, a
// target in each row) and over a block of it (targets in and outside [first, first + V)).
template <typename T>
void rounded_logit_gradient_cases(Backend& b) {
  Ops<T>& o = b.ops<T>();
  const int64_t N = 7, V = 37, first = 30;
  const std::vector<int32_t> targets = {0, 36, 5, 12, 20, 31, 1}, block_targets = {0, 36, 5, 40, 30, 31, 66};
  Buffer logits = put<T>(b, randn(N * V, "ce logits", 3.0)), t = put_index(b, targets),
         bt = put_index(b, block_targets);
  Buffer lse = put<T>(b, randn(N, "ce lse", 0.5)), d = b.allocate(dtype_of<T>(), N * V),
         dr = b.allocate(dtype_of<Rounded<T>>(), N * V);
  o.cross_entropy_backward(logits.data<T>(), t.data<int32_t>(), T(0.125), d.data<T>(), N, V);
  o.cross_entropy_backward_rounded(logits.data<T>(), t.data<int32_t>(), T(0.125), dr.data<Rounded<T>>(), N, V);
  EXPECT_EQ(values<T>(b.download<Rounded<T>>(dr)), rounded_values<T>(get<T>(b, d))) << "cross-entropy backward";
  o.logits_softmax_backward(logits.data<T>(), bt.data<int32_t>(), first, lse.data<T>(), T(0.125), d.data<T>(), N, V);
  o.logits_softmax_backward_rounded(logits.data<T>(), bt.data<int32_t>(), first, lse.data<T>(), T(0.125),
                                    dr.data<Rounded<T>>(), N, V);
  EXPECT_EQ(values<T>(b.download<Rounded<T>>(dr)), rounded_values<T>(get<T>(b, d))) << "vocabulary block backward";
}

// The residual norm writing its output held rounded: the plain op's sum and inverse RMS bit for bit, its y rounded,
// with the residual branch and without.
template <typename T>
void rounded_norm_cases(Backend& b) {
  Ops<T>& o = b.ops<T>();
  const int64_t N = 5, D = 19;
  Buffer x = put<T>(b, randn(N * D, "nx")), r = put<T>(b, randn(N * D, "nr")), gain = put<T>(b, randn(D, "ng", 0.5));
  for (const bool branch : {false, true}) {
    Buffer sum = b.allocate(dtype_of<T>(), N * D), y = b.allocate(dtype_of<T>(), N * D),
           rstd = b.allocate(dtype_of<T>(), N), sum2 = b.allocate(dtype_of<T>(), N * D),
           yr = b.allocate(dtype_of<Rounded<T>>(), N * D), rstd2 = b.allocate(dtype_of<T>(), N);
    const T* res = branch ? r.data<T>() : nullptr;
    o.rmsnorm_forward_residual(x.data<T>(), res, sum.data<T>(), gain.data<T>(), y.data<T>(), rstd.data<T>(), N, D);
    o.rmsnorm_forward_residual_rounded(x.data<T>(), res, sum2.data<T>(), gain.data<T>(), yr.data<Rounded<T>>(),
                                       rstd2.data<T>(), N, D);
    EXPECT_EQ(get<T>(b, sum2), get<T>(b, sum)) << "residual norm's sum, branch " << branch;
    EXPECT_EQ(get<T>(b, rstd2), get<T>(b, rstd)) << "residual norm's inverse RMS, branch " << branch;
    EXPECT_EQ(values<T>(b.download<Rounded<T>>(yr)), rounded_values<T>(get<T>(b, y)))
        << "residual norm, branch " << branch;
  }
}

template <typename T>
void rounded_producer_cases(Backend& b, bool exact_gemm) {
  Ops<T>& o = b.ops<T>();
  const int64_t n = 777, rows = 9, D = 13, SR = 37, SF = 21;  // the SwiGLU over SR rows of SF: SR SF = n
  const auto AB = rounded_values<T>(randn(2 * n, "sab")), DH = randn(n, "sdh");
  Buffer ab = put<T>(b, AB), abr = b.upload(held<T>(AB)), dh = put<T>(b, DH);
  Buffer h = b.allocate(dtype_of<T>(), n), hr = b.allocate(dtype_of<Rounded<T>>(), n);
  o.swiglu_forward(ab.data<T>(), h.data<T>(), SR, SF);
  o.swiglu_forward_rounded(abr.data<Rounded<T>>(), hr.data<Rounded<T>>(), SR, SF);
  EXPECT_EQ(values<T>(b.download<Rounded<T>>(hr)), rounded_values<T>(get<T>(b, h))) << "swiglu forward";
  Buffer dab = b.allocate(dtype_of<T>(), 2 * n), dabr = b.allocate(dtype_of<Rounded<T>>(), 2 * n);
  o.swiglu_backward(ab.data<T>(), dh.data<T>(), dab.data<T>(), SR, SF);
  o.swiglu_backward_rounded(abr.data<Rounded<T>>(), dh.data<T>(), dabr.data<Rounded<T>>(), SR, SF);
  EXPECT_EQ(values<T>(b.download<Rounded<T>>(dabr)), rounded_values<T>(get<T>(b, dab))) << "swiglu backward [da | db]";
  Buffer held_dh = b.allocate(dtype_of<Rounded<T>>(), n);
  o.round_values(dh.data<T>(), held_dh.data<Rounded<T>>(), n);
  EXPECT_EQ(values<T>(b.download<Rounded<T>>(held_dh)), rounded_values<T>(DH)) << "round values";
  const auto X = randn(20 * D, "gx");
  const std::vector<int32_t> index = {3, -1, 0, 19, 7, 7, 12, -1, 5};
  Buffer x = put<T>(b, X), ix = put_index(b, index), out = b.allocate(dtype_of<Rounded<T>>(), rows * D);
  o.gather_rows_rounded(x.data<T>(), ix.data<int32_t>(), out.data<Rounded<T>>(), rows, D);
  std::vector<double> ref(size_t(rows * D), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < D; ++d)
      if (index[size_t(r)] >= 0) ref[size_t(r * D + d)] = X[size_t(index[size_t(r)] * D + d)];
  EXPECT_EQ(values<T>(b.download<Rounded<T>>(out)), rounded_values<T>(ref)) << "gather rows";
  rounded_logit_gradient_cases<T>(b);
  rounded_norm_cases<T>(b);
  const int64_t G = int64_t(kExpertOffsets.size()) - 1, R = kExpertOffsets.back(), N = 24, K = 17;
  for (const bool tb : {false, true}) {
    Buffer ga = put<T>(b, randn(R * K, "gA")), gb = put<T>(b, randn(G * K * N, "gB"));
    Buffer c = b.allocate(dtype_of<T>(), R * N), cr = b.allocate(dtype_of<Rounded<T>>(), R * N);
    typename Ops<T>::GroupedGemm g{.trans_b = tb,
                                   .groups = G,
                                   .row_offset = kExpertOffsets.data(),
                                   .N = N,
                                   .K = K,
                                   .A = ga.data<T>(),
                                   .B = gb.data<T>(),
                                   .C = c.data<T>(),
                                   .precision = GemmPrecision::Bf16};
    o.grouped_gemm(g);
    g.C = nullptr, g.C_rounded = cr.data<Rounded<T>>();
    o.grouped_gemm(g);
    const std::vector<double> got = values<T>(b.download<Rounded<T>>(cr)), want = rounded_values<T>(get<T>(b, c));
    if (exact_gemm) {
      EXPECT_EQ(got, want) << "grouped gemm into C held rounded, trans_b " << tb;
    } else {
      for (size_t i = 0; i < got.size(); ++i) EXPECT_LE(std::abs(got[i] - want[i]), std::abs(want[i]) / 128) << i;
    }
  }
}

TEST_P(Conformance, RoundedProducersWriteTheRoundedValues) {
  const bool exact = GetParam().name != "cuda";
  rounded_producer_cases<float>(backend(), exact);
  rounded_producer_cases<double>(backend(), exact);
}

// The largest |a - b| / max |b|.
inline double max_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(a[i] - b[i])), ref = std::max(ref, std::abs(b[i]));
  return err / (ref + 1e-300);
}

// The experts' MLP keeping its tensors held rounded: the backend's own equals Ops' default (op after op, which a
// backend without its own runs) bit for bit, and both stay within bf16's rounding of the plain bf16 MLP (whose a and
// b are fp32): 2^-6 of the largest value, where rounding a and b each moves them by at most 2^-9.
template <typename T>
void expert_mlp_rounded_cases(Backend& b) {
  const int64_t G = int64_t(kExpertOffsets.size()) - 1, rows = kExpertOffsets.back(), D = 12, F = 20;
  const auto X = rounded_values<T>(randn(rows * D, "mx")), DY = randn(rows * D, "mdy"),
             W13 = randn(G * D * 2 * F, "w13", 0.3), W2 = randn(G * F * D, "w2", 0.3),
             DW13 = randn(G * D * 2 * F, "dw13"), DW2 = randn(G * F * D, "dw");
  enum Form { kPlain, kRounded, kDefault };
  auto run = [&](Form form) {
    constexpr DType t = dtype_of<T>();
    const DType kept = form == kPlain ? t : dtype_of<Rounded<T>>();
    Buffer x = put<T>(b, X), xr = b.upload(held<T>(X)), dy = put<T>(b, DY);
    Buffer w13 = put<T>(b, W13), w2 = put<T>(b, W2), dw13 = put<T>(b, DW13), dw2 = put<T>(b, DW2);
    Buffer ab = b.allocate(kept, rows * 2 * F), h = b.allocate(kept, rows * F), y = b.allocate(t, rows * D),
           dh = b.allocate(t, rows * F), dab = b.allocate(kept, rows * 2 * F), dx = b.allocate(t, rows * D),
           dy_held = b.allocate(kept, rows * D);
    const typename Ops<T>::ExpertMlp e{G,
                                       kExpertOffsets.data(),
                                       D,
                                       F,
                                       w13.data<T>(),
                                       w2.data<T>(),
                                       dw13.data<T>(),
                                       dw2.data<T>(),
                                       GemmPrecision::Bf16};
    Ops<T>& o = b.ops<T>();
    using R = Rounded<T>;
    if (form == kDefault) {
      o.Ops<T>::expert_mlp_forward_rounded(e, xr.data<R>(), ab.data<R>(), h.data<R>(), y.data<T>());
      o.Ops<T>::expert_mlp_backward_rounded(e, xr.data<R>(), ab.data<R>(), h.data<R>(), dy.data<T>(), dy_held.data<R>(),
                                            dh.data<T>(), dab.data<R>(), dx.data<T>());
    } else if (form == kRounded) {
      o.expert_mlp_forward_rounded(e, xr.data<R>(), ab.data<R>(), h.data<R>(), y.data<T>());
      o.expert_mlp_backward_rounded(e, xr.data<R>(), ab.data<R>(), h.data<R>(), dy.data<T>(), dy_held.data<R>(),
                                    dh.data<T>(), dab.data<R>(), dx.data<T>());
    } else {
      o.expert_mlp_forward(e, x.data<T>(), ab.data<T>(), h.data<T>(), y.data<T>());
      o.expert_mlp_backward(e, x.data<T>(), ab.data<T>(), h.data<T>(), dy.data<T>(), dh.data<T>(), dab.data<T>(),
                            dx.data<T>());
    }
    auto kept_values = [&](const Buffer& k) {
      return form == kPlain ? rounded_values<T>(get<T>(b, k)) : values<T>(b.download<R>(k));
    };
    return std::array<std::vector<double>, 6>{kept_values(ab), kept_values(h),  get<T>(b, y),
                                              get<T>(b, dx),   get<T>(b, dw13), get<T>(b, dw2)};
  };
  const auto plain = run(kPlain), rounded = run(kRounded), by_default = run(kDefault);
  const char* names[6] = {"[a | b]", "h", "y", "dx", "dw13", "dw2"};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(rounded[size_t(i)], by_default[size_t(i)]) << "expert mlp, the backend's and Ops' default, " << names[i];
    EXPECT_LE(max_relative(rounded[size_t(i)], plain[size_t(i)]), 1.0 / 64) << "expert mlp " << names[i];
  }
  EXPECT_EQ(rounded[0], plain[0]) << "[a | b]: x W13 rounded as stored is the plain [a | b] rounded";
}

TEST_P(Conformance, ExpertMlpKeepingItsTensorsRounded) {
  expert_mlp_rounded_cases<float>(backend());
  expert_mlp_rounded_cases<double>(backend());
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(backends()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace moe::conformance
