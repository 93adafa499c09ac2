// bench_moe: forward and forward+backward time of one MoE layer (core/moe_layer.h) on one routing group,
// on the CPU backend, for several expert counts E and top-k K, against two baselines measured in the
// same process: the machine's sgemm peak, and a dense SwiGLU MLP (core/ffn.h) as wide as the experts a
// token activates (K x expert_hidden) on the same tokens. The two do the same expert FLOPs, so the
// MoE / dense time ratio is what routing costs: router, top-k, permutation, per-expert GEMMs smaller than
// one dense GEMM, combine. Prints human-readable lines, then one line of JSON with every figure. It
// measures; it asserts nothing about speed. Not a profiler: it cannot split the layer's time by phase.
// --gemm-blocks measures only what the CPU backend's thread-count-invariant GEMM costs (bench/gemm_blocks_bench.h).
// --small-gemm measures only the small-group expert kernels against OpenBLAS (bench/small_gemm_bench.h).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/fused_ops_bench.h"
#include "bench/gemm_blocks_bench.h"
#include "bench/grouped_gemm_bench.h"
#include "bench/memory_bound.h"
#include "bench/sgemm_peak.h"
#include "bench/small_gemm_bench.h"
#include "bench/timing.h"
#include "bench_main.h"
#include "core/backend/backend.h"
#include "core/backend/cpu/blas_kernels.h"
#include "core/backend/cpu/small_gemm.h"
#include "core/error.h"
#include "core/ffn.h"
#include "core/moe_layer.h"
#include "core/params.h"

namespace moe::bench {
namespace {

struct Options {
  int threads = 0;  // 0: all cores
  int reps = 10;
  int warmup = 3;
  int sgemm_reps = 5;
  bool quick = false;
  bool gemm_blocks = false;              // only the GEMM blocks section
  bool small_gemm = false;               // only the small-group kernels section
  std::vector<int64_t> experts, top_ks;  // empty: the default sweep (8, 32, 64 x 1, 2, 4)
};

struct MoeShape {
  int64_t d_model = 0;         // D
  int64_t expert_hidden = 0;   // width of each routed expert
  int64_t tokens = 0;          // N, one routing group
  int64_t experts = 0;         // E
  int64_t top_k = 0;           // K
  double capacity_factor = 0;  // <= 0: dropless
};

// Medians of one layer's forward and of forward + backward over the same repetitions.
struct LayerTiming {
  double forward_flops = 0;    // FeedForward::forward_flops(N)
  Summary forward_s, train_s;  // train: forward + backward
};

struct MoeResult {
  MoeShape shape;
  LayerTiming moe, dense;
  // Routing of the last forward: assignments computed by an expert (N K minus drops), and the busiest
  // expert's rows, to show how evenly the synthetic tokens spread (the cost depends on it).
  int64_t assignments_computed = 0, max_rows_per_expert = 0;
};

double train_gflops(const LayerTiming& t) { return 3.0 * t.forward_flops / t.train_s.median * 1e-9; }
double forward_gflops(const LayerTiming& t) { return t.forward_flops / t.forward_s.median * 1e-9; }
double tokens_per_second(const MoeResult& r) { return double(r.shape.tokens) / r.moe.train_s.median; }
double ratio_forward(const MoeResult& r) { return r.moe.forward_s.median / r.dense.forward_s.median; }
double ratio_train(const MoeResult& r) { return r.moe.train_s.median / r.dense.train_s.median; }

// One layer with its own flat buffers, as the model would hold it.
struct LayerBuffers {
  ParamTable table;
  std::vector<float> params, grads, acts, scratch;

  void allocate(FeedForward<float>& layer, const std::string& prefix, int64_t N, uint64_t seed) {
    layer.register_params(table, prefix);
    params.assign(size_t(table.numel()), 0.0f);
    grads.assign(size_t(table.numel()), 0.0f);
    table.initialize(params.data(), seed);
    layer.bind(table, params.data(), grads.data());
    acts.assign(size_t(layer.activation_size(N)), 0.0f);
    scratch.assign(size_t(std::max<int64_t>(layer.scratch_size(N), 1)), 0.0f);
  }
};

// Times one forward and one backward of `layer`; appends the forward and the forward + backward times.
void time_layer(FeedForward<float>& layer, LayerBuffers& buffers, const std::vector<float>& x,
                const std::vector<float>& dy, std::vector<float>& y, std::vector<float>& dx, int64_t N,
                std::vector<double>* forward_s, std::vector<double>* train_s) {
  const Stopwatch forward_clock;
  layer.forward(x.data(), y.data(), buffers.acts.data(), N);
  const double forward = forward_clock.seconds();
  const Stopwatch backward_clock;
  layer.backward(x.data(), dy.data(), dx.data(), buffers.acts.data(), buffers.scratch.data(), N);
  const double backward = backward_clock.seconds();
  if (forward_s) forward_s->push_back(forward);
  if (train_s) train_s->push_back(forward + backward);
}

bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float f) { return std::isfinite(f); });
}

