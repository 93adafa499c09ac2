// bench_tp: what tensor parallelism (parallel/tp_layers.h) costs and saves, on the tensor-parallel group
// of the whole world (tp = the number of ranks), for one micro-batch of a model with dense and MoE layers
// built as `moe train` builds it (launch/train/train_setup.cpp):
//   1. bytes each rank passes to the tp group's collectives in forward, backward and the sum of partial
//      gradients over tp, counted by a CountingCommunicator (parallel/counting_communicator.h), per kind of
//      collective, against the analytic count of docs/bench.md; with sequence parallelism on and off;
//   2. step throughput (forward + backward + the partial-gradient sum) at tp = world against tp = 1 on the
//      same micro-batch, every rank then running its own serial copy at the same time;
//   3. activation, scratch and peak backend memory per rank for train.recompute none, selective and full,
//      at tp = 1 and tp = world, as ratios to none at tp = 1.
// Run it under mpirun; rank 0 prints human-readable tables, then one line of JSON with every figure. It
// measures; it asserts nothing about speed (the ctest entry runs --quick on 2 ranks and checks the exit
// code). Not here: data or expert parallelism's reductions (bench_comm), pipeline stages, expert_tp.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/mpi_bench_main.h"
#include "bench/sgemm_peak.h"
#include "bench/timing.h"
#include "core/backend/backend.h"
#include "core/error.h"
#include "core/model.h"
#include "core/moe_layer.h"
#include "parallel/counting_communicator.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"
#include "parallel/self_communicator.h"
#include "parallel/tp_layers.h"

namespace moe::bench {
namespace {

// The model: layer l is an MoE layer when l is odd (moe.every = 2), else a dense SwiGLU MLP of width
// 3 d_model; experts of width 3 d_model / 2 (configs/tiny_moe.json's ratios), top-2.
struct BenchShape {
  int64_t vocab = 256, d_model = 128, layers = 4, heads = 4, seq_len = 128, batch = 4, experts = 8;
  int64_t top_k = 2;
  ModelShape model() const { return {vocab, d_model, layers, heads, 3 * d_model}; }
  int64_t expert_hidden() const { return 3 * d_model / 2; }
  int64_t tokens() const { return batch * seq_len; }  // N, one micro-batch = the global batch here
  int64_t moe_layers() const { return layers / 2; }
  bool is_moe(int64_t layer) const { return layer % 2 == 1; }
};

struct Options {
  BenchShape shape;
  int threads = 1;
  int steps = 20;
  int warmup = 3;
  bool quick = false;
};

// ---- the model, as the trainer builds it (launch/train/train_setup.cpp build_model and ffn_factory)

MoeSettings moe_settings(const BenchShape& s, int64_t layer) {
  MoeSettings m;  // the router of configs/tiny_moe.json
  m.d_model = s.d_model, m.num_experts = s.experts, m.top_k = s.top_k, m.expert_hidden = s.expert_hidden();
  m.layers_total = s.layers, m.layer = layer;
  m.capacity_factor = 1.25, m.drop_policy = DropPolicy::Probs, m.overflow = Overflow::Drop;
  m.coef_aux = 0.01, m.coef_z = 0.001;
  return m;
}

struct Built {
  std::unique_ptr<Model<float>> model;
  std::unique_ptr<CommunicatorTokenGroup> gather;  // the MoE layers' router-logit all-gather over tp
};

// Over `tp` (size 1: the serial model, as the trainer builds it at parallel.tp = 1).
Built build_model(Backend& backend, const BenchShape& s, Communicator& tp, bool sequence_parallel,
                  Recompute recompute) {
  const TpContext ctx{&tp, sequence_parallel};
  const ModelShape shape = s.model();
  const MoeSettingsOf moe = [&s](int64_t l) -> std::optional<MoeSettings> {
    if (!s.is_moe(l)) return std::nullopt;
    return moe_settings(s, l);
  };
  Built b;
  b.model = std::make_unique<Model<float>>(
      backend, ModelOptions<float>{.shape = shape,
                                   .seq_len = s.seq_len,
                                   .max_batch = s.batch,
                                   .recompute = recompute,
                                   .ffn_factory = tp_ffn_factory<float>(backend, ctx, shape, moe),
                                   .attention_factory = tp_attention_factory<float>(backend, ctx, shape, s.seq_len),
                                   .tp = tensor_parallel_layout<float>(backend, ctx, shape)});
  b.gather = std::make_unique<CommunicatorTokenGroup>(tp);
  for (int64_t l = 0; l < s.layers; ++l)
    if (MoeLayer<float>* m = moe_layer_of(b.model->ffn(l))) m->set_token_group(b.gather.get());
  b.model->init_params(1234);
  return b;
}

std::vector<int32_t> synthetic_tokens(const BenchShape& s) {
  std::vector<int32_t> tokens(size_t(s.batch * (s.seq_len + 1)));
  uint64_t seed = 100;
  for (int32_t& t : tokens) t = int32_t(next_random(seed) % uint64_t(s.vocab));
  return tokens;
}

// One forward and backward of the micro-batch (loss scaled by 1 / tokens, as the trainer's mean); returns
// the mean token loss.
double forward_backward(Model<float>& model, const BenchShape& s, const std::vector<int32_t>& tokens, int64_t step) {
  model.set_context(true, step, 0, 1.0, 1234);
  const double loss = model.forward(tokens.data(), s.batch) / double(s.tokens());
  MOE_CHECK(std::isfinite(loss), "loss " << loss << " at step " << step);
  model.backward(1.0 / double(s.tokens()));
  return loss;
}

double max_over_world(MpiCommunicator& world, double value) {
  CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, world.handle()),
            "allreduce(max) on the world communicator");
  return value;
}

