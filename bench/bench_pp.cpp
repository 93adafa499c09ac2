// bench_pp: what the 1F1B pipeline (parallel/pipeline.h) costs in idle time and keeps in memory, with the
// whole world as one pipeline (pp = the number of ranks), each rank building its stage of a dense model as
// `moe train` does (an equal share of the layers, the embedding on the first stage, the head on the last):
//   1. the bubble: for several micro-batch counts m, each stage's busy time (its forwards and backwards)
//      against the step's wall time, 1 - busy / wall, next to the ideal (pp - 1) / (vpp m + pp - 1) of equal
//      stages and free communication, and next to the schedule simulated with the measured forward and
//      backward times of the stages (parallel/pp_schedule.h simulate_schedule). With --vpp V > 1 each rank
//      holds V chunks of its layers (virtual stage c * pp + rank) run by interleaved 1F1B, and only the
//      micro-batch counts that are multiples of pp are measured (the schedule needs them);
//   2. stage 0's activation memory: the most micro-batches it had in flight during the steps (counted from
//      the executed actions) times one micro-batch's activations, against the 1F1B bound min(pp, m) micro-batches,
//      and what GPipe would keep (m).
// Run it under mpirun; rank 0 prints the tables, then one line of JSON with every figure. It measures; it
// asserts nothing about speed (the ctest entry runs --quick on 2 ranks and checks the exit code). With more
// ranks than cores the stages share cores and the measured bubble says more about the machine than the
// schedule; docs/bench.md says how to read it.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/mpi_bench_main.h"
#include "bench/timing.h"
#include "core/backend/backend.h"
#include "core/error.h"
#include "core/model.h"
#include "parallel/mpi_communicator.h"
#include "parallel/pipeline.h"