// The MoE layer and its dense baseline, measured in alternation (MoE forward + backward, then dense
// forward + backward, each repetition) so that a change of machine load hits both alike.
MoeResult measure_moe(Backend& backend, const MoeShape& shape, int warmup, int reps) {
  const int64_t N = shape.tokens, D = shape.d_model;
  // The router of configs/tiny_moe.json: softmax, no noise, renormalised gates, aux and z losses on.
  MoeSettings settings;
  settings.d_model = D;
  settings.num_experts = shape.experts;
  settings.top_k = shape.top_k;
  settings.expert_hidden = shape.expert_hidden;
  settings.capacity_factor = shape.capacity_factor;
  settings.drop_policy = DropPolicy::Probs;
  settings.overflow = Overflow::Drop;
  settings.coef_aux = 0.01;
  settings.coef_z = 0.001;
  MoeLayer<float> moe(backend, settings);
  DenseMlp<float> dense(backend, D, shape.top_k * shape.expert_hidden, 1);
  LayerBuffers moe_buffers, dense_buffers;
  moe_buffers.allocate(moe, "moe", N, 1234);
  dense_buffers.allocate(dense, "dense", N, 1234);
  FfnContext context;
  context.training = true;
  context.seed = 1234;
  moe.set_context(context);

  // Synthetic tokens: with the router's initial weights they spread over the experts about evenly, as
  // early in training (the cost of a dropless layer depends on how unevenly they spread).
  std::vector<float> x(size_t(N * D)), dy(size_t(N * D)), y(size_t(N * D)), dx(size_t(N * D));
  fill_uniform(x, 3);
  fill_uniform(dy, 4);

  std::vector<double> moe_forward, moe_train, dense_forward, dense_train;
  for (int i = 0; i < warmup + reps; ++i) {
    const bool timed = i >= warmup;
    time_layer(moe, moe_buffers, x, dy, y, dx, N, timed ? &moe_forward : nullptr, timed ? &moe_train : nullptr);
    MOE_CHECK(all_finite(y) && all_finite(dx),
              "MoE layer E=" << shape.experts << " K=" << shape.top_k << " produced a value that is not finite");
    time_layer(dense, dense_buffers, x, dy, y, dx, N, timed ? &dense_forward : nullptr, timed ? &dense_train : nullptr);
  }
  MOE_CHECK(all_finite(y) && all_finite(dx),
            "dense baseline of width " << shape.top_k * shape.expert_hidden << " produced a value that is not finite");

  MoeResult result;
  result.shape = shape;
  result.moe = {moe.forward_flops(N), summarize(moe_forward), summarize(moe_train)};
  result.dense = {dense.forward_flops(N), summarize(dense_forward), summarize(dense_train)};
  std::vector<int64_t> rows(size_t(shape.experts), 0);
  for (const int32_t e : moe.assigned_expert())
    if (e >= 0) ++rows[size_t(e)], ++result.assignments_computed;
  result.max_rows_per_expert = *std::max_element(rows.begin(), rows.end());
  return result;
}

std::string capacity_name(double capacity_factor) {
  if (capacity_factor <= 0) return "dropless";
  char text[32];
  std::snprintf(text, sizeof text, "capacity %.2f", capacity_factor);
  return text;
}

