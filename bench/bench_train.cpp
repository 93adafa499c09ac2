// bench_train: throughput of one training step of the dense model on the CPU backend, against the
// machine's sgemm peak measured in the same process (so a busy or throttled machine lowers both).
// Prints human-readable lines, then one line of JSON with every figure. It measures; it asserts nothing
// about speed (the ctest entry only runs --quick and checks the exit code). Not a profiler: the split is
// forward / backward / optimizer, not per op.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/sgemm_peak.h"
#include "bench/timing.h"
#include "bench_main.h"
#include "core/backend/backend.h"
#include "core/error.h"
#include "core/model.h"
#include "optim/adamw.h"

namespace moe::bench {
namespace {

struct Options {
  int threads = 0;  // 0: all cores
  int steps = 10;
  int warmup = 3;
  int sgemm_reps = 5;
  bool quick = false;
};

struct TrainShape {
  std::string name;
  ModelShape model;
  int64_t seq_len = 0, micro_batch = 0, global_batch = 0;
};

struct TrainResult {
  TrainShape shape;
  int64_t params = 0;
  double flops_per_step = 0;  // 3 x forward_flops(micro_batch) x micro-batches
  Summary step_s, forward_s, backward_s, optimizer_s;
  double last_loss = 0;  // mean token loss of the last step, to show the numbers were real
};

// One optimizer step as the trainer runs it (launch/train/trainer.cpp): zero the gradients, forward and
// backward over each micro-batch, clip, AdamW. Tokens are synthetic: the cost does not depend on them.
TrainResult measure_train_step(Backend& backend, const TrainShape& shape, int warmup, int steps) {
  const int64_t T = shape.seq_len, micro = shape.micro_batch;
  MOE_CHECK(shape.global_batch % micro == 0, "global_batch " << shape.global_batch << " is not a multiple of "
                                                             << "micro_batch " << micro);
  const int64_t micro_batches = shape.global_batch / micro;
  Model<float> model(backend, {.shape = shape.model, .seq_len = T, .max_batch = micro});
  model.init_params(1234);
  // The settings of configs/tiny.json; they do not change the cost of a step.
  AdamW optimizer(backend, model.table(), {3e-3, 0.9, 0.95, 1e-8, 0.1});
  const double clip = 1.0, lr = 3e-3;

  std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(micro_batches));
  uint64_t seed = 100;
  for (std::vector<int32_t>& micro_tokens : tokens) {
    micro_tokens.resize(size_t(micro * (T + 1)));
    for (int32_t& t : micro_tokens) t = int32_t(next_random(seed) % uint64_t(shape.model.vocab));
  }