// ---- 1. bytes per collective: counted and analytic

using Counts = std::array<CommCount, kCommKinds>;

struct Phases {
  Counts forward{}, backward{}, gradient{};
};
constexpr const char* kPhaseNames[] = {"forward", "backward", "gradient"};
const Counts& phase(const Phases& p, int i) { return i == 0 ? p.forward : i == 1 ? p.backward : p.gradient; }

void add(Counts& c, CommKind kind, int64_t calls, int64_t bytes_each) {
  c[size_t(kind)].calls += calls;
  c[size_t(kind)].bytes += calls * bytes_each;
}

// What each rank passes to the tp group's collectives for one micro-batch, by the definitions of
// parallel/counting_communicator.h (docs/bench.md derives each line). N tokens, R = N / P rows per rank,
// D d_model, E experts; fp32 activations (4 bytes), the cross-entropy's per-token numbers in double (8).
Phases analytic_traffic(const BenchShape& s, int64_t P, bool sequence_parallel) {
  Phases t;
  if (P == 1) return t;  // the serial model: no tp group
  const int64_t N = s.tokens(), R = N / P, D = s.d_model, E = s.experts, f = 4, d = 8;
  const int64_t L = s.layers, moe = s.moe_layers(), dense = L - moe;
  const int64_t row_parallel = L + dense;  // attention in every layer, the dense MLPs
  // Vocabulary-parallel cross-entropy: row maxima all-gathered (N doubles), then the sums of exponentials
  // and the target logits all-reduced (2 N doubles). Its backward is local.
  add(t.forward, CommKind::Allgather, 1, N * d);
  add(t.forward, CommKind::Allreduce, 1, 2 * N * d);
  if (sequence_parallel) {
    add(t.forward, CommKind::ReduceScatter, 1, N * D * f);              // embedding: partial rows scattered
    add(t.forward, CommKind::Allgather, row_parallel + 1, R * D * f);   // attention, MLP, head: rows gathered
    add(t.forward, CommKind::ReduceScatter, row_parallel, N * D * f);   // attention, MLP: partial output
    add(t.forward, CommKind::Allgather, moe, R * E * f);                // router logits of this rank's rows
    add(t.backward, CommKind::ReduceScatter, 1, N * D * f);             // head: partial input gradient
    add(t.backward, CommKind::Allgather, row_parallel, R * D * f);      // attention, MLP: dy gathered
    add(t.backward, CommKind::Allgather, row_parallel + 1, R * D * f);  // attention, MLP, head: x gathered again
    add(t.backward, CommKind::ReduceScatter, row_parallel, N * D * f);  // attention, MLP: partial dx
    add(t.backward, CommKind::Allgather, 1, R * D * f);                 // embedding: dx gathered
    add(t.gradient, CommKind::Allreduce, 2 * L + 1, D * f);             // norm gains (their rows' share)
  } else {
    add(t.forward, CommKind::Allreduce, 1 + row_parallel, N * D * f);   // embedding, attention, MLP: partial sums
    add(t.forward, CommKind::Allgather, moe, R * E * f);                // router logits of this rank's block
    add(t.forward, CommKind::Allgather, moe, R * D * f);                // TokenSplitFfn: its block's output
    add(t.backward, CommKind::Allreduce, 1 + row_parallel, N * D * f);  // head, attention, MLP: partial dx
    add(t.backward, CommKind::Allgather, moe, R * D * f);               // TokenSplitFfn: its block's dx
  }
  add(t.gradient, CommKind::Allreduce, moe, D * E * f);  // routers (their tokens' share)
  return t;
}

