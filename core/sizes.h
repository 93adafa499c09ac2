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
#include <cmath>
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
// (rows, D) and the two norms' inverse RMS (rows); without xa where the attention keeps its own copy of its input
// (Attention::keeps_input).
inline double block_activations(double rows, double D, bool attention_keeps_input = false) {
  return (attention_keeps_input ? 2 : 3) * rows * D + 2 * rows;
}
// The output norm before the head: xo (rows, D) and its inverse RMS (rows).
// The output norm's xo (rows, D) and rstd_o (rows); a head keeping its input held rounded (OutputHead::keeps_input)
// has it in its own activations instead of xo.
inline double output_norm_activations(double rows, double D, bool head_keeps_input = false) {
  return (head_keeps_input ? 0.0 : rows * D) + rows;
}
// The residual stream of a slot: each of the stage's layers' input, then the last one's output (rows, D).
inline double residual_stream(double layers, double rows, double D) { return (layers + 1) * rows * D; }
// The model's scratch beside its layers': ffn_out, dres, dtmp (rows, D).
inline double model_scratch(double rows, double D) { return 3 * rows * D; }
// An RMSNorm's gain (D), two per layer and the output norm.
inline double norm_parameters(double D) { return D; }
// A slot's buffers beside its arena, of N tokens and the stage's rows: on the stage with the head the per-token
// losses (N, the model's type) and the target ids (N int32); on the stage with the embedding the input ids (N
// int32); on any other stage the gradient of its input (rows, D), which it sends back.
struct SlotIo {
  double losses = 0, targets = 0, inputs = 0, input_grad = 0;
};
inline SlotIo slot_io(double N, double rows, double D, bool embedding, bool head) {
  SlotIo io;
  if (head) io.losses = N, io.targets = N;
  if (embedding)
    io.inputs = N;
  else
    io.input_grad = rows * D;
  return io;
}

// The model's staging of a step's per-token losses on the stage with the head (core/loss_staging.h): `sections`
// forwards (the step's micro-batches of this rank) of up to N tokens each, read once.
inline double loss_staging(double sections, double N) { return sections * N; }

// ---- The pipeline executor (parallel/pipeline.cpp) ----

// Per micro-batch slot a chunk keeps in flight, each a message of the stage's rows of the residual stream (rows,
// D): the activation or gradient received from a neighbour, and the copies of the activation and of the gradient
// it sends, each kept until its send completes.
struct PipelineSlot {
  double received = 0, activation_out = 0, gradient_out = 0;
  double total() const { return received + activation_out + gradient_out; }
};
inline PipelineSlot pipeline_slot(double rows, double D) { return {rows * D, rows * D, rows * D}; }

// ---- Embedding and heads (core/embedding.h, parallel/tp_layers.h) ----

// The embedding table (V, D), or this rank's rows (V / tp) of it.
inline double embedding_parameters(double V, double D) { return V * D; }
// The head (D, V), or this rank's columns (V / tp).
inline double head_parameters(double V, double D) { return D * V; }
// A gradient of n values held rounded (held > 0: bf16 GEMMs, as MoeShape's) or as stored, in the model's elements.
inline double held_or_stored(double n, double held) { return held > 0 ? std::ceil(held * n) : n; }
// A head's input (N, D) kept held rounded under bf16 GEMMs (keeps: all N rows on the rank, no sequence parallelism),
// which its two GEMMs read: the output norm writes it there.
inline double head_held_input(double N, double D, double held, bool keeps) {
  return keeps && held > 0 ? held_or_stored(N * D, held) : 0.0;
}
// LmHead: the logits (N, V) kept, then the held input; their gradient in scratch (held rounded under bf16 GEMMs,
// their only readers).
inline Footprint lm_head(double N, double V, double held = 0, double D = 0) {
  return {N * V + head_held_input(N, D, held, true), held_or_stored(N * V, held)};
}
// VocabParallelHead with Vl columns: the block's logits (N, Vl) and their log-sum-exp (N) kept, then the held input
// (not under sequence parallelism); in scratch the block's logit gradients (held rounded as lm_head's), the input's
// partial gradient (N, D) and, under sequence parallelism, the input gathered again (N, D).
inline Footprint vocab_parallel_head(double N, double Vl, double D, bool sequence_parallel, double held = 0) {
  return {N * Vl + N + head_held_input(N, D, held, !sequence_parallel),
          held_or_stored(N * Vl, held) + N * D + (sequence_parallel ? N * D : 0.0)};
}