  TrainResult result;
  result.shape = shape;
  result.params = model.num_params();
  result.flops_per_step = 3.0 * model.forward_flops(micro) * double(micro_batches);
  const double loss_scale = 1.0 / double(shape.global_batch * T);
  std::vector<double> step_s, forward_s, backward_s, optimizer_s;
  for (int i = 0; i < warmup + steps; ++i) {
    const Stopwatch step_clock;
    double forward = 0, backward = 0, optimizer_time = 0, loss_sum = 0;
    {
      const Stopwatch clock;
      model.zero_grads();
      optimizer_time += clock.seconds();
    }
    for (int64_t mb = 0; mb < micro_batches; ++mb) {
      const Stopwatch forward_clock;
      loss_sum += model.forward(tokens[size_t(mb)].data(), micro);
      forward += forward_clock.seconds();
      const Stopwatch backward_clock;
      model.backward(loss_scale);
      backward += backward_clock.seconds();
    }
    {
      const Stopwatch clock;
      clip_grad_norm(backend, model.grads(), model.num_params(), clip);
      optimizer.step(model.params(), model.grads(), lr);
      optimizer_time += clock.seconds();
    }
    const double step = step_clock.seconds();
    result.last_loss = loss_sum * loss_scale;
    // A step that produced NaN may have taken a different path (or none); its time means nothing.
    MOE_CHECK(std::isfinite(result.last_loss),
              "loss " << result.last_loss << " at step " << i + 1 << " of shape " << shape.name);
    if (i < warmup) continue;
    step_s.push_back(step);
    forward_s.push_back(forward);
    backward_s.push_back(backward);
    optimizer_s.push_back(optimizer_time);
  }
  result.step_s = summarize(step_s);
  result.forward_s = summarize(forward_s);
  result.backward_s = summarize(backward_s);
  result.optimizer_s = summarize(optimizer_s);
  return result;
}

double tokens_per_second(const TrainResult& r) {
  return double(r.shape.global_batch * r.shape.seq_len) / r.step_s.median;
}
double achieved_gflops(const TrainResult& r) { return r.flops_per_step / r.step_s.median * 1e-9; }

void print_train(const TrainResult& r, const SgemmPeak& peak, int steps) {
  const TrainShape& s = r.shape;
  std::printf(
      "  %s: vocab %lld, d_model %lld, layers %lld, heads %lld, ffn_hidden %lld; seq_len %lld, "
      "%lld sequences = %lld micro-batches of %lld; %.2fM params\n",
      s.name.c_str(), (long long)s.model.vocab, (long long)s.model.d_model, (long long)s.model.layers,
      (long long)s.model.heads, (long long)s.model.ffn_hidden, (long long)s.seq_len, (long long)s.global_batch,
      (long long)(s.global_batch / s.micro_batch), (long long)s.micro_batch, double(r.params) * 1e-6);
  const double gflops = achieved_gflops(r);
  std::printf("    step %.1f ms (median of %d; min %.1f, max %.1f)  %.0f tokens/s  %.1f GFLOP/s = %.2f x sgemm peak\n",
              r.step_s.median * 1e3, steps, r.step_s.min * 1e3, r.step_s.max * 1e3, tokens_per_second(r), gflops,
              gflops / peak.gflops);
  // Shares of the sum of the three medians: the medians of the parts need not add up to the median step.
  const double parts = r.forward_s.median + r.backward_s.median + r.optimizer_s.median;
  std::printf("    split (medians): forward %.1f ms (%.0f%%), backward %.1f ms (%.0f%%), optimizer %.1f ms (%.0f%%)\n",
              r.forward_s.median * 1e3, 100 * r.forward_s.median / parts, r.backward_s.median * 1e3,
              100 * r.backward_s.median / parts, r.optimizer_s.median * 1e3, 100 * r.optimizer_s.median / parts);
  std::fflush(stdout);
}

nlohmann::json to_json(const Options& o, int threads, const SgemmPeak& peak, const std::vector<TrainResult>& trains,
                       const std::string& load_start, const std::string& load_end) {
  nlohmann::json shapes = nlohmann::json::array();
  for (const TrainResult& r : trains) {
    const TrainShape& s = r.shape;
    shapes.push_back({{"name", s.name},
                      {"vocab", s.model.vocab},
                      {"d_model", s.model.d_model},
                      {"layers", s.model.layers},
                      {"heads", s.model.heads},
                      {"ffn_hidden", s.model.ffn_hidden},
                      {"seq_len", s.seq_len},
                      {"micro_batch", s.micro_batch},
                      {"global_batch", s.global_batch},
                      {"params", r.params},
                      {"flops_per_step", r.flops_per_step},
                      {"step_ms", summary_json(r.step_s, 1e3)},
                      {"forward_ms", summary_json(r.forward_s, 1e3)},
                      {"backward_ms", summary_json(r.backward_s, 1e3)},
                      {"optimizer_ms", summary_json(r.optimizer_s, 1e3)},
                      {"tokens_per_s", tokens_per_second(r)},
                      {"gflops", achieved_gflops(r)},
                      {"ratio_to_sgemm_peak", achieved_gflops(r) / peak.gflops},
                      {"last_loss", r.last_loss}});
  }
  return {{"bench", "train"},
          {"threads", threads},
          {"hardware_threads", int(std::thread::hardware_concurrency())},
          {"quick", o.quick},
          {"steps", o.steps},
          {"warmup", o.warmup},
          {"flops_convention", "3 x Model::forward_flops per micro-batch"},
          {"load_average_start", load_start},
          {"load_average_end", load_end},
          {"sgemm", sgemm_json(peak, o.sgemm_reps)},
          {"train", shapes}};
}

void run(Options o) {
  const std::unique_ptr<Backend> backend = make_cpu_backend(o.threads);
  std::vector<int64_t> sgemm_sizes{512, 1024, 2048};
  std::vector<TrainShape> shapes{
      // configs/tiny.json, the default experiment.
      {"tiny", {256, 128, 4, 4, 384}, 128, 4, 16},
      // Four times the width of every matrix and twice the context; the same 16 sequences.
      {"larger", {256, 256, 4, 8, 768}, 256, 4, 16},
  };
  if (o.quick) {  // a smoke check of every code path, not a measurement
    sgemm_sizes = {64, 128};
    shapes = {{"quick", {64, 32, 2, 2, 96}, 16, 2, 4}};
    o.steps = std::min(o.steps, 3);
    o.warmup = 1;
    o.sgemm_reps = 3;
  }
  const std::string load_start = load_average();
  std::printf("bench_train: %d threads (%u hardware threads), load average %s at start%s\n", backend->threads(),
              std::thread::hardware_concurrency(), load_start.c_str(),
              o.quick ? "; --quick: sizes too small to mean anything" : "");
  std::printf(
      "sgemm peak: Ops<float>::gemm of the CPU backend (OpenBLAS), square n x n x n, 2 n^3 FLOPs, median of %d reps:\n",
      o.sgemm_reps);
  const SgemmPeak peak = measure_sgemm_peak(*backend, sgemm_sizes, o.sgemm_reps);
  std::printf("  peak %.1f GFLOP/s (n=%lld)\n", peak.gflops, (long long)peak.n);
  std::printf(
      "training step: dense model, fp32, Recompute::None, AdamW + clipping; %d warm-up steps, median of %d;\n"
      "  FLOPs counted as 3 x Model::forward_flops per micro-batch (forward + backward matmuls, attention as full\n"
      "  T x T); optimizer time = zero_grads + clip_grad_norm + AdamW step\n",
      o.warmup, o.steps);
  std::fflush(stdout);
  std::vector<TrainResult> trains;
  for (const TrainShape& shape : shapes) {
    trains.push_back(measure_train_step(*backend, shape, o.warmup, o.steps));
    print_train(trains.back(), peak, o.steps);
  }
  const std::string load_end = load_average();
  std::printf("load average %s at end\n", load_end.c_str());
  std::printf("%s\n", to_json(o, backend->threads(), peak, trains, load_start, load_end).dump().c_str());
}

}  // namespace
}  // namespace moe::bench

int main(int argc, char** argv) {
  moe::bench::Options options;
  CLI::App app{
      "bench_train: tokens/s and GFLOP/s of a dense-model training step on the CPU, as a ratio to the "
      "sgemm peak measured in the same run. See docs/bench.md.",
      "bench_train"};
  app.add_option("--threads", options.threads, "Compute threads (OpenMP and BLAS); 0: all cores")
      ->check(CLI::Range(0, 4096));
  app.add_option("--steps", options.steps, "Measured training steps per shape (the median is reported)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--warmup", options.warmup, "Untimed training steps per shape before measuring")
      ->check(CLI::Range(0, 100000));
  app.add_option("--sgemm-reps", options.sgemm_reps, "Timed sgemm calls per size (the median is reported)")
      ->check(CLI::Range(1, 100000));
  app.add_flag("--quick", options.quick, "Tiny sizes, about a second: a smoke check, not a measurement");
  return moe::bench::parse_and_run(app, argc, argv, "bench_train", [&] { moe::bench::run(options); });
}