namespace moe::bench {
namespace {

struct Options {
  int64_t vocab = 256, d_model = 128, layers_per_stage = 2, heads = 4, seq_len = 128, batch = 2, vpp = 1;
  std::vector<int64_t> micro_batches = {1, 2, 4, 8, 16};
  int threads = 1;
  int steps = 5;
  int warmup = 1;
  bool quick = false;
};

// One step's measurement on this rank: wall time, time in forwards and in backwards, and the most
// micro-batches in flight.
struct StepTimes {
  double wall = 0, forward = 0, backward = 0;
  int64_t peak_in_flight = 0;
};

StepTimes run_step(PipelineExecutor<float>& executor, const std::vector<Model<float>*>& chunks, Communicator& pp,
                   const std::vector<int32_t>& tokens, double loss_scale) {
  StepTimes st;
  int64_t in_flight = 0;
  Stopwatch action;
  PipelineExecutor<float>::MicroBatches mbs;
  mbs.tokens = [&](int64_t, int32_t* out) { std::copy(tokens.begin(), tokens.end(), out); };
  mbs.before_chunk_forward = [&](int64_t mb, int64_t c) { chunks[size_t(c)]->set_context(true, 0, mb, 1.0, 1); };
  mbs.around = [&](const PipeAction& a, bool begin) {
    if (begin) {
      action = Stopwatch();
      return;
    }
    if (a.op == PipeOp::Forward) st.forward += action.seconds(), ++in_flight;
    if (a.op == PipeOp::Backward) st.backward += action.seconds(), --in_flight;
    st.peak_in_flight = std::max(st.peak_in_flight, in_flight);
  };
  for (Model<float>* model : chunks) model->zero_grads();
  pp.barrier();
  Stopwatch wall;
  executor.run(mbs, loss_scale);
  pp.barrier();  // the step ends when the last stage's last backward has reached the first stage
  st.wall = wall.seconds();
  return st;
}

// Per stage (gathered to every rank): the medians over the steps.
struct StageFigures {
  std::vector<double> wall, forward, backward;
  std::vector<int64_t> peak_in_flight;
};

// This rank's chunks: chunk c holds the layers_per_stage / vpp layers of virtual stage c * P + rank. Returns
// the slots they hold in all and the activation bytes of one (micro-batch, chunk) on average.
struct Chunks {
  std::vector<std::unique_ptr<Model<float>>> models;
  std::vector<Model<float>*> views;
  int64_t slots = 0;
  double bytes_per_unit = 0;
};

Chunks build_chunks(const Options& o, Backend& backend, int64_t P, int64_t s, int64_t m) {
  const int64_t V = o.vpp, L = o.layers_per_stage / V;
  const ModelShape shape{o.vocab, o.d_model, P * o.layers_per_stage, o.heads, 3 * o.d_model};
  Chunks out;
  for (int64_t c = 0; c < V; ++c) {
    const int64_t v = virtual_stage(P, s, c);
    const int slots = int(pipeline_slots(PipeSchedule::OneFOneB, P, s, m, V, c));
    out.models.push_back(std::make_unique<Model<float>>(
        backend, ModelOptions<float>{.shape = shape,
                                     .seq_len = o.seq_len,
                                     .max_batch = o.batch,
                                     .num_slots = slots,
                                     .stage = StageSpec{v * L, (v + 1) * L, v == 0, v == P * V - 1}}));
    out.models.back()->init_params(1);
    out.views.push_back(out.models.back().get());
    out.slots += slots;
    out.bytes_per_unit += double(out.models.back()->activation_bytes() / slots) / double(V);
  }
  return out;
}

nlohmann::json measure_micro_batches(const Options& o, Backend& backend, Communicator& pp, int64_t m) {
  const int64_t P = pp.size(), s = pp.rank(), V = o.vpp;
  const Chunks chunks = build_chunks(o, backend, P, s, m);
  PipelineExecutor<float> executor(chunks.views, pp, PipeSchedule::OneFOneB, m, o.batch, o.seq_len);
  std::vector<int32_t> tokens(size_t(o.batch * (o.seq_len + 1)));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 131 + 17) % size_t(o.vocab));
  const double loss_scale = 1.0 / double(m * o.batch * o.seq_len);
  for (int i = 0; i < o.warmup; ++i) run_step(executor, chunks.views, pp, tokens, loss_scale);
  std::vector<double> wall, forward, backward;
  int64_t peak = 0;
  for (int i = 0; i < o.steps; ++i) {
    const StepTimes st = run_step(executor, chunks.views, pp, tokens, loss_scale);
    wall.push_back(st.wall), forward.push_back(st.forward), backward.push_back(st.backward);
    peak = std::max(peak, st.peak_in_flight);
  }
  // Every stage's medians, in stage order.
  std::vector<double> mine = {summarize(wall).median, summarize(forward).median, summarize(backward).median,
                              double(peak),           chunks.bytes_per_unit,     double(chunks.slots)};
  std::vector<double> all(mine.size() * size_t(P));
  pp.allgather(mine.data(), all.data(), int64_t(mine.size()));
  nlohmann::json stages = nlohmann::json::array();
  double step_wall = 0, bubble_sum = 0;
  std::vector<double> forward_each, backward_each;  // per micro-batch and chunk, per stage
  for (int64_t q = 0; q < P; ++q) {
    const double* f = all.data() + q * int64_t(mine.size());
    const double busy = f[1] + f[2], bubble = 1 - busy / f[0];
    step_wall = std::max(step_wall, f[0]), bubble_sum += bubble;
    forward_each.push_back(f[1] / double(m * V)), backward_each.push_back(f[2] / double(m * V));
    stages.push_back({{"stage", q},
                      {"wall_s", f[0]},
                      {"forward_s", f[1]},
                      {"backward_s", f[2]},
                      {"bubble", bubble},
                      {"peak_in_flight", int64_t(f[3])},
                      {"activation_bytes_per_micro_batch", int64_t(f[4] * double(V))}});
  }
  // The schedule run with each stage's measured forward and backward times, communication free: the bubble
  // the stages' imbalance explains; what the measurement adds is communication and waiting on the machine.
  const double makespan = simulate_schedule(PipeSchedule::OneFOneB, m, forward_each, backward_each, nullptr, V);
  double simulated = 0;
  for (int64_t q = 0; q < P; ++q)
    simulated += (1 - double(m * V) * (forward_each[size_t(q)] + backward_each[size_t(q)]) / makespan) / double(P);
  const double ideal = double(P - 1) / double(V * m + P - 1);
  // Stage 0's in-flight units are (micro-batch, chunk) pairs; its bound is the slots its chunks hold (1F1B:
  // min(P, m)); GPipe would keep every micro-batch on every chunk.
  const double first_bytes = all[4], peak0 = all[3], bound0 = all[5];
  return {{"micro_batches", m},
          {"step_s", step_wall},
          {"bubble", bubble_sum / double(P)},
          {"ideal_bubble", ideal},
          {"simulated_bubble", simulated},
          {"ratio_to_ideal", ideal > 0 ? bubble_sum / double(P) / ideal : 0.0},
          {"stage0_peak_in_flight", int64_t(peak0)},
          {"stage0_activation_bytes_peak", int64_t(peak0 * first_bytes)},
          {"stage0_activation_bytes_1f1b_bound", int64_t(bound0 * first_bytes)},
          {"stage0_activation_bytes_gpipe", int64_t(double(m * V) * first_bytes)},
          {"stages", stages}};
}