// ---- Attention (core/attention.h, core/mla_attention.h) ----

// MhaAttention's shard: Hl heads of width Dq / Hl on sequences of T; keep_probs: the probabilities kept for
// backward (not under selective recompute); fused: the backend's fused form runs the shape. Dkv: the width of
// the shard's key and value heads under grouped-query attention (0: as many as the query heads, Dq).
struct MhaShape {
  double D, Hl, Dq, T;
  bool keep_probs = true, fused = false;
  double Dkv = 0;
  // Under bf16 GEMMs the size of a value held rounded in elements of the model's type (0.5: bf16 beside fp32; 1:
  // fp64's rounded values), 0 otherwise; keep_input: the input kept held rounded for the backward.
  double held = 0;
  bool keep_input = false;
  double kv_width() const { return Dkv > 0 ? Dkv : Dq; }
  bool grouped() const { return kv_width() < Dq; }
};
// Held (bf16 GEMMs): the input rounded once, (N, D) held, kept when keep_input; the backward's scratch holds dy or
// the input not kept (N, D) and dq, dk, dv (N, Dq + 2 Dkv) rounded once each, the forward's the input not kept.
inline double mha_held_input(const MhaShape& a, double N) { return a.keep_input ? a.held * N * a.D : 0.0; }
inline double mha_held_scratch(const MhaShape& a, double N) { return a.held * N * (a.D + a.Dq + 2 * a.kv_width()); }
// Wq (D, Dq), Wk, Wv (D, Dkv) and Wo (Dq, D).
inline double mha_parameters(const MhaShape& a) { return 2 * a.D * a.Dq + 2 * a.D * a.kv_width(); }
// Under bf16 GEMMs the room before MhaAttention's held q, k, v and output in which they start at a 256-byte boundary.
inline constexpr double kMhaHeldPad = 64;
// Kept: q, k, v, the attention's output (N, Dq) (grouped: k and v expanded to every query head), held rounded under
// bf16 GEMMs (after the pad), and the probabilities (B, Hl, T, T) or, fused, each row's log-sum-exp (B, Hl, T), then
// the held input. Scratch: dq, dk, dv, d(att) (N, Dq) and, plain, one (T, T) block and the recomputed probabilities
// when not kept; grouped, then the key and value heads' own gradients (N, Dkv) each (forward projects k and v into
// the start of the scratch, then expands them; held, it projects q, k, v there first); then the held scratch.
inline Footprint mha(const MhaShape& a, double N) {
  const double probs = N * a.Hl * a.T, kv_grads = a.grouped() ? 2 * N * a.kv_width() : 0.0;
  const double input = mha_held_input(a, N), held = mha_held_scratch(a, N);
  const double kept = a.held > 0 ? a.held * 4 * N * a.Dq + kMhaHeldPad : 4 * N * a.Dq;
  if (a.fused) return {kept + N * a.Hl + input, 4 * N * a.Dq + kv_grads + held};
  return {kept + (a.keep_probs ? probs : 0.0) + input,
          4 * N * a.Dq + a.T * a.T + (a.keep_probs ? 0.0 : probs) + kv_grads + held};
}

