// What the multi-rank trainer tests share (test_parallel_equivalence, test_checkpoint_resume,
// test_four_dimensions): training a config in process on the first N ranks of the MPI world, and comparing two
// runs bit for bit, within the fp32 reduction-order tolerance of another layout, or within that of a resume
// at another layout.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/train/trainer.h"
#include "parallel/mpi_communicator.h"
#include "parallel/self_communicator.h"
#include "run_compare.h"

namespace moe::test_support {

struct RunOutput {
  std::vector<json> lines;     // metrics.jsonl without the timing fields
  std::vector<json> training;  // its training lines (with lm_loss)
  std::vector<json> evals;     // its evaluation lines (with eval_loss)
  TrainResult result;          // with every parameter, gathered
};

// Trains configs/tiny_moe.json with `overrides` on the first `ranks` ranks of the world (on rank 0 alone,
// with a SelfCommunicator, when ranks = 1); rank 0 reads the metrics, the other ranks return an empty
// RunOutput. Collective over the world. The run resumes from `dir`'s newest checkpoint if it has one;
// stop_after > 0 stops after that step (TrainOptions::stop_after_step).
inline RunOutput train_on(int ranks, const std::vector<std::string>& overrides, const std::string& dir,
                          int64_t stop_after = 0) {
  auto world = MpiCommunicator::world();
  std::unique_ptr<Communicator> comm;
  if (ranks == 1) {
    if (world->rank() == 0) comm = std::make_unique<SelfCommunicator>("world");
  } else {
    comm = world->split(world->rank() < ranks ? 0 : -1, world->rank(), "world");
  }
  RunOutput run;
  if (comm) {
    TrainOptions o;
    o.config_path = std::string(MOE_SOURCE_DIR) + "/configs/tiny_moe.json";
    o.overrides = overrides;
    o.run_dir = dir;
    o.quiet = true;
    o.collect_parameters = true;
    o.stop_after_step = stop_after;
    const bool leader = comm->rank() == 0;
    run.result = run_train(o, std::move(comm));
    std::ifstream in(std::filesystem::path(dir) / "metrics.jsonl");
    for (std::string line; leader && std::getline(in, line);) {
      const json j = without_timing(json::parse(line));
      run.lines.push_back(j);
      if (j.contains("lm_loss")) run.training.push_back(j);
      if (j.contains("eval_loss")) run.evals.push_back(j);
    }
  }
  world->barrier();
  return run;
}

// While it lives, `moe train` in this process trains on the memory-checking backend (MOE_CHECK_DEVICE_MEMORY=1,
// docs/gpu.md "Training on several GPUs").
struct DeviceMemoryCheck {
  DeviceMemoryCheck() { ::setenv("MOE_CHECK_DEVICE_MEMORY", "1", 1); }
  ~DeviceMemoryCheck() { ::unsetenv("MOE_CHECK_DEVICE_MEMORY"); }
  DeviceMemoryCheck(const DeviceMemoryCheck&) = delete;
  DeviceMemoryCheck& operator=(const DeviceMemoryCheck&) = delete;
};

// The small MoE model the layout, resume and overlap tests train: 2 layers (one dense, one MoE), 4 experts
// top-2, one sequence of 16 tokens per micro-batch, one thread, logged every step. Each test adds its steps,
// batch, evaluation and what it varies.
inline std::vector<std::string> small_moe_overrides() {
  return {"train.log_every=1",    "train.eval_sequences=2",  "train.seq_len=16", "train.micro_batch=1",
          "train.threads=1",      "model.d_model=32",        "model.layers=2",   "model.heads=2",
          "model.ffn_hidden=48",  "moe.num_experts=4",       "moe.top_k=2",      "moe.every=2",
          "moe.expert_hidden=32", "moe.router.noise=gumbel", "optim.lr=1e-3",    "optim.warmup=2"};
}

// The small model with `extra` appended.
inline std::vector<std::string> small_moe_overrides(const std::vector<std::string>& extra) {
  std::vector<std::string> o = small_moe_overrides();
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

// A directory under the temporary directory named the same on every rank (rank 0's process id).
inline std::filesystem::path shared_temp_root(const std::string& prefix, const std::string& name) {
  int64_t id = ::getpid();
  MpiCommunicator::world()->broadcast(&id, 1, 0);
  return std::filesystem::temp_directory_path() / (prefix + std::to_string(id)) / name;
}

// sqrt(sum (p - q)^2 / sum p^2) over one tensor.
inline double relative_difference(const std::vector<float>& p, const std::vector<float>& q) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < p.size(); ++i) diff += double(p[i] - q[i]) * (p[i] - q[i]), norm += double(p[i]) * p[i];
  return std::sqrt(diff / norm);
}

// Every metrics line and every parameter the same bits.
inline void expect_bitwise_equal(const RunOutput& a, const RunOutput& b, const std::string& what) {
  ASSERT_FALSE(a.training.empty()) << what << ": no training lines read";
  ASSERT_EQ(a.lines.size(), b.lines.size()) << what;
  for (size_t i = 0; i < a.lines.size(); ++i)
    EXPECT_EQ(first_difference(a.lines[i], b.lines[i]), "") << what << " metrics line " << i + 1;
  ASSERT_EQ(a.result.parameters.size(), b.result.parameters.size()) << what;
  for (const auto& [name, p] : a.result.parameters) {
    const auto& q = b.result.parameters.at(name);
    ASSERT_EQ(p.size(), q.size()) << what << " " << name;
    EXPECT_EQ(0, std::memcmp(p.data(), q.data(), sizeof(float) * p.size())) << what << " " << name;
  }
}