void print_table(const nlohmann::json& runs, int64_t P, int64_t V) {
  if (V == 1)
    std::printf(
        "pipeline of %lld stages (1F1B): bubble = 1 - busy / wall, averaged over the stages; "
        "ideal (P - 1) / (m + P - 1)\n",
        (long long)P);
  else
    std::printf(
        "pipeline of %lld stages, %lld chunks each (interleaved 1F1B): bubble = 1 - busy / wall, averaged "
        "over the stages; ideal (P - 1) / (vpp m + P - 1)\n",
        (long long)P, (long long)V);
  std::printf("%4s %10s %9s %9s %9s %8s | %-34s\n", "m", "step ms", "bubble", "ideal", "simulated", "ratio",
              "stage 0 activations: peak / bound / GPipe (MiB)");
  for (const nlohmann::json& r : runs) {
    const double mib = 1024.0 * 1024.0;
    std::printf("%4lld %10.2f %9.3f %9.3f %9.3f %8.2f | %lld in flight: %.2f / %.2f / %.2f\n",
                (long long)r["micro_batches"].get<int64_t>(), 1e3 * r["step_s"].get<double>(),
                r["bubble"].get<double>(), r["ideal_bubble"].get<double>(), r["simulated_bubble"].get<double>(),
                r["ratio_to_ideal"].get<double>(), (long long)r["stage0_peak_in_flight"].get<int64_t>(),
                r["stage0_activation_bytes_peak"].get<double>() / mib,
                r["stage0_activation_bytes_1f1b_bound"].get<double>() / mib,
                r["stage0_activation_bytes_gpipe"].get<double>() / mib);
  }
}

void run(const Options& o, MpiCommunicator& world) {
  std::unique_ptr<Backend> backend = make_cpu_backend(o.threads);
  const int64_t P = world.size();
  if (o.layers_per_stage % o.vpp != 0)
    MOE_BAD_INPUT("--vpp " << o.vpp << " does not divide --layers-per-stage " << o.layers_per_stage
                           << "; expected a divisor (each chunk holds layers-per-stage / vpp layers)");
  if (o.vpp > 1 && P < 2) MOE_BAD_INPUT("--vpp " << o.vpp << " needs at least 2 ranks (pipeline stages)");
  nlohmann::json runs = nlohmann::json::array();
  for (int64_t m : o.micro_batches)
    if (o.vpp == 1 || m % P == 0) runs.push_back(measure_micro_batches(o, *backend, world, m));
  if (runs.empty())
    MOE_BAD_INPUT("--vpp " << o.vpp << ": no micro-batch count in --micro-batches is a multiple of the " << P
                           << " stages; interleaving needs one");
  if (world.rank() != 0) return;
  print_table(runs, P, o.vpp);
  const nlohmann::json out = {{"benchmark", "bench_pp"},
                              {"stages", P},
                              {"vpp", o.vpp},
                              {"layers_per_stage", o.layers_per_stage},
                              {"d_model", o.d_model},
                              {"seq_len", o.seq_len},
                              {"micro_batch", o.batch},
                              {"threads", o.threads},
                              {"runs", runs}};
  std::printf("%s\n", out.dump().c_str());
}

}  // namespace
}  // namespace moe::bench

int main(int argc, char** argv) {
  moe::bench::Options o;
  CLI::App app{
      "bench_pp: the 1F1B pipeline's (or interleaved 1F1B's) bubble and stage 0's activation memory (run "
      "under mpirun)"};
  app.add_option("--d-model", o.d_model, "model width")->check(CLI::Range(8, 4096));
  app.add_option("--layers-per-stage", o.layers_per_stage, "layers on each stage")->check(CLI::Range(1, 64));
  app.add_option("--vpp", o.vpp, "model chunks per stage (interleaved 1F1B when > 1; must divide layers-per-stage)")
      ->check(CLI::Range(1, 64));
  app.add_option("--seq-len", o.seq_len, "tokens per sequence")->check(CLI::Range(8, 8192));
  app.add_option("--micro-batch", o.batch, "sequences per micro-batch")->check(CLI::Range(1, 256));
  app.add_option("--micro-batches", o.micro_batches, "micro-batch counts per step to measure")
      ->check(CLI::Range(1, 256));
  app.add_option("--steps", o.steps, "timed steps per micro-batch count (the median is reported)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--threads", o.threads, "threads per rank")->check(CLI::Range(1, 256));
  app.add_flag("--quick", o.quick, "a small model and few steps: exercises every path in a second");
  return moe::bench::parse_and_run_mpi(app, argc, argv, "bench_pp", [&](moe::MpiCommunicator& world) {
    if (o.quick) o.d_model = 32, o.seq_len = 16, o.micro_batches = {1, 4}, o.steps = 2, o.warmup = 1;
    run(o, world);
  });
}
