// Every component's sizes, declared once: the parameters, the activations a micro-batch slot keeps from
// forward to backward, the backward scratch and the workspaces of each layer and of the optimizer, as pure
// functions of the shapes. The layers size their allocations with them (MhaAttention::activation_size, ...),
// and the memory estimate (launch/config/memory.cpp) calls the same functions with the config's shapes, so the
// estimate cannot drift from what is allocated (llm.c's single sizing pass). A new layer type declares its
// sizes here and calls them from its activation_size and scratch_size.
// Counts are elements (of the model's type unless said) in doubles: exact below 2^53, so an allocation takes
// `elements(...)` of one, and the estimate of an absurd config saturates instead of overflowing.
#pragma once

#include <algorithm>
#include <cstdint>

namespace moe::sizes {

// What a layer declares for N tokens: activations kept per micro-batch slot, and the backward scratch shared
// by every layer and slot.
struct Footprint {
  double activations = 0, scratch = 0;
};

// An element count for an allocation (exact: an allocation is far below 2^53 elements).
inline int64_t elements(double count) { return int64_t(count); }

// ---- The model's own (core/model.cpp) ----

// Around a layer's attention and FFN, on the `rows` of the residual stream this rank holds: xa, h, xf
// (rows, D) and the two norms' inverse RMS (rows).
inline double block_activations(double rows, double D) { return 3 * rows * D + 2 * rows; }
// The output norm before the head: xo (rows, D) and its inverse RMS (rows).
inline double output_norm_activations(double rows, double D) { return rows * D + rows; }
// The residual stream of a slot: each of the stage's layers' input, then the last one's output (rows, D).
inline double residual_stream(double layers, double rows, double D) { return (layers + 1) * rows * D; }
// The model's scratch beside its layers': ffn_out, dres, dtmp, dnorm (rows, D).
inline double model_scratch(double rows, double D) { return 4 * rows * D; }
// An RMSNorm's gain (D), two per layer and the output norm.
inline double norm_parameters(double D) { return D; }

// ---- Embedding and heads (core/embedding.h, parallel/tp_layers.h) ----

// The embedding table (V, D), or this rank's rows (V / tp) of it.
inline double embedding_parameters(double V, double D) { return V * D; }
// The head (D, V), or this rank's columns (V / tp).
inline double head_parameters(double V, double D) { return D * V; }
// LmHead: the logits (N, V) kept, their gradient in scratch.
inline Footprint lm_head(double N, double V) { return {N * V, N * V}; }
// VocabParallelHead with Vl columns: the block's logits (N, Vl) and their log-sum-exp (N) kept; in scratch the
// block's logit gradients, the input's partial gradient (N, D) and, under sequence parallelism, the input
// gathered again (N, D).
inline Footprint vocab_parallel_head(double N, double Vl, double D, bool sequence_parallel) {
  return {N * Vl + N, N * Vl + N * D + (sequence_parallel ? N * D : 0.0)};
}

// ---- Attention (core/attention.h, core/mla_attention.h) ----

// MhaAttention's shard: Hl heads of width Dq / Hl on sequences of T; keep_probs: the probabilities kept for
// backward (not under selective recompute); fused: the backend's fused form runs the shape. Dkv: the width of
// the shard's key and value heads under grouped-query attention (0: as many as the query heads, Dq).
struct MhaShape {
  double D, Hl, Dq, T;
  bool keep_probs = true, fused = false;
  double Dkv = 0;
  double kv_width() const { return Dkv > 0 ? Dkv : Dq; }
  bool grouped() const { return kv_width() < Dq; }
};
// Wq (D, Dq), Wk, Wv (D, Dkv) and Wo (Dq, D).
inline double mha_parameters(const MhaShape& a) { return 2 * a.D * a.Dq + 2 * a.D * a.kv_width(); }
// Kept: q, k, v, the attention's output (N, Dq) (grouped: k and v expanded to every query head) and the
// probabilities (B, Hl, T, T) or, fused, each row's log-sum-exp (B, Hl, T). Scratch: dq, dk, dv, d(att) (N, Dq)
// and, plain, one (T, T) block and the recomputed probabilities when not kept; grouped, then the key and value
// heads' own gradients (N, Dkv) each (forward projects k and v into the start of the scratch, then expands them).
inline Footprint mha(const MhaShape& a, double N) {
  const double probs = N * a.Hl * a.T, kv_grads = a.grouped() ? 2 * N * a.kv_width() : 0.0;
  if (a.fused) return {4 * N * a.Dq + N * a.Hl, 4 * N * a.Dq + kv_grads};
  return {4 * N * a.Dq + (a.keep_probs ? probs : 0.0),
          4 * N * a.Dq + a.T * a.T + (a.keep_probs ? 0.0 : probs) + kv_grads};
}
// What the CUDA backend's fused attention backward takes from its allocator while it runs, in fp32 elements
// (core/backend/cuda/cuda_backend.cu, attention_graph.h): bf16 copies of q, k, v, O, dO and dq, dk, dv (8 of
// N Dq, half an element each), the statistics aligned and each row's dO . O (N Hl each), and the backward's
// own: dS (B, Hl, T, T) bf16 in the deterministic form, dQ accumulated in fp32 in the other.
inline double mha_fused_backward_workspace(const MhaShape& a, double N, bool deterministic) {
  const double n = N * a.Dq, rows = N * a.Hl;
  return 4 * n + 2 * rows + (deterministic ? rows * a.T / 2 : n);
}

// MlaAttention: H heads on sequences of T, latents C (key/value) and Cq (query), rotary width R; norms: the
// latents' RMSNorms.
struct MlaShape {
  double D, H, T, C, Cq, R;
  bool norms = false, keep_probs = true;
  double width() const { return D + H * R; }  // W: a head's query and key [content | rotary], all heads
};
// Wdq (D, Cq), Wuq (Cq, D), Wqr (Cq, H R), Wdkv (D, C), Wuk, Wuv (C, D), Wkr (D, R), Wo (D, D), and with norms
// their gains (Cq, C).
inline double mla_parameters(const MlaShape& a) {
  return a.D * a.Cq + a.Cq * (a.D + a.H * a.R) + a.D * a.C + 2 * a.C * a.D + a.D * a.R + a.D * a.D +
         (a.norms ? a.Cq + a.C : 0.0);
}
// Kept: c_q, c_kv, q, k, v, att (N, W), the probabilities when kept and, with norms, the latents before them
// and their inverse RMS (N) each. Scratch: dq, dk, dv, d(att) (N, W), one (T, T) block, dc_q, dc_kv, the
// rotary parts (N, H R) and (N, R), the recomputed probabilities when not kept and, with norms, the gradients of
// the latents before them.
inline Footprint mla(const MlaShape& a, double N) {
  const double W = a.width(), probs = N * a.H * a.T, latents = a.norms ? N * (a.Cq + a.C) : 0.0;
  return {N * (a.Cq + a.C + 4 * W) + (a.keep_probs ? probs : 0.0) + (a.norms ? latents + 2 * N : 0.0),
          4 * N * W + a.T * a.T + N * (a.Cq + a.C + a.H * a.R + a.R) + (a.keep_probs ? 0.0 : probs) + latents};
}
// What a key/value cache would keep per token and layer: c_kv and the shared rotary key (C + R); multi-head
// attention's k and v (2 Hkv Dh: 2 D without grouped-query attention).
inline double mla_kv_cache(const MlaShape& a) { return a.C + a.R; }
inline double mha_kv_cache(double kv_width) { return 2 * kv_width; }
// The (R, R) identity that places the rotary parts, held by the layer.
inline double mla_identity(const MlaShape& a) { return a.R * a.R; }

// ---- Dense FFN (core/ffn.h) ----

// DenseMlp with F hidden units (the shard's): W1, W3 (D, F) and W2 (F, D).
inline double mlp_parameters(double D, double F) { return 3 * D * F; }
// a, b, h (N, F) kept, as many in scratch.
inline Footprint dense_mlp(double N, double F) { return {3 * N * F, 3 * N * F}; }

// ---- Tensor-parallel wrappers (parallel/tp_layers.cpp) ----

// Before the shard's scratch: under sequence parallelism the gathered input, the gathered output gradient and
// the input's partial gradient (N, D) each; without, none (the rows are there).
inline double tp_wrapper_scratch(bool sequence_parallel, double N, double D) {
  return sequence_parallel ? 3 * N * D : 0.0;
}

// ---- MoE layer (core/moe_layer.cpp, core/moe/) ----

// One MoE layer on this rank: n of the routing group's G tokens, E experts, top-K, width D; the shared experts'
// and the dense fallback's hidden units here (0: none).
struct MoeShape {
  double D, E, K, G, n;
  double shared_hidden = 0, fallback_hidden = 0;
};
// Kept (MoeLayer::activation_size): the whole group's logits and scores (G, E), the expert outputs at the token
// side (n K, D), the shared experts' activations and output (n, D), the fallback's input, activations and output.
inline double moe_activations(const MoeShape& m) {
  double count = 2 * m.G * m.E + m.n * m.K * m.D;
  if (m.shared_hidden > 0) count += dense_mlp(m.n, m.shared_hidden).activations + m.n * m.D;
  if (m.fallback_hidden > 0) count += 2 * m.n * m.D + dense_mlp(m.n, m.fallback_hidden).activations;
  return count;
}
// The router (D, E), and the learned temperature's log-ratio (1) when learned.
inline double router_parameters(double D, double E, bool tau_learned) { return D * E + (tau_learned ? 1.0 : 0.0); }
// El experts of F hidden units here: W1, W3 (El, D, F) and W2 (El, F, D).
inline double expert_parameters(double El, double D, double F) { return 3 * El * D * F; }
// The rows of one forward sized by its routing: M assignments kept at the token side, R rows the local experts
// compute (hidden width F each), Mf tokens the dense fallback computes.
struct RoutedRows {
  double M, R, Mf;
};
// The experts' activations per slot (core/moe/experts.h ExpertActs): xe (R, D) and a, b, h (R, F).
inline double expert_activations(double R, double D, double F) { return R * D + 3 * R * F; }
// GroupedExperts' backward scratch: 3 R F.
inline double experts_scratch(double R, double F) { return 3 * R * F; }
// The MoE layer's backward workspace: dyp, dxp (M, D), dye, dxe (R, D), the experts' scratch, dp, dz (G, E),
// dw (G K), and the larger of the shared experts' and the fallback's (its rows at least one: its input's
// gradient and output gradient (rows, D) beside its scratch).
inline double moe_backward_scratch(const MoeShape& m, const RoutedRows& r, double F) {
  const double fallback_rows = std::max(r.Mf, 1.0);
  const double shared = m.shared_hidden > 0 ? dense_mlp(m.n, m.shared_hidden).scratch : 0.0;
  const double fallback =
      m.fallback_hidden > 0 ? dense_mlp(fallback_rows, m.fallback_hidden).scratch + 2 * fallback_rows * m.D : 0.0;
  return 2 * r.M * m.D + 2 * r.R * m.D + experts_scratch(r.R, F) + 2 * m.G * m.E + m.G * m.K +
         std::max(shared, fallback);
}

// ---- Optimizer (optim/adamw.cpp) ----

// One of AdamW's fp32 moments (m or v) of the `updated` parameter elements this rank updates, and both.
inline double adamw_moment(double updated) { return updated; }
inline double adamw_state(double updated) { return 2 * adamw_moment(updated); }

// ---- The CUDA backend's GEMM operands (core/backend/cuda/cuda_backend.cu) ----

// With bf16 GEMMs, a GEMM rounds its activation operands (rows, a) and (rows, b) into bf16 workspace: half an
// fp32 element each. Declared for the estimate: the backend takes it per call from the call's shapes, as it does
// the fused attention backward's (mha_fused_backward_workspace).
inline double bf16_operand_workspace(double rows, double a, double b) { return rows * (a + b) / 2; }

}  // namespace moe::sizes