void print_moe(const MoeResult& r, const SgemmPeak& peak) {
  const MoeShape& s = r.shape;
  const int64_t assignments = s.tokens * s.top_k;
  std::printf(
      "  E=%lld K=%lld %s: %lld assignments computed of %lld (%.1f%% dropped), %.0f rows per expert on "
      "average, at most %lld\n",
      (long long)s.experts, (long long)s.top_k, capacity_name(s.capacity_factor).c_str(),
      (long long)r.assignments_computed, (long long)assignments,
      100.0 * double(assignments - r.assignments_computed) / double(assignments),
      double(r.assignments_computed) / double(s.experts), (long long)r.max_rows_per_expert);
  auto line = [&](const char* name, const LayerTiming& t) {
    std::printf(
        "    %-5s forward %6.1f ms (min %.1f, max %.1f) %6.1f GFLOP/s = %.2f x peak;  fwd+bwd %6.1f ms (min %.1f, "
        "max %.1f) %6.1f GFLOP/s = %.2f x peak\n",
        name, t.forward_s.median * 1e3, t.forward_s.min * 1e3, t.forward_s.max * 1e3, forward_gflops(t),
        forward_gflops(t) / peak.gflops, t.train_s.median * 1e3, t.train_s.min * 1e3, t.train_s.max * 1e3,
        train_gflops(t), train_gflops(t) / peak.gflops);
  };
  line("moe", r.moe);
  line("dense", r.dense);
  std::printf("    %.0f tokens/s (fwd+bwd);  moe / dense time: forward %.2f, fwd+bwd %.2f\n", tokens_per_second(r),
              ratio_forward(r), ratio_train(r));
  std::fflush(stdout);
}

void print_table(const std::vector<MoeResult>& results, const SgemmPeak& peak) {
  std::printf("summary (fwd+bwd unless noted; GFLOP/s and x peak of the MoE layer):\n");
  std::printf("  %4s %2s %-14s %10s %8s %7s %16s %16s\n", "E", "K", "capacity", "tokens/s", "GFLOP/s", "x peak",
              "moe/dense fwd", "moe/dense f+b");
  for (const MoeResult& r : results)
    std::printf("  %4lld %2lld %-14s %10.0f %8.1f %7.2f %16.2f %16.2f\n", (long long)r.shape.experts,
                (long long)r.shape.top_k, capacity_name(r.shape.capacity_factor).c_str(), tokens_per_second(r),
                train_gflops(r.moe), train_gflops(r.moe) / peak.gflops, ratio_forward(r), ratio_train(r));
  std::fflush(stdout);
}

nlohmann::json timing_json(const LayerTiming& t, const SgemmPeak& peak) {
  return {{"forward_flops", t.forward_flops},
          {"forward_ms", summary_json(t.forward_s, 1e3)},
          {"forward_backward_ms", summary_json(t.train_s, 1e3)},
          {"forward_gflops", forward_gflops(t)},
          {"forward_backward_gflops", train_gflops(t)},
          {"forward_ratio_to_sgemm_peak", forward_gflops(t) / peak.gflops},
          {"forward_backward_ratio_to_sgemm_peak", train_gflops(t) / peak.gflops}};
}

nlohmann::json to_json(const Options& o, int threads, const SgemmPeak& peak, const std::vector<MoeResult>& results,
                       const std::string& load_start, const std::string& load_end) {
  nlohmann::json layers = nlohmann::json::array();
  for (const MoeResult& r : results) {
    const MoeShape& s = r.shape;
    layers.push_back({{"experts", s.experts},
                      {"top_k", s.top_k},
                      {"capacity_factor", s.capacity_factor},
                      {"d_model", s.d_model},
                      {"expert_hidden", s.expert_hidden},
                      {"dense_hidden", s.top_k * s.expert_hidden},
                      {"tokens", s.tokens},
                      {"assignments_computed", r.assignments_computed},
                      {"max_rows_per_expert", r.max_rows_per_expert},
                      {"tokens_per_s", tokens_per_second(r)},
                      {"moe", timing_json(r.moe, peak)},
                      {"dense", timing_json(r.dense, peak)},
                      {"moe_over_dense_forward", ratio_forward(r)},
                      {"moe_over_dense_forward_backward", ratio_train(r)}});
  }
  return {{"bench", "moe"},
          {"threads", threads},
          {"hardware_threads", int(std::thread::hardware_concurrency())},
          {"kernels", cpu::cpu_gemm_kernels_description()},
          {"quick", o.quick},
          {"reps", o.reps},
          {"warmup", o.warmup},
          {"flops_convention",
           "forward_flops(N) forward, 3 x forward_flops(N) forward + backward; MoE: router + "
           "N K routed experts (no drops)"},
          {"load_average_start", load_start},
          {"load_average_end", load_end},
          {"sgemm", sgemm_json(peak, o.sgemm_reps)},
          {"layers", layers}};
}

