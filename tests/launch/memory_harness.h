// What the memory tests share: a small config, and the bytes a trainer built from it really allocates.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/backend/backend.h"
#include "launch/config/config.h"
#include "launch/config/memory.h"
#include "launch/train/train_setup.h"
#include "parallel/communicator.h"

namespace moe::test_support {

// A model that trains on one core in a moment: d_model 64, 2 layers, micro-batches of 4 sequences of 32.
inline Config small_config(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> overrides = {"model.d_model=64",     "model.layers=2",   "model.heads=4",
                                        "model.ffn_hidden=96",  "train.seq_len=32", "train.micro_batch=4",
                                        "train.global_batch=8", "train.threads=1",  "moe.expert_hidden=48"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  Config config = config_from_json(nlohmann::json::object(), overrides, "test");
  config.parallel.dp = 1;
  return config;
}

// What the estimate says the trainer allocates with its model and optimizer, before any forward.
inline int64_t allocated_at_construction(const MemoryEstimate& e) {
  return e.parameters + e.gradients + e.optimizer + e.activations + e.scratch;
}

struct Measured {
  int64_t parameters = 0;   // elements in the model's table
  int64_t constructed = 0;  // backend bytes once the trainer is built
  int64_t peak = 0;         // the backend's peak after one micro-batch's forward and backward
};

// Builds the trainer as `moe train` does on one rank, then runs one micro-batch forward and backward
// through its model (MoE layers size their routed-row buffers there).
// world: one rank (a SelfCommunicator), or the tensor-parallel, pipeline or data-parallel ranks (dp: what tp and
// pp leave of the world, its experts over config.parallel.ep). On a pipeline stage only `constructed` is measured.
// fused_attention: the CPU backend's fused attention turned on, which MhaAttention then uses as it uses cuDNN's.
inline Measured measure(const Config& config, std::unique_ptr<Communicator> world, bool fused_attention = false) {
  const std::unique_ptr<Backend> backend = make_cpu_backend(1);
  backend->ops<float>().set_fused_attention(fused_attention);
  const int64_t ranks = world->size();
  const int64_t dp = ranks / (config.parallel.tp * config.parallel.pp);
  const RankGrid grid(
      {ranks, config.parallel.tp, config.parallel.pp, dp, config.parallel.ep, config.parallel.expert_tp},
      config.moe.num_experts);
  const data::Corpus corpus = load_training_corpus(config);
  TrainPaths paths;
  paths.run_dir = "unused";  // the trainer's construction writes nothing
  Trainer t(CheckedConfig{config, grid}, paths, corpus, std::move(world), *backend);
  Measured m;
  m.parameters = t.model->num_params();
  m.constructed = backend->allocated_bytes();
  if (config.parallel.pp > 1) return m;
  const int64_t B = config.train.micro_batch, T = config.train.seq_len;
  std::vector<int32_t> tokens(size_t(B * (T + 1)));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 131 + 17) % size_t(config.model.vocab));
  t.model->zero_grads();
  t.model->set_context(true, 0, 0, 1.0, config.train.seed);
  t.model->forward(0, tokens.data(), B);
  t.model->backward(0, 1.0 / double(B * T));
  m.peak = backend->peak_bytes();
  return m;
}

}  // namespace moe::test_support