Counts snapshot(CountingCommunicator& c) {
  Counts out{};
  for (int k = 0; k < kCommKinds; ++k) out[size_t(k)] = c.count(CommKind(k));
  c.reset();
  return out;
}

// Counted over one micro-batch, after one untimed one (the first forward sizes the layers' workspaces;
// the counts would be the same).
Phases measure_traffic(Backend& backend, const BenchShape& s, MpiCommunicator& world, bool sequence_parallel) {
  CountingCommunicator tp(world);
  Built b = build_model(backend, s, tp, sequence_parallel, Recompute::None);
  const std::vector<int32_t> tokens = synthetic_tokens(s);
  b.model->zero_grads();
  forward_backward(*b.model, s, tokens, 0);
  reduce_partial_over_tp(b.model->table(), b.model->grads(), tp);
  tp.reset();
  Phases p;
  b.model->set_context(true, 1, 0, 1.0, 1234);
  b.model->forward(tokens.data(), s.batch);
  p.forward = snapshot(tp);
  b.model->backward(1.0 / double(s.tokens()));
  p.backward = snapshot(tp);
  reduce_partial_over_tp(b.model->table(), b.model->grads(), tp);
  p.gradient = snapshot(tp);
  return p;
}

// Bytes that leave a rank if the collective runs a ring (bandwidth-optimal) algorithm, from its payload b
// as counted: all-reduce 2 (P-1)/P b, all-gather (P-1) b (its block to every other rank), reduce-scatter
// and all-to-all (P-1)/P b; point to point b. The same payload definitions make sequence parallelism look
// dearer than it is; this puts both layouts on one scale.
double ring_bytes(CommKind kind, double bytes, int64_t P) {
  const double p = double(P);
  switch (kind) {
    case CommKind::Allreduce:
    case CommKind::Iallreduce:
      return 2 * (p - 1) / p * bytes;
    case CommKind::Allgather:
      return (p - 1) * bytes;
    case CommKind::ReduceScatter:
    case CommKind::IreduceScatter:
    case CommKind::Alltoall:
    case CommKind::Alltoallv:
    case CommKind::Ialltoallv:
      return (p - 1) / p * bytes;
    case CommKind::Recv:
    case CommKind::Irecv:
    case CommKind::Barrier:
      return 0;
    default:
      return bytes;
  }
}

struct TrafficTotals {
  int64_t calls = 0, bytes = 0;
  double ring = 0;
};

TrafficTotals totals(const Phases& p, int64_t P) {
  TrafficTotals t;
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < kCommKinds; ++k) {
      if (CommKind(k) == CommKind::Recv || CommKind(k) == CommKind::Irecv) continue;
      const CommCount& c = phase(p, i)[size_t(k)];
      t.calls += c.calls, t.bytes += c.bytes, t.ring += ring_bytes(CommKind(k), double(c.bytes), P);
    }
  return t;
}

std::string ratio_text(double measured, double analytic) {
  char text[32];
  if (analytic == 0) return measured == 0 ? "-" : "inf";
  std::snprintf(text, sizeof text, "%.3f", measured / analytic);
  return text;
}