// The grouped expert GEMM alone, for each dropless shape (bench/grouped_gemm_bench.h).
std::vector<GroupedResult> measure_grouped(Backend& backend, const std::vector<MoeShape>& shapes, const SgemmPeak& peak,
                                           const Options& o) {
  std::printf(
      "grouped expert GEMM: one MoE layer's experts alone (six grouped GEMM calls and the SwiGLU, forward and "
      "backward), median of %d, against the sgemm peak and against the same experts on one block of all the rows:\n",
      o.reps);
  std::vector<GroupedResult> results;
  for (const MoeShape& s : shapes) {
    if (s.capacity_factor > 0) continue;
    results.push_back(measure_grouped_gemm(backend, {s.d_model, s.expert_hidden, s.tokens, s.experts, s.top_k}, peak.n,
                                           o.warmup, o.reps));
    print_grouped(results.back(), peak);
  }
  return results;
}

// The least fwd+bwd time memory bandwidth allows the experts where their weights and gradients exceed the
// last-level cache (bench/memory_bound.h), over the dense layer's measured time: a floor under MoE / dense.
nlohmann::json measure_memory_bounds(const std::vector<MoeResult>& results, int threads, const Options& o) {
  const Bandwidth bandwidth = measure_read_bandwidth(threads, o.quick ? 2 : 5);
  const double rate = bandwidth.bytes_per_s.median;
  std::printf(
      "memory bound: read bandwidth %.1f GB/s (median of %d sums over %lld MB; min %.1f, max %.1f), last-level\n"
      "  cache %lld MB; a forward + backward moves the experts' weights twice and their gradients in and out, at\n"
      "  least that many bytes / bandwidth where they come from memory (where they fit the cache, only if it does\n"
      "  not keep them: a cache shared with other tenants, say):\n",
      rate * 1e-9, o.quick ? 2 : 5, (long long)(bandwidth.buffer_bytes >> 20), bandwidth.bytes_per_s.min * 1e-9,
      bandwidth.bytes_per_s.max * 1e-9, (long long)(last_level_cache_bytes() >> 20));
  nlohmann::json shapes = nlohmann::json::array();
  for (const MoeResult& r : results) {
    const MoeShape& s = r.shape;
    if (s.capacity_factor > 0) continue;
    const bool streams = experts_stream(s.experts, s.d_model, s.expert_hidden);
    const double bytes = expert_stream_bytes(s.experts, s.d_model, s.expert_hidden), floor_s = bytes / rate;
    const double floor_ratio = floor_s / r.dense.train_s.median;
    std::printf("  E=%lld K=%lld: %.0f MB%s, %.1f ms = %.2f x the dense fwd+bwd (measured moe / dense %.2f)\n",
                (long long)s.experts, (long long)s.top_k, bytes * 1e-6, streams ? "" : " (fit the cache)",
                floor_s * 1e3, floor_ratio, ratio_train(r));
    shapes.push_back({{"experts", s.experts},
                      {"top_k", s.top_k},
                      {"fit_cache", !streams},
                      {"bytes", bytes},
                      {"floor_ms", floor_s * 1e3},
                      {"floor_over_dense_forward_backward", floor_ratio}});
  }
  std::fflush(stdout);
  return {{"read_bytes_per_s", summary_json(bandwidth.bytes_per_s, 1.0)},
          {"buffer_bytes", bandwidth.buffer_bytes},
          {"last_level_cache_bytes", last_level_cache_bytes()},
          {"shapes", shapes}};
}

// The CPU backend's GEMM in blocks against one call OpenBLAS threads, at 1 and 2 threads
// (bench/gemm_blocks_bench.h).
nlohmann::json measure_gemm_blocks_section(Backend& backend, const Options& o) {
  const int reps = o.quick ? 2 : 5 * o.reps;
  std::printf(
      "GEMM blocks: GFLOP/s of the CPU backend's GEMM (fixed blocks, single-threaded calls) / of one OpenBLAS\n"
      "  call threaded by OpenBLAS = the blocks' speed over one call's; median of %d, the four interleaved:\n",
      reps);
  nlohmann::json out = nlohmann::json::array();
  for (const GemmBlocksShape& s : gemm_blocks_shapes(o.quick)) {
    const GemmBlocksResult r = measure_gemm_blocks(backend, s, reps);
    print_gemm_blocks(r);
    std::fflush(stdout);
    out.push_back(gemm_blocks_json(r));
  }
  return out;
}

