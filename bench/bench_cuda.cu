// bench_cuda: the CUDA backend's GEMMs against the GPU's measured peak, in the same run:
//   1. the peak: cuBLAS bf16 (fp32 accumulation) and fp32 GEMMs of 8192^3 (the ceilings MFU is quoted against);
//   2. the backend's gemm op on a Mixtral-sized projection (tokens x 4096 x 14336), in fp32 and with bf16 GEMMs
//      (GemmPrecision::Bf16: fp32 storage, operands rounded to bf16 per call, tensor cores);
//   3. the backend's grouped expert GEMM (8 experts, top-2, Mixtral's expert width) against one dense GEMM of
//      the same FLOPs through the same op, at both precisions: what grouping the experts costs.
// Medians of --reps timed calls after one untimed call, timed with CUDA events. Prints a table and one line
// of JSON. Without a device it says so and exits 0 (the ctest smoke check runs it everywhere).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "bench/bench_main.h"
#include "core/backend/cuda/cuda_check.h"
#include "core/backend/cuda_backend.h"
#include "core/error.h"

namespace moe::bench {
namespace {

struct Options {
  int64_t peak_size = 8192, tokens = 8192, d_model = 4096, expert_hidden = 14336, experts = 8, top_k = 2;
  int64_t seq_len = 4096, heads = 32, head_dim = 128;  // Mixtral's attention, one sequence
  int reps = 10;
  bool quick = false;
};

// Median seconds of `reps` calls of f, after one untimed call, by CUDA events on the default stream and a
// full device synchronisation around each (the backend's work is on its own stream).
double median_seconds(int reps, const std::function<void()>& f) {
  f();
  cudaDeviceSynchronize();
  std::vector<double> t;
  cudaEvent_t start, stop;
  cudaEventCreate(&start), cudaEventCreate(&stop);
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(start);
    f();
    cudaDeviceSynchronize();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    t.push_back(double(ms) * 1e-3);
  }
  cudaEventDestroy(start), cudaEventDestroy(stop);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// n values at `device` drawn from N(0, 1) (a tile of 2^20 host-drawn values, repeated), in bf16 or fp32: GEMMs
// on zeros or constants time optimistically (an H200 ran 894 TFLOP/s on zeros, 788 on random data). Everything
// queued before is waited for (a backend zero-fills its buffers on its own stream), and so is the fill.
void fill_random(void* device, int64_t n, bool bf16) {
  MOE_CUDA_CHECK(cudaDeviceSynchronize());  // what was queued before the fill
  std::mt19937_64 gen(20261204);
  std::normal_distribution<float> normal;
  const int64_t tile = std::min<int64_t>(n, int64_t(1) << 20), bytes = bf16 ? 2 : 4;
  std::vector<float> f32(static_cast<size_t>(tile));
  for (float& x : f32) x = normal(gen);
  std::vector<__nv_bfloat16> b16(f32.begin(), f32.end());
  const void* host = bf16 ? static_cast<const void*>(b16.data()) : static_cast<const void*>(f32.data());
  for (int64_t at = 0; at < n; at += tile)
    MOE_CUDA_CHECK(cudaMemcpy(static_cast<char*>(device) + at * bytes, host, size_t(std::min(tile, n - at) * bytes),
                              cudaMemcpyHostToDevice));
  MOE_CUDA_CHECK(cudaDeviceSynchronize());
}

// cuBLAS GEMM of n^3 in `type` (bf16 or fp32 storage, fp32 accumulation): FLOP/s.
double cublas_peak(int64_t n, cudaDataType_t type, int reps) {
  const size_t bytes = size_t(n * n) * (type == CUDA_R_16BF ? 2 : 4);
  void *a = nullptr, *b = nullptr, *c = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess ||
      cudaMalloc(&c, bytes) != cudaSuccess)
    MOE_RUN_FAILED("cannot allocate three " << n << "^2 matrices");
  fill_random(a, n * n, type == CUDA_R_16BF), fill_random(b, n * n, type == CUDA_R_16BF);
  cublasHandle_t h;
  MOE_CUBLAS_CHECK(cublasCreate(&h));
  const float alpha = 1, beta = 0;
  const int m = int(n);
  // A refused call would time as nothing and give a huge peak (and so a tiny MFU): it fails the benchmark.
  const double s = median_seconds(reps, [&] {
    MOE_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &alpha, a, type, m, b, type, m, &beta, c, type,
                                  m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
  cublasDestroy(h);
  cudaFree(a), cudaFree(b), cudaFree(c);
  return 2.0 * double(n) * double(n) * double(n) / s;
}

struct OpFigures {
  double dense_flops_s = 0, grouped_flops_s = 0, projection_flops_s = 0;
};

// Through the backend's ops at `precision` (fp32, or bf16 GEMMs of fp32 storage as train.precision = bf16 runs
// them, the operands' rounding included): one projection, the experts' first GEMM grouped, and a dense GEMM of
// the grouped one's FLOPs. The operands are random, and the weights are the parameters' memory, so that in bf16 the
// grouped call reads their rounded copy as training does, instead of rounding the whole stack on every call.
OpFigures backend_gemms(const Options& o, GemmPrecision precision) {
  const std::unique_ptr<Backend> b = make_cuda_backend(0);
  Ops<float>& ops = b->ops<float>();
  const int64_t N = o.tokens, D = o.d_model, F = o.expert_hidden, E = o.experts, rows = N * o.top_k;
  Buffer x = b->allocate(DType::F32, rows * D), w = b->allocate(DType::F32, E * D * F),
         y = b->allocate(DType::F32, rows * F);
  fill_random(x.data<float>(), rows * D, false), fill_random(w.data<float>(), E * D * F, false);
  ops.set_parameter_memory(w.data<float>(), E * D * F);
  OpFigures f;
  const double proj = median_seconds(o.reps, [&] {
    ops.gemm({.M = N,
              .N = F,
              .K = D,
              .A = x.data<float>(),
              .lda = D,
              .B = w.data<float>(),
              .ldb = F,
              .C = y.data<float>(),
              .ldc = F,
              .precision = precision,
              .weight = GemmWeight::B});
  });
  f.projection_flops_s = 2.0 * double(N) * double(F) * double(D) / proj;
  std::vector<int64_t> offsets(size_t(E) + 1);
  for (int64_t e = 0; e <= E; ++e) offsets[size_t(e)] = rows * e / E;  // balanced routing
  const double grouped = median_seconds(o.reps, [&] {
    ops.grouped_gemm({.groups = E,
                      .row_offset = offsets.data(),
                      .N = F,
                      .K = D,
                      .A = x.data<float>(),
                      .B = w.data<float>(),
                      .C = y.data<float>(),
                      .precision = precision,
                      .weight = GemmWeight::B});
  });
  const double flops = 2.0 * double(rows) * double(F) * double(D);
  f.grouped_flops_s = flops / grouped;
  const double dense = median_seconds(o.reps, [&] {
    ops.gemm({.M = rows,
              .N = F,
              .K = D,
              .A = x.data<float>(),
              .lda = D,
              .B = w.data<float>(),
              .ldb = F,
              .C = y.data<float>(),
              .ldc = F,
              .precision = precision,
              .weight = GemmWeight::B});
  });
  f.dense_flops_s = flops / dense;
  return f;
}

// Causal attention forward and backward of one sequence with bf16 GEMMs (train.precision = bf16): the plain form
// (per-head cuBLAS GEMMs, the (H, T, T) probabilities in fp32) and, where cuDNN takes the shape, the fused one.
// Seconds of forward + backward each (fused: 0 when cuDNN refused).
struct AttentionFigures {
  double plain_s = 0, fused_s = 0;
};
AttentionFigures attention_seconds(const Options& o) {
  const std::unique_ptr<Backend> b = make_cuda_backend(0);
  Ops<float>& ops = b->ops<float>();
  const int64_t B = 1, T = o.seq_len, H = o.heads, Dh = o.head_dim, n = B * T * H * Dh;
  Buffer q = b->allocate(DType::F32, n), k = b->allocate(DType::F32, n), v = b->allocate(DType::F32, n),
         out = b->allocate(DType::F32, n), dout = b->allocate(DType::F32, n), dq = b->allocate(DType::F32, n),
         dk = b->allocate(DType::F32, n), dv = b->allocate(DType::F32, n);
  for (Buffer* x : {&q, &k, &v, &dout}) ops.fill(x->data<float>(), 0.01f, n);
  AttentionFigures f;
  {
    Buffer probs = b->allocate(DType::F32, B * H * T * T), scratch = b->allocate(DType::F32, T * T);
    f.plain_s = median_seconds(o.reps, [&] {
      ops.attention_forward({.shape = {B, T, H, Dh, GemmPrecision::Bf16},
                             .q = q.data<float>(),
                             .k = k.data<float>(),
                             .v = v.data<float>(),
                             .out = out.data<float>(),
                             .probs = probs.data<float>()});
      ops.attention_backward({.shape = {B, T, H, Dh, GemmPrecision::Bf16},
                              .q = q.data<float>(),
                              .k = k.data<float>(),
                              .v = v.data<float>(),
                              .probs = probs.data<float>(),
                              .dout = dout.data<float>(),
                              .dq = dq.data<float>(),
                              .dk = dk.data<float>(),
                              .dv = dv.data<float>(),
                              .scratch = scratch.data<float>()});
    });
  }
  if (!ops.fused_attention_supported({B, T, H, Dh, GemmPrecision::Bf16})) return f;
  Buffer stats = b->allocate(DType::F32, B * H * T);
  f.fused_s = median_seconds(o.reps, [&] {
    ops.attention_forward_fused({.shape = {B, T, H, Dh, GemmPrecision::Bf16},
                                 .q = q.data<float>(),
                                 .k = k.data<float>(),
                                 .v = v.data<float>(),
                                 .out = out.data<float>(),
                                 .stats = stats.data<float>()});
    ops.attention_backward_fused({.shape = {B, T, H, Dh, GemmPrecision::Bf16},
                                  .q = q.data<float>(),
                                  .k = k.data<float>(),
                                  .v = v.data<float>(),
                                  .out = out.data<float>(),
                                  .stats = stats.data<float>(),
                                  .dout = dout.data<float>(),
                                  .dq = dq.data<float>(),
                                  .dk = dk.data<float>(),
                                  .dv = dv.data<float>()});
  });
  return f;
}

void run(const Options& o) {
  if (!cuda_backend_built() || cuda_device_count() == 0) {
    std::printf("bench_cuda: no CUDA device here (%s); nothing measured\n",
                cuda_backend_built() ? "the backend is built" : "no CUDA backend in this build");
    return;
  }
  const double bf16 = cublas_peak(o.peak_size, CUDA_R_16BF, o.reps),
               fp32 = cublas_peak(o.peak_size, CUDA_R_32F, o.reps);
  std::printf("cuBLAS peak, %lld^3: bf16 %.1f TFLOP/s, fp32 %.1f TFLOP/s\n", (long long)o.peak_size, bf16 / 1e12,
              fp32 / 1e12);
  nlohmann::json j = {{"benchmark", "bench_cuda"}, {"bf16_peak_flops", bf16}, {"fp32_peak_flops", fp32}};
  for (const GemmPrecision precision : {GemmPrecision::Fp32, GemmPrecision::Bf16}) {
    const bool is_bf16 = precision == GemmPrecision::Bf16;
    const char* name = is_bf16 ? "bf16" : "fp32";
    const double peak = is_bf16 ? bf16 : fp32;
    const OpFigures f = backend_gemms(o, precision);
    std::printf("backend %s gemm %lldx%lldx%lld: %.1f TFLOP/s (%.2f of the %s peak)\n", name, (long long)o.tokens,
                (long long)o.expert_hidden, (long long)o.d_model, f.projection_flops_s / 1e12,
                f.projection_flops_s / peak, name);
    std::printf(
        "%s grouped experts (E %lld, top-%lld): %.1f TFLOP/s, %.2f of one dense GEMM of the same FLOPs (%.1f)\n", name,
        (long long)o.experts, (long long)o.top_k, f.grouped_flops_s / 1e12, f.grouped_flops_s / f.dense_flops_s,
        f.dense_flops_s / 1e12);
    // The fp32 keys keep their names of before; the bf16 ones are prefixed.
    const std::string prefix = is_bf16 ? "bf16_" : "";
    j[prefix + "projection_flops"] = f.projection_flops_s;
    j[prefix + "grouped_flops"] = f.grouped_flops_s;
    j[prefix + "dense_same_flops"] = f.dense_flops_s;
    j[prefix + "grouped_over_dense"] = f.grouped_flops_s / f.dense_flops_s;
    j[prefix + "projection_over_peak"] = f.projection_flops_s / peak;
  }
  const AttentionFigures a = attention_seconds(o);
  // The causal products as a flash kernel computes them: forward q k^T and p v over the lower triangle (2 T^2 Dh
  // per head), backward two and a half times that.
  const double attention_flops = 3.5 * 2.0 * double(o.seq_len) * double(o.seq_len) * double(o.head_dim) * o.heads;
  std::printf("attention T %lld H %lld Dh %lld, forward + backward, bf16 GEMMs: plain %.2f ms", (long long)o.seq_len,
              (long long)o.heads, (long long)o.head_dim, a.plain_s * 1e3);
  if (a.fused_s > 0)
    std::printf(", cuDNN fused %.2f ms (%.1f TFLOP/s causal, %.1fx the plain)\n", a.fused_s * 1e3,
                attention_flops / a.fused_s / 1e12, a.plain_s / a.fused_s);
  else
    std::printf("; cuDNN refused the shape (see above)\n");
  j["attention_plain_seconds"] = a.plain_s;
  j["attention_fused_seconds"] = a.fused_s;
  j["attention_fused_flops"] = a.fused_s > 0 ? attention_flops / a.fused_s : 0.0;
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace
}  // namespace moe::bench

int main(int argc, char** argv) {
  moe::bench::Options o;
  CLI::App app{"bench_cuda: the CUDA backend's GEMMs against the GPU's measured cuBLAS peak"};
  app.add_option("--reps", o.reps, "timed calls per figure (the median is reported)")->check(CLI::Range(1, 1000));
  app.add_flag("--quick", o.quick, "small sizes: a smoke check");
  return moe::bench::parse_and_run(app, argc, argv, "bench_cuda", [&] {
    if (o.quick)
      o.peak_size = 1024, o.tokens = 512, o.d_model = 256, o.expert_hidden = 512, o.reps = 2, o.seq_len = 256,
      o.heads = 4;
    moe::bench::run(o);
  });
}