void print_traffic(const BenchShape& s, int64_t P, bool sequence_parallel, const Phases& measured,
                   const Phases& model) {
  const int64_t N = s.tokens();
  std::printf("tp %lld, sequence parallelism %s: N = %lld tokens, R = N/tp = %lld rows per rank\n", (long long)P,
              sequence_parallel ? "on" : "off", (long long)N, (long long)(N / P));
  std::printf("  %-9s %-20s %6s %6s %12s %12s %7s\n", "phase", "call", "calls", "model", "bytes", "model", "ratio");
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < kCommKinds; ++k) {
      const CommCount &m = phase(measured, i)[size_t(k)], &a = phase(model, i)[size_t(k)];
      if (m.calls == 0 && a.calls == 0) continue;
      std::printf("  %-9s %-20s %6lld %6lld %12lld %12lld %7s\n", kPhaseNames[i], comm_kind_name(CommKind(k)),
                  (long long)m.calls, (long long)a.calls, (long long)m.bytes, (long long)a.bytes,
                  ratio_text(double(m.bytes), double(a.bytes)).c_str());
    }
  const TrafficTotals tm = totals(measured, P), ta = totals(model, P);
  std::printf("  %-30s %6lld %6lld %12lld %12lld %7s   (%.2f MiB; ring estimate %.2f MiB leave each rank)\n",
              "all sent", (long long)tm.calls, (long long)ta.calls, (long long)tm.bytes, (long long)ta.bytes,
              ratio_text(double(tm.bytes), double(ta.bytes)).c_str(), double(tm.bytes) / (1 << 20),
              tm.ring / (1 << 20));
  std::fflush(stdout);
}

nlohmann::json counts_json(const Counts& measured, const Counts& model) {
  nlohmann::json out = nlohmann::json::object();
  for (int k = 0; k < kCommKinds; ++k) {
    const CommCount &m = measured[size_t(k)], &a = model[size_t(k)];
    if (m.calls == 0 && a.calls == 0) continue;
    out[comm_kind_name(CommKind(k))] = {
        {"calls", m.calls}, {"bytes", m.bytes}, {"analytic_calls", a.calls}, {"analytic_bytes", a.bytes}};
  }
  return out;
}

nlohmann::json traffic_json(int64_t P, bool sequence_parallel, const Phases& measured, const Phases& model) {
  const TrafficTotals tm = totals(measured, P), ta = totals(model, P);
  nlohmann::json j = {{"tp", P},
                      {"sequence_parallel", sequence_parallel},
                      {"calls", tm.calls},
                      {"bytes", tm.bytes},
                      {"analytic_calls", ta.calls},
                      {"analytic_bytes", ta.bytes},
                      {"ratio", ta.bytes == 0 ? 1.0 : double(tm.bytes) / double(ta.bytes)},
                      {"ring_bytes", tm.ring}};
  for (int i = 0; i < 3; ++i) j[kPhaseNames[i]] = counts_json(phase(measured, i), phase(model, i));
  return j;
}

// ---- 2. step throughput, tp = 1 against tp = world

// "tp 2, sequence par.", for the tables.
std::string layout_label(int64_t P, bool sp) {
  return P == 1 ? "tp 1" : "tp " + std::to_string(P) + (sp ? ", sequence par." : ", no seq. par.");
}

struct StepResult {
  int64_t tp = 1;
  bool sequence_parallel = false;
  Summary step_s;
  double loss = 0;  // mean token loss of the last step: tp = world computes the serial model's
};

// A step: zero the gradients, a barrier over the world, then forward, backward and the partial-gradient sum
// timed on each rank; a step's time is the slowest rank's. The median over `steps` after `warmup`.
StepResult measure_steps(const Options& o, MpiCommunicator& world, Communicator& tp, bool sequence_parallel) {
  const std::unique_ptr<Backend> backend = make_cpu_backend(o.threads);
  Built b = build_model(*backend, o.shape, tp, sequence_parallel, Recompute::None);
  const std::vector<int32_t> tokens = synthetic_tokens(o.shape);
  StepResult r;
  r.tp = tp.size(), r.sequence_parallel = sequence_parallel && tp.size() > 1;
  std::vector<double> seconds;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    b.model->zero_grads();
    world.barrier();
    const Stopwatch clock;
    r.loss = forward_backward(*b.model, o.shape, tokens, i);
    reduce_partial_over_tp(b.model->table(), b.model->grads(), tp);
    const double t = max_over_world(world, clock.seconds());
    if (i >= o.warmup) seconds.push_back(t);
  }
  r.step_s = summarize(seconds);
  return r;
}