// The residual stream's fused norms against the ops they replace (bench/fused_ops_bench.h), at 1 and 2 threads.
nlohmann::json measure_fused_norms_section(Backend& backend, const Options& o) {
  const int reps = o.quick ? 2 : 2 * o.reps;
  const int64_t N = o.quick ? 64 : 4096, D = o.quick ? 128 : 4096;
  std::printf(
      "fused residual norms: fused / unfused ms = unfused time over fused time; forward:\n"
      "  rmsnorm_forward_residual against rmsnorm_forward + copy, backward: rmsnorm_backward_add against\n"
      "  rmsnorm_backward + add_inplace; fp32, median of %d, the four interleaved:\n",
      reps);
  const FusedNormResult r = measure_fused_norms(backend, N, D, reps);
  print_fused_norms(r);
  std::fflush(stdout);
  return fused_norms_json(r);
}

// The small-group expert kernels against OpenBLAS, one expert per call, weights from memory, at 1 and 2 threads
// (bench/small_gemm_bench.h).
nlohmann::json measure_small_gemm_section(Backend& backend, const Options& o) {
  const int reps = o.quick ? 2 : 2 * o.reps;
  std::printf(
      "small-group expert GEMMs: GFLOP/s of the CPU backend's kernels for groups of at most %lld rows (%s) / of\n"
      "  single-threaded OpenBLAS calls = the kernels' speed over OpenBLAS's; every expert once per sweep, the\n"
      "  experts' weights 64 MB in all (256 KB with --quick); median of %d sweeps, the four interleaved:\n",
      (long long)cpu::kSmallGemmRows,
      cpu::small_gemm_available() ? "used above for those groups" : "not available here: OpenBLAS both ways", reps);
  nlohmann::json out = nlohmann::json::array();
  for (const SmallGemmShape& s : small_gemm_shapes(o.quick)) {
    const SmallGemmResult r = measure_small_gemm(backend, s, reps, o.quick);
    print_small_gemm(r);
    std::fflush(stdout);
    out.push_back(small_gemm_json(r));
  }
  return out;
}