// MlaAttention: H heads on sequences of T, latents C (key/value) and Cq (query; 0: the queries projected from x
// directly, DeepSeek-V2-Lite's q_lora_rank null), rotary width R; norms: the latents' RMSNorms.
struct MlaShape {
  double D, H, T, C, Cq, R;
  bool norms = false, keep_probs = true;
  double held = 0;  // as MhaShape's: q, k, v and the attention's output kept held rounded under bf16 GEMMs
  double width() const { return D + H * R; }          // W: a head's query and key [content | rotary], all heads
  double q_input() const { return Cq > 0 ? Cq : D; }  // what the queries are projected from: c_q, or x
};
// MlaAttention's q, k, v and output (N, W) each, held rounded under bf16 GEMMs.
inline double mla_kept(const MlaShape& a, double N) { return (a.held > 0 ? a.held : 1.0) * 4 * N * a.width(); }
// Wdq (D, Cq), Wuq (Q, D), Wqr (Q, H R) with Q = q_input(), Wdkv (D, C), Wuk, Wuv (C, D), Wkr (D, R), Wo (D, D),
// and with norms their gains (Cq, C).
inline double mla_parameters(const MlaShape& a) {
  const double Q = a.q_input();
  return a.D * a.Cq + Q * (a.D + a.H * a.R) + a.D * a.C + 2 * a.C * a.D + a.D * a.R + a.D * a.D +
         (a.norms ? a.Cq + a.C : 0.0);
}
// Kept: c_q, c_kv, q, k, v, att (N, W) (held rounded under bf16 GEMMs, forward building q, k, v in fp32 in the
// scratch's first 3 (N, W)), the probabilities when kept and, with norms, the latents before them
// and their inverse RMS (N) each. Scratch: dq, dk, dv, d(att) (N, W), one (T, T) block, dc_q (N, Q), dc_kv, the
// rotary parts (N, H R) and (N, R), the recomputed probabilities when not kept and, with norms, the gradients of
// the latents before them.
inline Footprint mla(const MlaShape& a, double N) {
  const double W = a.width(), probs = N * a.H * a.T, latents = a.norms ? N * (a.Cq + a.C) : 0.0;
  return {N * (a.Cq + a.C) + mla_kept(a, N) + (a.keep_probs ? probs : 0.0) + (a.norms ? latents + 2 * N : 0.0),
          4 * N * W + a.T * a.T + N * (a.q_input() + a.C + a.H * a.R + a.R) + (a.keep_probs ? 0.0 : probs) + latents};
}
// What a key/value cache would keep per token and layer: c_kv and the shared rotary key (C + R); multi-head
// attention's k and v (2 Hkv Dh: 2 D without grouped-query attention).
inline double mla_kv_cache(const MlaShape& a) { return a.C + a.R; }
inline double mha_kv_cache(double kv_width) { return 2 * kv_width; }
// The (R, R) identity that places the rotary parts, held by the layer.
inline double mla_identity(const MlaShape& a) { return a.R * a.R; }

// ---- Dense FFN (core/ffn.h) ----