double tokens_per_s(const BenchShape& s, const StepResult& r) { return double(s.tokens()) / r.step_s.median; }

void print_steps(const Options& o, int64_t P, const std::vector<StepResult>& rows) {
  const BenchShape& s = o.shape;
  std::printf(
      "step throughput: one micro-batch of %lld x %lld tokens (the same global batch at every tp); a step =\n"
      "  forward + backward + the partial-gradient sum over tp, %d thread(s) per rank; slowest rank, median of %d\n"
      "  after %d warm-up; at tp 1 every rank runs its own serial copy at the same time\n",
      (long long)s.batch, (long long)s.seq_len, o.threads, o.steps, o.warmup);
  std::printf("  %-22s %10s %10s %10s %11s %9s %12s %11s\n", "layout", "step(ms)", "min(ms)", "max(ms)", "tokens/s",
              "x tp 1", "x tp1 ranks", "loss");
  const double base = tokens_per_s(s, rows.front());
  for (const StepResult& r : rows) {
    const double tps = tokens_per_s(s, r);
    // x tp1 ranks: against the P serial copies together (what the same cores do with data parallelism).
    std::printf("  %-22s %10.2f %10.2f %10.2f %11.0f %9.3f %12.3f %11.6f\n",
                layout_label(r.tp, r.sequence_parallel).c_str(), r.step_s.median * 1e3, r.step_s.min * 1e3,
                r.step_s.max * 1e3, tps, tps / base, tps / (base * double(P)), r.loss);
  }
  std::fflush(stdout);
}

nlohmann::json steps_json(const BenchShape& s, int64_t P, const std::vector<StepResult>& rows) {
  nlohmann::json out = nlohmann::json::array();
  const double base = tokens_per_s(s, rows.front());
  for (const StepResult& r : rows)
    out.push_back({{"tp", r.tp},
                   {"sequence_parallel", r.sequence_parallel},
                   {"step_ms", summary_json(r.step_s, 1e3)},
                   {"tokens_per_s", tokens_per_s(s, r)},
                   {"ratio_to_tp1", tokens_per_s(s, r) / base},
                   {"ratio_to_tp1_all_ranks", tokens_per_s(s, r) / (base * double(P))},
                   {"loss", r.loss}});
  return out;
}

// ---- 3. memory per recompute mode

struct MemoryRow {
  int64_t tp = 1;
  bool sequence_parallel = false;
  Recompute recompute = Recompute::None;
  int64_t activation_bytes = 0, scratch_bytes = 0, peak_bytes = 0;
};

const char* recompute_name(Recompute r) {
  return r == Recompute::None ? "none" : r == Recompute::Selective ? "selective" : "full";
}

// Model::activation_bytes() and scratch_bytes(), and the backend's peak over building the model and one
// forward + backward (parameters, gradients, activations, scratch, the layers' workspaces with the MoE
// layers' routed rows): a fresh backend per row, so the peak is that model's alone.
MemoryRow measure_memory(const Options& o, Communicator& tp, bool sequence_parallel, Recompute recompute) {
  const std::unique_ptr<Backend> backend = make_cpu_backend(o.threads);
  MemoryRow row;
  row.tp = tp.size(), row.sequence_parallel = sequence_parallel && tp.size() > 1, row.recompute = recompute;
  {
    Built b = build_model(*backend, o.shape, tp, sequence_parallel, recompute);
    b.model->zero_grads();
    forward_backward(*b.model, o.shape, synthetic_tokens(o.shape), 0);
    row.activation_bytes = b.model->activation_bytes();
    row.scratch_bytes = b.model->scratch_bytes();
  }
  row.peak_bytes = backend->peak_bytes();
  return row;
}

