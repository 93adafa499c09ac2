// A sweep's results (docs/sweep.md "sweep.json and sweep.csv"): each cell's figures read from its run
// directory (metrics.jsonl, config.json, manifest.json) and its status file, the mean and standard deviation of each
// over the seeds of a grid point, written as OUT/sweep.json and OUT/sweep.csv. Reads only what a run writes, so it
// works while cells are still running. Not here: planning or running cells (launch/sweep/sweep.h).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/sweep/sweep.h"

namespace moe {

// One run directory's figures: eval_loss, eval_loss_by_source, and over the training lines of the second
// half of the run (step > train.steps / 2) the means of dropped_share, rerouted_share, fallback_share,
// overflow_ratio, entropy, cv, load_max_over_mean and tokens_per_s; dead_experts and steps_done of the last
// line; memory_estimate_bytes from manifest.json. Fields without data are absent.
nlohmann::json run_figures(const std::string& run_dir, int64_t steps);

// The numeric figures averaged per grid point: {"mean": {...}, "std": {...}, "n": seeds done}. The standard
// deviation is the sample one (n - 1), 0 for one seed.
nlohmann::json average_figures(const std::vector<nlohmann::json>& figures);

// The steps a cell trains: its --grid train.steps, else the base config's.
int64_t cell_steps(const SweepPlan& plan, const SweepCell& cell);
// Why a cell's results cannot be trusted, or "" when they are complete: its config.json holds its point and
// seed, and its metrics.jsonl (a regular file) has the training line of its last step. A cell whose status
// says done is accepted only when this is "".
std::string cell_results_problem(const std::string& out, const SweepPlan& plan, const SweepCell& cell);

// sweep.json and sweep.csv in `out`, each written under a new temporary name and renamed into place
// (launch/run/run_files.h). Only regular files are read.
void write_sweep_results(const std::string& out, const SweepPlan& plan);

}  // namespace moe