// DenseMlp with F hidden units (the shard's): W13 (D, 2, F: W1 and W3 side by side) and W2 (F, D).
inline double mlp_parameters(double D, double F) { return 3 * D * F; }
// The experts' activations per slot (core/moe/experts.h ExpertActs): xe (R, D), ab (R, 2F) and h (R, F), all held
// rounded under bf16 GEMMs (held: as moe_exchange_rows's).
inline double expert_activations(double R, double D, double F, double held = 1) { return held * (R * D + 3 * R * F); }
// GroupedExperts' backward scratch: dh (R, F) and dab (R, 2F); with its tensors held rounded (held > 0, as MoeShape's)
// dh (R, F), and dab (R, 2F) and dy (R, D) held.
inline double experts_scratch(double R, double F, double D = 0, double held = 0) {
  return held > 0 ? R * F + held * (2 * R * F + R * D) : 3 * R * F;
}
// DenseMlp: ab (N, 2F) and h (N, F) kept, as many in scratch; held > 0 (bf16 GEMMs, as MoeShape's): computed as one
// group of the experts, their activations (x too) and scratch.
inline Footprint dense_mlp(double N, double F, double D = 0, double held = 0) {
  return {held > 0 ? expert_activations(N, D, F, held) : 3 * N * F, experts_scratch(N, F, D, held)};
}

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
  bool reroutes = false;  // overflow rerouted (moe.overflow reroute, alone or in the cascade)
  // The routed experts' tensors held rounded (bf16 GEMMs): the size of a held value in elements of the model's type
  // (0.5: bf16 beside fp32; 1: fp64's rounded values); 0: not held rounded.
  double held = 0;
};
// Kept (MoeLayer::activation_size): the whole group's logits and scores (G, E), the expert outputs at the token
// side (n K, D), the shared experts' activations and output (n, D), the fallback's input, activations and output.
inline double moe_activations(const MoeShape& m) {
  double count = 2 * m.G * m.E + m.n * m.K * m.D;
  if (m.shared_hidden > 0) count += dense_mlp(m.n, m.shared_hidden, m.D, m.held).activations + m.n * m.D;
  if (m.fallback_hidden > 0) count += 2 * m.n * m.D + dense_mlp(m.n, m.fallback_hidden, m.D, m.held).activations;
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
// The MoE layer's gathered token rows (M, D) and its experts' outputs (R, D), kept across forwards; none over one
// expert-parallel rank, where the gather writes the experts' input and the experts write the permuted output in
// place (core/moe_layer.cpp aliased_sides).
// held: the size of a row value held rounded (Rounded, under bf16 GEMMs) in elements of the model's type (0.5: bf16
// beside fp32; 1: not rounded), for the gathered rows, which travel rounded.
inline double moe_exchange_rows(double M, double R, double D, bool one_rank, double held = 1) {
  return one_rank ? 0.0 : held * M * D + R * D;
}
// The dispatch plan's buffers on the backend per slot (core/moe_layer.cpp MoeSlot, planned by MoeLayer::plan), for
// the n tokens' n K slots: the permuted buffers sized for every slot (n K: each permuted row's token, gate weight
// and slot, each slot's permuted row and gate weight) and, with a fallback, every token (n: the fallback's tokens
// and their weights) and slot (n K: for each overflowed assignment it computes, its row among those tokens and its
// slot), the expert of each slot of the whole routing group (G K), the expert offsets (E + 1, int64) and, where
// overflow is rerouted or computed densely, the plan's counts (3 int64: the group's rerouted slots, this rank's
// fallback tokens and slots).
struct MoePlanBuffers {
  double perm_token = 0, perm_gate = 0, perm_slot_rows = 0, slot_row = 0, gate = 0;
  double fallback_tokens = 0, fallback_weights = 0, fallback_sources = 0, fallback_slots = 0;
  double assigned = 0, expert_offset = 0, plan_counts = 0;
  // Elements of the model's type, of int32 and of int64.
  double values() const { return perm_gate + gate + fallback_weights; }
  double int32s() const {
    return perm_token + perm_slot_rows + slot_row + fallback_tokens + fallback_sources + fallback_slots + assigned;
  }
  double int64s() const { return expert_offset + plan_counts; }
};
inline MoePlanBuffers moe_plan_buffers(const MoeShape& m) {
  const double slots = m.n * m.K;
  const bool fallback = m.fallback_hidden > 0;
  MoePlanBuffers b;
  b.perm_token = b.perm_gate = b.perm_slot_rows = b.slot_row = b.gate = slots;
  b.assigned = m.G * m.K;
  b.expert_offset = m.E + 1;
  b.plan_counts = m.reroutes || fallback ? 3 : 0;
  if (fallback) b.fallback_tokens = b.fallback_weights = m.n, b.fallback_sources = b.fallback_slots = slots;
  return b;
}
// A routing group split over ranks (G > n): the whole group's permutation, the layer's
// workspace until this rank's part is taken (core/moe_layer.cpp permute_split_group): row -> slot and slot -> row
// (G K, int32) and the expert offsets (E + 1, int64); none otherwise.
struct GroupPermutation {
  double perm_slot = 0, row_of_slot = 0, offset = 0;
  double int32s() const { return perm_slot + row_of_slot; }
  double int64s() const { return offset; }
};
inline GroupPermutation moe_group_permutation(const MoeShape& m) {
  if (m.G <= m.n) return {};
  return {m.G * m.K, m.G * m.K, m.E + 1};
}
// The router's buffers on the backend (core/moe/router.cpp), for G tokens of the routing group and W preference
// choices (E when overflow reroutes, else K). Held by the layer: the Gumbel noise (G, E) while training with it,
// each token's plain top-K and preference row (int32), the selected scores (G K), the balancing bias (E fp32)
// and expert mask (E bytes), the losses' sums (E + 2) and, with a learned temperature, its gradient (1), both
// double. Held by each slot's routing: the selected experts (G K int32), their gate weights (G K), each row's
// denominator (G) and clamp flag (G bytes), and f (E).
struct RouterBuffers {
  double noise = 0, loss_sums = 0, d_log_tau = 0;                // double
  double plain_top = 0, preference = 0;                          // int32
  double selected_score = 0, bias = 0, mask = 0;                 // the model's type, fp32, bytes
  double selected = 0, gate = 0, denom = 0, clamped = 0, f = 0;  // per slot: int32, the model's type x 3, bytes
  double layer_doubles() const { return noise + loss_sums + d_log_tau; }
  double layer_int32s() const { return plain_top + preference; }
  double slot_values() const { return gate + denom + f; }
};
inline RouterBuffers router_buffers(double G, double E, double K, double W, bool gumbel, bool tau_learned) {
  RouterBuffers b;
  b.noise = gumbel ? G * E : 0.0, b.loss_sums = E + 2, b.d_log_tau = tau_learned ? 1.0 : 0.0;
  b.plain_top = G * K, b.preference = G * W;
  b.selected_score = G * K, b.bias = E, b.mask = E;
  b.selected = G * K, b.gate = G * K, b.denom = G, b.clamped = G, b.f = E;
  return b;
}
// The dispatcher's staging on the backend per MoE layer when it exchanges rows (core/moe/alltoall_dispatcher.cpp,
// allgather_dispatcher.cpp; the layer copies them instead over one expert-parallel rank): the all-to-all's received
// rows (received, D); the all-gather's block of this rank's rows padded to the group's largest count (block, D)
// and every rank's block (ep block, D).
struct DispatcherStaging {
  double own = 0, staging = 0;
  double total() const { return own + staging; }
};
inline DispatcherStaging alltoall_staging(double received, double D) { return {0, received * D}; }
inline DispatcherStaging allgather_staging(double ep, double block_rows, double D) {
  return {block_rows * D, ep * block_rows * D};
}
// The MoE layer's backward workspace: dyp, dxp (M, D), dye, dxe (R, D), the experts' scratch, dp, dz (G, E),
// dw (G K), and the larger of the shared experts' and the fallback's (its rows at least one: its input's
// gradient and output gradient (rows, D) beside its scratch).
inline double moe_backward_scratch(const MoeShape& m, const RoutedRows& r, double F) {
  const double fallback_rows = std::max(r.Mf, 1.0);
  const double shared = m.shared_hidden > 0 ? dense_mlp(m.n, m.shared_hidden, m.D, m.held).scratch : 0.0;
  const double fallback =
      m.fallback_hidden > 0 ? dense_mlp(fallback_rows, m.fallback_hidden, m.D, m.held).scratch + 2 * fallback_rows * m.D
                            : 0.0;
  return 2 * r.M * m.D + 2 * r.R * m.D + experts_scratch(r.R, F, m.D, m.held) + 2 * m.G * m.E + m.G * m.K +
         std::max(shared, fallback);
}

// ---- Optimizer (optim/adamw.cpp) ----

// One of AdamW's fp32 moments (m or v) of the `updated` parameter elements this rank updates, and both.
inline double adamw_moment(double updated) { return updated; }
inline double adamw_state(double updated) { return 2 * adamw_moment(updated); }

// ---- The CUDA backend's own device memory (core/backend/cuda) ----
// In bytes, as the backend asks its caching allocator for them; storage: the bytes of the model's type.

// cuBLAS's workspace, handed to it from the backend's allocator when the backend starts (cublasSetWorkspace):
// the 32 MiB NVIDIA recommends for Hopper, more than the 4 MiB earlier GPUs take by default.
inline double cublas_workspace_bytes() { return 32.0 * 1024 * 1024; }
// n values of a GEMM operand rounded for bf16 GEMMs (gemm_ops.cu): bf16 beside fp32 storage; beside fp64 storage
// the rounded values in fp64. An activation operand is rounded into workspace for the call; the parameters once
// into a copy the backend keeps while they do not change (n: the whole parameter table).
inline double rounded_operand_bytes(double n, double storage) { return n * (storage == 4 ? 2.0 : storage); }
// The grouped GEMM's device array of operand pointers (gemm_ops.cu): each non-empty group's first and second
// operand and output.
inline double grouped_gemm_pointer_bytes(double problems) { return 3 * problems * double(sizeof(void*)); }
// The rotary table the backend keeps for the last shape it rotated (attention_ops.cu): cos and sin of each of
// T positions and Dh / 2 pairs.
inline double rope_table_bytes(double T, double Dh, double storage) { return 2 * T * std::floor(Dh / 2) * storage; }

// Fused attention (attention_ops.cu, cudnn_attention.cu) over B sequences of T, H heads of width Dh: the bf16
// copies in one workspace of sections at 256-byte boundaries (MhaAttention's q, k, v and O are read and written where
// it holds them, so its backward's sections are dO, dq, dk, dv; an operand given in fp32 or not 16-byte aligned takes
// one more each), the statistics (B H T fp32) in aligned workspace, the graph's workspace tensors each padded to 256
// bytes (attention_graph.cpp; the backward's dO . O per row in fp32 and, nondeterministic, dQ accumulated in fp32), and
// cuDNN's own workspace, which its execution plan states at run time: the estimate takes dS (B H T T bf16) for
// the deterministic backward, none otherwise.
inline double bf16_sections_bytes(double sections, double n) { return sections * std::ceil(n / 128) * 128 * 2; }
inline double attention_stats_bytes(double B, double T, double H) { return B * H * T * 4; }
inline double attention_row_sum_bytes(double B, double T, double H) { return B * H * T * 4; }
inline double attention_dq_accum_bytes(double B, double T, double H, double Dh) { return B * H * T * Dh * 4; }
inline double attention_graph_tensor_bytes(double bytes) { return std::ceil(bytes / 256) * 256; }
struct FusedAttentionShape {
  double B, T, H, Dh;
  bool deterministic;
};
// The backward graph's workspace tensors (AttentionGraph::workspace_bytes), and cuDNN's own as estimated.
inline double attention_backward_graph_bytes(const FusedAttentionShape& a) {
  const double row_sum = attention_graph_tensor_bytes(attention_row_sum_bytes(a.B, a.T, a.H));
  return row_sum +
         (a.deterministic ? 0.0 : attention_graph_tensor_bytes(attention_dq_accum_bytes(a.B, a.T, a.H, a.Dh)));
}
inline double cudnn_backward_bytes(const FusedAttentionShape& a) {
  return a.deterministic ? a.B * a.H * a.T * a.T * 2 : 0.0;
}
inline double fused_attention_backward_bytes(const FusedAttentionShape& a) {
  return bf16_sections_bytes(4, a.B * a.T * a.H * a.Dh) + attention_stats_bytes(a.B, a.T, a.H) +
         attention_backward_graph_bytes(a) + cudnn_backward_bytes(a);
}
// The plain attention writing its output held rounded (attention_ops.cu): the product P V in the storage type for N
// tokens of width Dq, then rounded once.
inline double attention_held_output_bytes(double N, double Dq, double type_size) { return N * Dq * type_size; }
// The fused attention of an MhaAttention shard on N tokens.
inline FusedAttentionShape fused_attention_shape(const MhaShape& a, double N, bool deterministic) {
  return {N / a.T, a.T, a.Hl, a.Dq / a.Hl, deterministic};
}

}  // namespace moe::sizes