void run(Options o) {
  const std::unique_ptr<Backend> backend = make_cpu_backend(o.threads);
  if (o.small_gemm) {
    std::printf("bench_moe --small-gemm: load average %s at start; %s\n", load_average().c_str(),
                cpu::cpu_gemm_kernels_description().c_str());
    const nlohmann::json small = measure_small_gemm_section(*backend, o);
    std::printf("load average %s at end\n%s\n", load_average().c_str(),
                nlohmann::json{{"small_gemm", small}}.dump().c_str());
    return;
  }
  if (o.gemm_blocks) {
    std::printf("bench_moe --gemm-blocks: load average %s at start\n", load_average().c_str());
    const nlohmann::json blocks = measure_gemm_blocks_section(*backend, o);
    std::printf("load average %s at end\n%s\n", load_average().c_str(),
                nlohmann::json{{"gemm_blocks", blocks}}.dump().c_str());
    return;
  }
  std::vector<int64_t> sgemm_sizes{512, 1024, 2048};
  int64_t D = 256, F = 512, N = 2048;
  std::vector<int64_t> expert_counts{8, 32, 64}, top_ks{1, 2, 4};
  MoeShape capacity_row{D, F, N, 32, 2, 1.25};
  if (o.quick) {  // a smoke check of every code path, not a measurement
    sgemm_sizes = {64, 128};
    D = 32, F = 64, N = 128;
    expert_counts = {4, 8};
    top_ks = {1, 2};
    capacity_row = {D, F, N, 8, 2, 1.25};
    o.reps = std::min(o.reps, 3);
    o.warmup = 1;
    o.sgemm_reps = 3;
  }
  if (!o.experts.empty()) expert_counts = o.experts;
  if (!o.top_ks.empty()) top_ks = o.top_ks;
  std::vector<MoeShape> shapes;
  for (const int64_t E : expert_counts)
    for (const int64_t K : top_ks) shapes.push_back({D, F, N, E, K, 0.0});
  shapes.push_back(capacity_row);

  const std::string load_start = load_average();
  std::printf("bench_moe: %d threads (%u hardware threads), load average %s at start%s\n  GEMMs: %s\n",
              backend->threads(), std::thread::hardware_concurrency(), load_start.c_str(),
              o.quick ? "; --quick: sizes too small to mean anything" : "",
              cpu::cpu_gemm_kernels_description().c_str());
  std::printf(
      "sgemm peak: Ops<float>::gemm of the CPU backend (OpenBLAS), square n x n x n, 2 n^3 FLOPs, median of %d reps:\n",
      o.sgemm_reps);
  const SgemmPeak peak = measure_sgemm_peak(*backend, sgemm_sizes, o.sgemm_reps);
  std::printf("  peak %.1f GFLOP/s (n=%lld)\n", peak.gflops, (long long)peak.n);
  std::printf(
      "MoE layer: fp32, training forward (softmax router, no noise, aux + z losses) and backward, one routing group\n"
      "  of N=%lld tokens, d_model %lld, expert_hidden %lld; dense baseline: SwiGLU of width K x %lld on the same\n"
      "  tokens (the expert FLOPs of the MoE layer without its routing, so active compute grows with K).\n"
      "  %d warm-up repetitions, median of %d, MoE and dense alternating. FLOPs: forward_flops(N) forward,\n"
      "  3 x forward_flops(N) forward + backward; the MoE's count router + N K assignments, drops not subtracted\n",
      (long long)N, (long long)D, (long long)F, (long long)F, o.warmup, o.reps);
  std::fflush(stdout);
  std::vector<MoeResult> results;
  for (const MoeShape& shape : shapes) {
    results.push_back(measure_moe(*backend, shape, o.warmup, o.reps));
    print_moe(results.back(), peak);
  }
  print_table(results, peak);
  const std::vector<GroupedResult> grouped = measure_grouped(*backend, shapes, peak, o);
  const nlohmann::json memory = measure_memory_bounds(results, backend->threads(), o);
  const std::string load_end = load_average();
  std::printf("load average %s at end\n", load_end.c_str());
  nlohmann::json out = to_json(o, backend->threads(), peak, results, load_start, load_end);
  for (const GroupedResult& r : grouped) out["grouped_gemm"].push_back(grouped_json(r, peak));
  out["memory_bound"] = memory;
  out["fused_norms"] = measure_fused_norms_section(*backend, o);
  if (o.quick) out["gemm_blocks"] = measure_gemm_blocks_section(*backend, o);
  if (o.quick) out["small_gemm"] = measure_small_gemm_section(*backend, o);
  std::printf("%s\n", out.dump().c_str());
}

}  // namespace
}  // namespace moe::bench

int main(int argc, char** argv) {
  moe::bench::Options options;
  CLI::App app{
      "bench_moe: forward and forward+backward time of one MoE layer on the CPU for E = 8, 32, 64 experts and "
      "top-k 1, 2, 4, as a ratio to the sgemm peak and to a dense SwiGLU of the same active width, both measured "
      "in the same run. See docs/bench.md.",
      "bench_moe"};
  app.add_option("--threads", options.threads, "Compute threads (OpenMP and BLAS); 0: all cores")
      ->check(CLI::Range(0, 4096));
  app.add_option("--reps", options.reps, "Measured repetitions per configuration (the median is reported)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--warmup", options.warmup, "Untimed repetitions per configuration before measuring")
      ->check(CLI::Range(0, 100000));
  app.add_option("--sgemm-reps", options.sgemm_reps, "Timed sgemm calls per size (the median is reported)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--experts", options.experts, "Expert counts to measure (default 8 32 64)")
      ->check(CLI::Range(int64_t(1), int64_t(4096)));
  app.add_option("--top-k", options.top_ks, "Top-k values to measure (default 1 2 4)")
      ->check(CLI::Range(int64_t(1), int64_t(64)));
  app.add_flag("--quick", options.quick, "Tiny sizes, well under a second: a smoke check, not a measurement");
  app.add_flag("--gemm-blocks", options.gemm_blocks,
               "Only the cost of the GEMM's thread-count-invariant blocks against one threaded OpenBLAS call, at the "
               "model's shapes, at 1 and 2 threads");
  app.add_flag("--small-gemm", options.small_gemm,
               "Only the small-group expert GEMM kernels against OpenBLAS, one expert per call with the weights "
               "coming from memory, at 1 and 2 threads");
  return moe::bench::parse_and_run(app, argc, argv, "bench_moe", [&] { moe::bench::run(options); });
}
