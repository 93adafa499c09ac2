// `moe sweep`: ablations as one command (docs/sweep.md). The cross product of --grid axes (any config keys)
// times --seeds seeds, each cell a run directory trained by `moe launch` (so faults are handled), up to
// --concurrent at a time; resumable (a finished cell is kept, a cell cut short resumes from its checkpoint);
// a failed cell is recorded and the sweep goes on. At the end (and after every cell) sweep.json and sweep.csv.
// Every refusal (a grid key or value, the layout, --out) comes before any cell runs or anything is written.
// Not here: reading a cell's results and the summaries (launch/sweep/sweep_results.h).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace moe {

struct SweepOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set, applied to the base config
  std::vector<std::string> grids;      // "KEY=V1,V2,..."
  int64_t seeds = 1;
  int64_t np = 1;
  int64_t concurrent = 1;
  std::string out;
  std::vector<std::string> mpirun_args;
  bool quiet = false;
  bool allow_data_change = false;  // continue a sweep whose data changed (and pass it to the cells' launches)
};

CLI::App* add_sweep_command(CLI::App& app, SweepOptions& options);

// The most cells a sweep may have; --seeds, each axis's values and their product are checked against it
// before anything is allocated for them.
constexpr int64_t kMaxSweepCells = 10000;

// One axis of the grid: a config key and its values (canonical: as the config schema reads them, so 0.5,
// 0.50 and 5e-1 are one value, and a value listed twice is refused), and as the user wrote them.
struct GridAxis {
  std::string key;
  std::vector<nlohmann::json> values;
  std::vector<std::string> texts;
};
// One cell: a point of the grid and a seed.
struct SweepCell {
  std::string name;       // its run directory's name under OUT/cells
  nlohmann::json params;  // key to value, in axis order
  int64_t seed = 0;
  std::vector<std::string> overrides;  // the --set arguments of its moe launch
};
struct SweepPlan {
  nlohmann::json base;  // the resolved base config
  std::vector<GridAxis> axes;
  std::vector<int64_t> seeds;
  std::vector<SweepCell> cells;
  int64_t np = 1;
  // The content identity of the cells' data: data::data_provenance (per source the xxh64 of its text or
  // prepared manifest and of its tokenizer), one entry per distinct data section among the cells.
  nlohmann::json data = nlohmann::json::array();
  // What a rerun must match to continue this sweep's directory ("base", "grid", "seeds", "np", "data").
  nlohmann::json identity() const;
};

// "KEY=V1,V2,...": the key a config key, each value checked against it. BadInput naming the key or value.
GridAxis parse_grid_axis(const std::string& text);
// The plan: every cell's config loaded and checked (and its layout for options.np). BadInput otherwise.
SweepPlan make_sweep_plan(const SweepOptions& options);

// 0 every cell finished; 1 some cell failed (recorded in sweep.json); 2 bad input (nothing run or written);
// 128 + N stopped by signal N (the running cells are stopped cleanly and resume on the next run).
int run_sweep(const SweepOptions& options);

}  // namespace moe
