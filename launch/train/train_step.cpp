// One optimizer step of one rank.
#include "launch/train/train_step.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>

#include "core/error.h"
#include "parallel/tp_layers.h"

namespace moe {
namespace {

constexpr int64_t kDeadAfterSteps = 100;

// Step statistics every rank contributes to: the LM loss sum, then per MoE layer of the whole model the router
// losses and entropy (doubles) and the counts (integers), each stage filling its own layers' entries (zeros
// elsewhere). Summed over the data-parallel group, then over the pipeline stages.
struct StepTotals {
  std::vector<double> real;
  std::vector<int64_t> counts;
};
constexpr size_t kReal = 8, kCounts = 5;  // per MoE layer, besides its tokens per expert

StepTotals gather_totals(double loss_sum, const Trainer& t) {
  const size_t layers = size_t(t.model_moe_layers), E = size_t(t.config.moe.num_experts);
  StepTotals totals;
  totals.real.assign(1 + kReal * layers, 0.0);
  totals.counts.assign((kCounts + E) * layers, 0);
  totals.real[0] = loss_sum;
  for (size_t i = 0; i < t.moe_layers.size(); ++i) {
    const RouterStepStats& st = *t.moe_layers[i]->router_stats();
    MOE_CHECK(st.tokens_per_expert.size() == E, "tokens_per_expert has " << st.tokens_per_expert.size() << " entries");
    const size_t g = size_t(t.moe_index[i]);
    std::copy_n(std::begin({st.aux, st.z, st.entropy_loss, st.death, st.entropy_sum, st.warmup, st.tau_sum,
                            st.capacity_factor_sum}),
                kReal, totals.real.begin() + std::ptrdiff_t(1 + kReal * g));
    auto c = totals.counts.begin() + std::ptrdiff_t((kCounts + E) * g);
    c = std::copy_n(std::begin({st.dropped, st.rerouted, st.fallback, st.tokens, st.groups}), kCounts, c);
    std::copy(st.tokens_per_expert.begin(), st.tokens_per_expert.end(), c);
  }
  return totals;
}

// The summed totals into every MoE layer's statistics of the whole model, and this stage's layers'.
void scatter_totals(const StepTotals& totals, Trainer& t) {
  const size_t E = size_t(t.config.moe.num_experts);
  t.model_stats.assign(size_t(t.model_moe_layers), RouterStepStats{});
  size_t r = 1, c = 0;
  for (RouterStepStats& st : t.model_stats) {
    st.aux = totals.real[r++], st.z = totals.real[r++], st.entropy_loss = totals.real[r++];
    st.death = totals.real[r++], st.entropy_sum = totals.real[r++], st.warmup = totals.real[r++];
    st.tau_sum = totals.real[r++], st.capacity_factor_sum = totals.real[r++];
    st.dropped = totals.counts[c++], st.rerouted = totals.counts[c++], st.fallback = totals.counts[c++];
    st.tokens = totals.counts[c++], st.groups = totals.counts[c++];
    st.tokens_per_expert.assign(totals.counts.begin() + std::ptrdiff_t(c),
                                totals.counts.begin() + std::ptrdiff_t(c + E));
    c += E;
  }
  for (size_t i = 0; i < t.moe_layers.size(); ++i)
    *t.moe_layers[i]->router_stats() = t.model_stats[size_t(t.moe_index[i])];
}

// Tensors every tp rank holds whole but uses on its own tokens (norms under sequence parallelism, the
// router and shared experts of a split routing group) have partial gradients: summed over the tp group.
// After the data-parallel reduction, so under ZeRO this rank's slices are complete sums too.
void sum_partial_gradients_over_tp(Trainer& t) {
  if (t.groups.tp->size() == 1) return;
  const auto span = t.tracer.span("tensor-parallel gradient reduction", "communication");
  reduce_partial_over_tp(t.model->table(), t.model->grads(), *t.groups.data.tp);
}

// The owned segments' parts that lie in tensors split over the tensor-parallel group by either split
// (disjoint blocks, whose squares sum over the group) and in the others (the same on every tp rank, counted once).
std::pair<std::vector<Segment>, std::vector<Segment>> split_by_tp(const ParamTable& table,
                                                                  const std::vector<Segment>& owned) {
  std::pair<std::vector<Segment>, std::vector<Segment>> out;
  for (const Segment& seg : owned)
    for (const ParamSpec& spec : table.specs()) {
      const int64_t lo = std::max(seg.offset, spec.offset),
                    hi = std::min(seg.offset + seg.length, spec.offset + spec.numel);
      if (lo >= hi) continue;
      (spec.split_over(ParamGroup::TensorParallel) ? out.first : out.second).push_back({lo, hi - lo});
    }
  return out;
}

// Micro-batch mb of this rank's share of the step: its (micro_batch, seq_len + 1) tokens from the loader, and
// the model's context for its forward (router losses are averaged over the step's routing groups, the
// micro-batches, on all ranks).
void load_micro_batch(Trainer& t, int64_t step, int64_t mb, int32_t* tokens) {
  const int64_t T = t.config.train.seq_len, micro = t.config.train.micro_batch;
  const int64_t seq0 = t.first_sequence() + mb * micro;
  for (int64_t b = 0; b < micro; ++b) t.loader->train_sequence(step, seq0 + b, tokens + b * (T + 1));
}
void set_micro_batch_context(Trainer& t, Model<float>& chunk, int64_t step, int64_t mb) {
  const TrainConfig& tc = t.config.train;
  const int64_t groups_per_step = tc.global_batch / tc.micro_batch;
  chunk.set_context(true, step, t.first_sequence() + mb * tc.micro_batch, 1.0 / double(groups_per_step), tc.seed);
}

// How a pipeline action shows in the trace: its name and category.
std::pair<const char*, const char*> trace_label(PipeOp op) {
  switch (op) {
    case PipeOp::RecvActivation:
      return {"receive activation (wait)", "communication"};
    case PipeOp::Forward:
      return {"forward", "compute"};
    case PipeOp::SendActivation:
      return {"send activation", "communication"};
    case PipeOp::RecvGradient:
      return {"receive gradient (wait)", "communication"};
    case PipeOp::Backward:
      return {"backward", "compute"};
    case PipeOp::SendGradient:
      return {"send gradient", "communication"};
  }
  return {"?", "?"};
}

// The step's micro-batches through this rank's pipeline stage by the (interleaved) 1F1B schedule (parallel.pp >
// 1); returns the sum of their token losses on the last stage, 0 on the others. Every action is a span of the
// trace; a chunk's gradients are final during its last backward (the schedules run each chunk's backwards in
// micro-batch order), so the gradient buckets reduce as they complete there, overlapped with it.
double pipeline_forward_backward(Trainer& t, int64_t step, double loss_scale) {
  PipelineExecutor<float>::MicroBatches mbs;
  mbs.tokens = [&](int64_t mb, int32_t* tokens) { load_micro_batch(t, step, mb, tokens); };
  mbs.before_chunk_forward = [&](int64_t mb, int64_t chunk) {
    set_micro_batch_context(t, *t.chunks[size_t(chunk)], step, mb);
  };
  std::optional<Tracer::Span> span;
  const int64_t last = t.micro_batches() - 1;
  mbs.around = [&](const PipeAction& a, bool begin) {
    if (a.op == PipeOp::Backward && a.micro_batch == last)
      t.chunks[size_t(a.chunk)]->set_grad_ready_hook(
          begin ? Model<float>::GradReadyHook([&](int64_t first, int64_t end) { t.buckets->mark_ready(first, end); })
                : nullptr);
    const auto [name, category] = trace_label(a.op);
    if (begin)
      span.emplace(t.tracer.span(name, category, a.micro_batch));
    else
      span.reset();
  };
  t.buckets->start(t.model->grads());
  const double loss_sum = t.pipeline->run(mbs, loss_scale);
  {
    const auto span = t.tracer.span("gradient reduction wait", "communication");
    t.buckets->finish();
  }
  sum_partial_gradients_over_tp(t);
  return loss_sum;
}

// Forward and backward of this rank's micro-batches; returns the sum of their token losses.
double forward_backward(Trainer& t, int64_t step, double loss_scale) {
  const TrainConfig& tc = t.config.train;
  const int64_t micro_batches = t.micro_batches();
  std::vector<int32_t> tokens(size_t(tc.micro_batch * (tc.seq_len + 1)));
  Model<float>& model = *t.model;
  model.zero_grads();
  for (MoeLayer<float>* m : t.moe_layers) m->reset_stats();
  if (t.pipeline) return pipeline_forward_backward(t, step, loss_scale);
  t.buckets->start(model.grads());
  model.stage_losses();  // each micro-batch's losses stay on the backend until the step's end
  for (int64_t mb = 0; mb < micro_batches; ++mb) {
    load_micro_batch(t, step, mb, tokens.data());
    set_micro_batch_context(t, model, step, mb);
    // Gradients are final during the last micro-batch's backward: reduce buckets as they complete.
    if (mb == micro_batches - 1)
      model.set_grad_ready_hook([&](int64_t first, int64_t end) { t.buckets->mark_ready(first, end); });
    {
      const auto span = t.tracer.span("forward", "compute", mb);
      model.forward(tokens.data(), tc.micro_batch);
    }
    {
      const auto span = t.tracer.span("backward", "compute", mb);
      model.backward(loss_scale);
    }
    model.set_grad_ready_hook(nullptr);
  }
  {
    const auto span = t.tracer.span("gradient reduction wait", "communication");
    t.buckets->finish();
  }
  sum_partial_gradients_over_tp(t);
  // One read for the step: each micro-batch's sum, added in micro-batch order as forward's were.
  double loss_sum = 0;
  for (const double sum : model.staged_losses()) loss_sum += sum;
  return loss_sum;
}

// The step's losses, summed over the data-parallel group (routing statistics too, in the layers).
void reduce_losses(Trainer& t, double loss_sum, double loss_scale, StepResult& r) {
  StepTotals totals = gather_totals(loss_sum, t);
  t.groups.dp->allreduce_sum(totals.real.data(), int64_t(totals.real.size()));
  t.groups.dp->allreduce_sum(totals.counts.data(), int64_t(totals.counts.size()));
  if (t.pipeline) {  // the LM loss from the last stage, each layer's statistics from its stage
    t.groups.pp->allreduce_sum(totals.real.data(), int64_t(totals.real.size()));
    t.groups.pp->allreduce_sum(totals.counts.data(), int64_t(totals.counts.size()));
  }
  scatter_totals(totals, t);
  r.lm_loss = totals.real[0] * loss_scale;
  for (const RouterStepStats& st : t.model_stats) {
    r.aux += st.aux / double(st.groups), r.z += st.z / double(st.groups);
    r.entropy += st.entropy_loss / double(st.groups), r.death += st.death / double(st.groups);
    r.warmup += st.warmup / double(st.groups);
  }
  r.loss = r.lm_loss + r.aux + r.z + r.entropy + r.death + r.warmup;
}

// Frequency-aware clipping (docs/moe.md): each of this rank's experts' threshold multiplier from the step's
// loads, the whole layer's (summed over the data-parallel group), so every rank holding the expert agrees.
// Empty when both multipliers are 1.
std::vector<double> clip_threshold_scales(const Trainer& t) {
  const OptimConfig& o = t.config.optim;
  if (o.per_expert_clip_hot == 1.0 && o.per_expert_clip_cold == 1.0) return {};
  std::vector<double> scales;
  for (const PerExpertClip::Expert& x : t.clip->experts()) {
    const RouterStepStats* st = nullptr;
    for (MoeLayer<float>* m : t.moe_layers)
      if (m->param_prefix() + ".experts" == x.group) st = m->router_stats();
    MOE_CHECK(st, "no MoE layer holds the experts " << x.group);
    double mean = 0;
    for (int64_t c : st->tokens_per_expert) mean += double(c);
    mean /= double(st->tokens_per_expert.size());
    const bool hot = double(st->tokens_per_expert[size_t(x.global_index)]) > o.per_expert_clip_hot_load * mean;
    scales.push_back(hot ? o.per_expert_clip_hot : o.per_expert_clip_cold);
  }
  return scales;
}

// Per-expert clipping, then the global norm (returned, before clipping) and its clip.
void clip_gradients(Trainer& t, StepResult& r) {
  const Config& config = t.config;
  float* grads = t.model->grads();
  // An expert's gradient lives on one expert-parallel rank, sliced over the expert-data-parallel group
  // under ZeRO.
  if (config.optim.per_expert_clip > 0) {
    const std::vector<Segment>* mine = config.optim.zero ? &t.buckets->owned_expert() : nullptr;
    std::vector<double> ss = t.clip->sum_squares(grads, mine);
    if (config.optim.zero) t.groups.edp->allreduce_sum(ss.data(), int64_t(ss.size()));
    t.groups.etp->allreduce_sum(ss.data(), int64_t(ss.size()));  // blocks of each expert's hidden width
    const std::vector<double> scales = clip_threshold_scales(t);
    r.experts_clipped = t.clip->clip(grads, ss, mine, scales.empty() ? nullptr : &scales);
    t.groups.ep->allreduce_sum(&r.experts_clipped, 1);
    if (t.pipeline) t.groups.pp->allreduce_sum(&r.experts_clipped, 1);
  }
  // Dense gradients are replicated over dp (or sliced under ZeRO), expert gradients are spread over ep and
  // their hidden width over etp (and sliced over edp under ZeRO).
  // Dense tensors split over tp hold disjoint blocks on the tp ranks: their squares sum over tp too.
  const auto [tp_split, tp_whole] = split_by_tp(t.model->table(), t.buckets->owned_dense());
  const std::vector<double> ss =
      sum_squares(t.model->backend(), grads, {&tp_split, &tp_whole, &t.buckets->owned_expert()});
  double dense_ss[2] = {ss[0], ss[1]};
  double expert_ss = ss[2];
  if (config.optim.zero) {
    t.groups.dp->allreduce_sum(dense_ss, 2);
    t.groups.edp->allreduce_sum(&expert_ss, 1);
  }
  t.groups.tp->allreduce_sum(dense_ss, 1);
  t.groups.ep->allreduce_sum(&expert_ss, 1);
  t.groups.etp->allreduce_sum(&expert_ss, 1);
  if (t.pipeline) {  // the stages hold disjoint parameters
    double ss[3] = {dense_ss[0], dense_ss[1], expert_ss};
    t.groups.pp->allreduce_sum(ss, 3);
    dense_ss[0] = ss[0], dense_ss[1] = ss[1], expert_ss = ss[2];
  }
  r.grad_norm = std::sqrt(dense_ss[0] + dense_ss[1] + expert_ss);
  if (config.optim.clip > 0 && r.grad_norm > config.optim.clip)
    scale_segments(t.model->backend(), grads, t.owned, float(config.optim.clip / r.grad_norm));
}

// The step's overflowed assignments (rerouted, sent to the fallback or dropped) over its routed ones.
double overflow_ratio(const RouterStepStats& st, int64_t top_k) {
  const double routed = double(st.tokens) * double(top_k);
  return routed > 0 ? double(st.dropped + st.rerouted + st.fallback) / routed : 0.0;
}

// Balancing biases from the step's counts, adaptive capacity from its overflow, and the dead-expert tracker.
int64_t update_routing(Trainer& t, int64_t step) {
  const MoeConfig& m = t.config.moe;
  const BiasBalance balance{m.router.bias_balance_rate, m.router.bias_balance_rule, m.router.bias_balance_decay,
                            m.router.bias_balance_dead_band};
  const CapacityAuto capacity{m.capacity_auto.min,         m.capacity_auto.max,    m.capacity_auto.raise_above,
                              m.capacity_auto.lower_below, m.capacity_auto.window, m.capacity_auto.step};
  int64_t dead = 0;
  for (size_t i = 0; i < t.moe_layers.size(); ++i) {
    const RouterStepStats& st = *t.moe_layers[i]->router_stats();
    t.moe_layers[i]->update_balancing_bias(st.tokens_per_expert, balance);
    if (m.capacity_auto.enabled) t.moe_layers[i]->update_capacity(overflow_ratio(st, m.top_k), capacity);
    std::vector<int64_t>& last_used = t.moe_layers[i]->last_used_step();
    for (size_t e = 0; e < st.tokens_per_expert.size(); ++e) {
      if (st.tokens_per_expert[e] > 0) last_used[e] = step;
      dead += step - last_used[e] >= kDeadAfterSteps;
    }
  }
  if (t.pipeline) t.groups.pp->allreduce_sum(&dead, 1);
  return dead;
}

}  // namespace

void fail_non_finite_state(const ckpt::NonFiniteSnapshot& found) {
  MOE_RUN_FAILED(
      "after step " << found.step << ", " << found.count << " values of the training state are not finite"
                    << (found.first_tensor.empty() ? std::string() : " (on this rank, in " + found.first_tensor + ")")
                    << "; no checkpoint of this step is written and the committed ones are kept. "
                       "Lower optim.lr or raise optim.warmup, and resume from the newest checkpoint "
                       "(--resume auto)");
}

// The router warm-up with a frozen backbone (moe.router.warmup.freeze_backbone): only router parameters
// learn. Before the update: every other gradient is zeroed (so clipping sees the routers' alone) and the
// parameters are kept; after it, restored (AdamW's weight decay would move them otherwise).
class BackboneFreeze {
 public:
  BackboneFreeze(Trainer& t, int64_t step) : t_(t) {
    const RouterConfig& r = t.config.moe.router;
    if (!r.warmup_freeze_backbone || step >= r.warmup_steps) return;
    Model<float>& model = *t.model;
    Ops<float>& ops = model.backend().ops<float>();
    kept_ = model.backend().allocate(dtype_of<float>(), model.num_params());
    ops.copy(model.params(), kept_.data<float>(), model.num_params());
    for (const ParamSpec& spec : model.table().specs())
      if (spec.role != ParamRole::Router) ops.fill(model.grads() + spec.offset, 0.0f, spec.numel);
    active_ = true;
  }
  void restore() {
    if (!active_) return;
    Model<float>& model = *t_.model;
    for (const ParamSpec& spec : model.table().specs())
      if (spec.role != ParamRole::Router)
        model.backend().ops<float>().copy(kept_.data<float>() + spec.offset, model.params() + spec.offset, spec.numel);
    model.backend().ops<float>().parameters_changed();  // written past adamw_update's rounded copy
  }

