// What a run reports: metrics.jsonl (opened fresh, or after a resume keeping the lines up to the
// checkpoint's step), the line of a training step with one entry per MoE layer (docs/metrics.md,
// docs/metrics.md), and evaluation on the held-out split of every source.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "launch/run/run_dir.h"
#include "launch/train/train_setup.h"
#include "launch/train/train_step.h"

namespace moe {

// metrics.jsonl of the run directory. A fresh run starts it empty; a resumed one keeps the lines up to
// `start_step` (the lines after it are rewritten by this run; a line cut by a crash is dropped).
std::unique_ptr<MetricsWriter> open_metrics(const std::string& run_dir, bool fresh, int64_t start_step);

// The metrics line of a training step.
struct StepTiming {
  double tokens_per_s = 0, elapsed_s = 0, comm_wait_s = 0, ckpt_stall_s = 0, a2a_wait_s = 0;
  int64_t host_syncs = 0, d2h_bytes = 0;  // rank 0's over the step (Backend::host_traffic)
  int threads = 1;  // rank 0's CPU threads at the end of the step (train.adapt_threads may change them)
};
// moe_stats: every MoE layer's statistics of the step, the whole model's (Trainer::model_stats); top_k: the
// assignments per token (for the overflow ratio).
nlohmann::json step_line(int64_t done, const StepResult& r, const StepTiming& timing, int64_t tokens_so_far,
                         const std::vector<RouterStepStats>& moe_stats, int64_t top_k);

// The data of a logged step (metrics.jsonl "data"): the source weights in force at loader step `step`
// (0-based), normalised to sum to 1, and the share of the step's global_batch sequences each source gave.
nlohmann::json data_metrics(const data::Loader& loader, int64_t step, int64_t global_batch);

struct EvalResult {
  double loss = 0;
  std::vector<std::pair<std::string, double>> by_source;
};
// Mean token loss over the first train.eval_sequences held-out windows of every source. Every rank
// evaluates the same windows: expert-parallel forwards run in lockstep. With pipeline stages each window
// goes through them forward only, the last stage scoring it.
EvalResult evaluate(Trainer& trainer);
nlohmann::json eval_line(int64_t done, const EvalResult& ev);
std::string eval_text(int64_t done, const EvalResult& ev);

}  // namespace moe
