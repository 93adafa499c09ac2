// The op conformance suite, operands held rounded by their producers (train.precision = bf16): the rotation in the
// cast (rope_rounded) and attention reading q, k, v held rounded and writing or reading its output so, plain and
// fused, give the bits of the same ops on the stored values (rounded as the products read them); a held operand
// cuDNN cannot read in place (misaligned) is copied, with the same bits; held operands where they do not belong are
// refused. Every backend, fp32 and fp64 (whose held values are its own type, rounded).
#include <gtest/gtest.h>

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

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(backends()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace moe::conformance