void print_memory(const std::vector<MemoryRow>& rows) {
  std::printf(
      "memory per rank: Model::activation_bytes() (what the micro-batch slot keeps for backward),\n"
      "  Model::scratch_bytes() (one forward or backward's workspace), and the backend's peak over building\n"
      "  the model and one forward + backward (parameters, gradients and the layers' workspaces included);\n"
      "  ratios to recompute none at tp 1:\n");
  std::printf("  %-22s %-10s %12s %7s %12s %7s %12s %7s\n", "layout", "recompute", "activations", "ratio", "scratch",
              "ratio", "peak", "ratio");
  const MemoryRow& base = rows.front();
  auto mib = [](int64_t bytes) { return double(bytes) / (1 << 20); };
  for (const MemoryRow& r : rows) {
    std::printf("  %-22s %-10s %8.2f MiB %7.3f %8.2f MiB %7.3f %8.2f MiB %7.3f\n",
                layout_label(r.tp, r.sequence_parallel).c_str(), recompute_name(r.recompute), mib(r.activation_bytes),
                double(r.activation_bytes) / double(base.activation_bytes), mib(r.scratch_bytes),
                double(r.scratch_bytes) / double(base.scratch_bytes), mib(r.peak_bytes),
                double(r.peak_bytes) / double(base.peak_bytes));
  }
  std::fflush(stdout);
}

nlohmann::json memory_json(const std::vector<MemoryRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  const MemoryRow& base = rows.front();
  for (const MemoryRow& r : rows)
    out.push_back({{"tp", r.tp},
                   {"sequence_parallel", r.sequence_parallel},
                   {"recompute", recompute_name(r.recompute)},
                   {"activation_bytes", r.activation_bytes},
                   {"scratch_bytes", r.scratch_bytes},
                   {"peak_bytes", r.peak_bytes},
                   {"activation_ratio", double(r.activation_bytes) / double(base.activation_bytes)},
                   {"scratch_ratio", double(r.scratch_bytes) / double(base.scratch_bytes)},
                   {"peak_ratio", double(r.peak_bytes) / double(base.peak_bytes)}});
  return out;
}

// ---- the run

// The sizes tp = P needs (docs/parallel.md "what the config requires"), found on every rank alike.
void check_shape(const BenchShape& s, int64_t P) {
  auto require = [](bool ok, const std::string& what) {
    if (!ok) MOE_BAD_INPUT(what);
  };
  require(s.d_model % s.heads == 0 && (s.d_model / s.heads) % 2 == 0,
          "--d-model " + std::to_string(s.d_model) + " must be --heads " + std::to_string(s.heads) +
              " times an even head width");
  require(s.heads % P == 0, "--heads " + std::to_string(s.heads) + " is not a multiple of tp = " + std::to_string(P));
  require(s.vocab % P == 0, "--vocab " + std::to_string(s.vocab) + " is not a multiple of tp = " + std::to_string(P));
  require(3 * s.d_model % P == 0, "the dense MLP width 3 x --d-model is not a multiple of tp = " + std::to_string(P));
  require(s.seq_len % P == 0,
          "--seq-len " + std::to_string(s.seq_len) + " is not a multiple of tp = " + std::to_string(P));
  require(s.experts >= s.top_k, "--experts " + std::to_string(s.experts) + " is fewer than top-k = 2");
}