 private:
  Trainer& t_;
  Buffer kept_;
  bool active_ = false;
};

void parameters_before_forward(Trainer& t) {
  if (!t.parameters_only_updated) t.backend.ops<float>().parameters_changed();  // a load or the initialisation
}

StepResult train_step(Trainer& t, int64_t step) {
  StepResult r;
  parameters_before_forward(t);
  t.parameters_only_updated = false;
  // A scheduled temperature is a function of the step (so a resumed run sets the same).
  if (!t.config.moe.router.tau_schedule.empty())
    for (MoeLayer<float>* m : t.moe_layers) m->set_tau(t.config.moe.router.tau_at(step));
  const double loss_scale = 1.0 / double(t.tokens_per_step());  // mean over all tokens of the global batch
  const double loss_sum = forward_backward(t, step, loss_scale);
  {
    const auto span = t.tracer.span("loss and routing statistics", "communication");
    reduce_losses(t, loss_sum, loss_scale, r);
  }
  // Everything after the loss check changes the training state: an asynchronous save's snapshot must be taken
  // first. Waiting before the check also fails a run whose saved state was not finite (which makes this loss
  // so) with that reason (Checkpointer::save).
  r.ckpt_wait_s = wait_for_snapshot(t.state);
  if (!std::isfinite(r.loss))
    MOE_RUN_FAILED("the loss became " << r.loss << " at step " << step + 1 << " (lm " << r.lm_loss << ", aux " << r.aux
                                      << ", z " << r.z << ", entropy " << r.entropy << ", death " << r.death
                                      << ", warmup " << r.warmup
                                      << "); nothing of this step is saved. Lower optim.lr, raise optim.warmup or "
                                         "lower the moe.loss.* coefficient of a non-finite term, and resume from the "
                                         "newest checkpoint (--resume auto)");
  BackboneFreeze freeze(t, step);
  {
    const auto span = t.tracer.span("clipping", "optimizer");
    clip_gradients(t, r);
  }
  r.lr = t.schedule.at(step);
  {
    const auto span = t.tracer.span("optimizer", "optimizer");
    t.optimizer->step(t.model->params(), t.model->grads(), r.lr);
    t.buckets->allgather_params(t.model->params());  // with ZeRO: drops the rounded copy
    freeze.restore();                                // drops it where it restores
    t.parameters_only_updated = true;
  }
  const auto span = t.tracer.span("routing update", "optimizer");
  r.dead_experts = update_routing(t, step);
  return r;
}

}  // namespace moe