// Tolerances from fp32 reduction order. A layout changes only the order of sums: gradients of up to 8
// micro-batches and 8 ranks, router statistics over the same, and, where it changes a GEMM's shape (tp splits
// hidden widths, pp and ep change row counts), the order inside the BLAS's reductions over a micro-batch's
// tokens (its blocking and small-matrix kernels follow the shape and the CPU). A reordered sum of L terms differs
// by about sqrt(L) * 6e-8 (fp32 unit roundoff) relative: 2e-7 for 8 terms, 2.7e-6 for 2,048 tokens. Adam's update
// is a smooth function of the gradient away from zero, so ten steps keep the losses near 1e-8 and the parameters
// near 1e-6 relative (measured on an AMD EPYC Zen 3 host: losses 2e-9, parameters 1.2e-6 at pp2_tp2 and
// 1.0e-6 at tp2, under 5e-7 at layouts that keep every GEMM's shape), hence 1e-5 for the parameters. A real
// mistake (a lost micro-batch, a wrong scale, an expert's gradient reduced over the wrong group) shows at 1e-3
// and above.
constexpr double kLayoutLossTolerance = 1e-6;
constexpr double kLayoutParamTolerance = 1e-5;
// Evaluation scores the final parameters, which differ by the reordering above; under capacity dropping a
// held-out token near a routing tie may then change expert, moving the loss by a few 1e-6 relative
// (measured 6.5e-6 on tp2_dp2_ep2 and 3.6e-6 on pp2_dp2). A lost window or a wrong stage shows at 1e-2.
constexpr double kLayoutEvalTolerance = 1e-4;

// `parallel` trained the same config as `serial` at another layout: losses, norms and parameters within
// the tolerances above, every MoE layer's routing counts identical every step.
inline void expect_equivalent(const RunOutput& serial, const RunOutput& parallel, const std::string& what) {
  ASSERT_FALSE(serial.training.empty()) << what << ": no training lines read";
  ASSERT_EQ(serial.training.size(), parallel.training.size()) << what;
  for (size_t i = 0; i < serial.training.size(); ++i) {
    const json &a = serial.training[i], &b = parallel.training[i];
    for (const char* field : {"lm_loss", "aux_loss", "z_loss", "grad_norm"}) {
      const double x = a[field], y = b[field];
      EXPECT_NEAR(y, x, kLayoutLossTolerance * std::max(1.0, std::abs(x)))
          << what << " step " << a["step"] << " " << field;
    }
    for (size_t l = 0; l < a["moe"].size(); ++l)
      for (const char* field : {"tokens_per_expert", "dropped", "rerouted", "fallback"})
        EXPECT_EQ(a["moe"][l].value(field, json()), b["moe"][l].value(field, json()))
            << what << " step " << a["step"] << " layer " << l << " " << field;
  }
  ASSERT_EQ(serial.evals.size(), parallel.evals.size()) << what;
  for (size_t i = 0; i < serial.evals.size(); ++i) {
    const double x = serial.evals[i]["eval_loss"], y = parallel.evals[i]["eval_loss"];
    EXPECT_NEAR(y, x, kLayoutEvalTolerance * std::max(1.0, std::abs(x))) << what << " eval " << serial.evals[i]["step"];
  }
  ASSERT_EQ(serial.result.parameters.size(), parallel.result.parameters.size()) << what;
  for (const auto& [name, p] : serial.result.parameters) {
    const std::vector<float>& q = parallel.result.parameters.at(name);
    ASSERT_EQ(p.size(), q.size()) << what << " " << name;
    EXPECT_LE(relative_difference(p, q), kLayoutParamTolerance) << what << " " << name;
  }
}

// A run resumed at another layout against the uninterrupted one: each step's gradient sums up to 8
// micro-batch terms in another order and, where the layout changes a GEMM's shape (tp), its reductions over a
// micro-batch's 2,048 tokens in another order, sqrt(2048) * 6e-8 relative; Adam carries that into the
// parameters about linearly over `steps` steps (measured on an AMD EPYC Zen 3 host: 5.2e-6 for the parameters
// after 20 steps across tp layouts, 2.3e-6 across dp and ep; a wrong slice or a lost optimizer state shows
// above 1e-3).
inline void expect_close(const RunOutput& a, const RunOutput& b, const std::string& what, int64_t steps = 20) {
  const double tolerance = double(steps) * std::sqrt(2048.0) * 6e-8;
  ASSERT_FALSE(a.training.empty()) << what << ": no training lines read";
  ASSERT_EQ(a.training.size(), b.training.size()) << what;
  for (size_t i = 0; i < a.training.size(); ++i) {
    const double x = a.training[i]["lm_loss"], y = b.training[i]["lm_loss"];
    EXPECT_NEAR(y, x, tolerance * std::abs(x)) << what << " step " << a.training[i]["step"];
  }
  for (const auto& [name, p] : a.result.parameters)
    EXPECT_LE(relative_difference(p, b.result.parameters.at(name)), tolerance) << what << " " << name;
}

}  // namespace moe::test_support