void run(Options o, MpiCommunicator& world) {
  if (o.quick) {  // a smoke check of every code path, not a measurement
    o.shape = {64, 32, 2, 4, 16, 2, 4};
    o.steps = std::min(o.steps, 3);
    o.warmup = 1;
  }
  const int64_t P = world.size();
  check_shape(o.shape, P);
  const bool leader = world.rank() == 0;
  const BenchShape& s = o.shape;
  const std::string load_start = load_average();
  if (leader) {
    std::printf(
        "bench_tp: %lld ranks = the tensor-parallel group; load average %s at start%s\n"
        "model: vocab %lld, d_model %lld, layers %lld (odd ones MoE: %lld experts of width %lld, top-%lld; even ones "
        "a\n"
        "  dense MLP of width %lld), heads %lld; micro-batch %lld x %lld tokens; fp32\n",
        (long long)P, load_start.c_str(), o.quick ? "; --quick: sizes too small to mean anything" : "",
        (long long)s.vocab, (long long)s.d_model, (long long)s.layers, (long long)s.experts,
        (long long)s.expert_hidden(), (long long)s.top_k, (long long)s.model().ffn_hidden, (long long)s.heads,
        (long long)s.batch, (long long)s.seq_len);
    if (P > 1)
      std::printf(
          "bytes per collective call on each rank, as passed by the caller (parallel/counting_communicator.h):\n"
          "  all-reduce its buffer, all-gather its own block, reduce-scatter its whole input; model = docs/bench.md\n");
    else
      std::printf("one rank: no tensor-parallel group, so only the tp 1 rows (run it under mpirun -np 2 or more)\n");
    std::fflush(stdout);
  }
  nlohmann::json traffic = nlohmann::json::array();
  if (P > 1)
    for (const bool sp : {true, false}) {
      const std::unique_ptr<Backend> backend = make_cpu_backend(o.threads);
      const Phases measured = measure_traffic(*backend, s, world, sp), model = analytic_traffic(s, P, sp);
      if (leader) print_traffic(s, P, sp, measured, model);
      traffic.push_back(traffic_json(P, sp, measured, model));
    }

  SelfCommunicator alone("tp");
  std::vector<StepResult> steps{measure_steps(o, world, alone, false)};
  if (P > 1)
    for (const bool sp : {true, false}) steps.push_back(measure_steps(o, world, world, sp));
  if (leader) print_steps(o, P, steps);

  std::vector<MemoryRow> memory;
  for (const Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    memory.push_back(measure_memory(o, alone, false, r));
    if (P > 1)
      for (const bool sp : {true, false}) memory.push_back(measure_memory(o, world, sp, r));
  }
  const std::string load_end = load_average();
  if (!leader) return;
  print_memory(memory);
  std::printf("load average %s at end\n", load_end.c_str());
  const nlohmann::json shape = {{"vocab", s.vocab},
                                {"d_model", s.d_model},
                                {"layers", s.layers},
                                {"heads", s.heads},
                                {"ffn_hidden", 3 * s.d_model},
                                {"experts", s.experts},
                                {"expert_hidden", s.expert_hidden()},
                                {"top_k", s.top_k},
                                {"seq_len", s.seq_len},
                                {"batch", s.batch}};
  const nlohmann::json out = {{"bench", "tp"},
                              {"ranks", P},
                              {"threads", o.threads},
                              {"quick", o.quick},
                              {"steps", o.steps},
                              {"warmup", o.warmup},
                              {"shape", shape},
                              {"bytes_convention",
                               "payload per call as passed: allreduce buffer, allgather own "
                               "block, reduce_scatter whole input"},
                              {"traffic", traffic},
                              {"throughput", steps_json(s, P, steps)},
                              {"memory", memory_json(memory)},
                              {"load_average_start", load_start},
                              {"load_average_end", load_end}};
  std::printf("%s\n", out.dump().c_str());
}

}  // namespace
}  // namespace moe::bench

int main(int argc, char** argv) {
  moe::bench::Options o;
  moe::bench::BenchShape& s = o.shape;
  CLI::App app{
      "bench_tp: tensor parallelism over the world's ranks: bytes per collective against the analytic count, "
      "step throughput against tp 1, activation memory per recompute mode. Run it under mpirun. See docs/bench.md.",
      "bench_tp"};
  app.add_option("--threads", o.threads, "Compute threads per rank (OpenMP and BLAS); 0: all cores")
      ->check(CLI::Range(0, 4096));
  app.add_option("--steps", o.steps, "Timed steps per layout (the median is reported)")->check(CLI::Range(1, 100000));
  app.add_option("--warmup", o.warmup, "Untimed steps per layout before measuring")->check(CLI::Range(0, 100000));
  app.add_option("--vocab", s.vocab, "Vocabulary (a multiple of the ranks)")->check(CLI::Range(2, 1 << 20));
  app.add_option("--d-model", s.d_model, "Model width (heads x an even head width)")->check(CLI::Range(2, 1 << 16));
  app.add_option("--layers", s.layers, "Layers; the odd ones are MoE layers")->check(CLI::Range(1, 1024));
  app.add_option("--heads", s.heads, "Attention heads (a multiple of the ranks)")->check(CLI::Range(1, 1024));
  app.add_option("--seq-len", s.seq_len, "Tokens per sequence (a multiple of the ranks)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--batch", s.batch, "Sequences of the micro-batch (the whole batch of a step)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--experts", s.experts, "Experts of each MoE layer (top-2)")->check(CLI::Range(2, 1 << 12));
  app.add_flag("--quick", o.quick, "Tiny sizes, 3 steps: a smoke check, not a measurement");
  return moe::bench::parse_and_run_mpi(app, argc, argv, "bench_tp",
                                       [&](moe::MpiCommunicator& world) { moe::bench::run(o, world); });
}
