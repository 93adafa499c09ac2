// The plan of a sweep and its command line (launch/sweep/sweep.h); running the cells is launch/sweep/sweep_run.cpp.
#include "launch/sweep/sweep.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "data/corpus.h"
#include "launch/config/config.h"
#include "launch/config/config_schema.h"
#include "launch/supervise/supervisor.h"
#include "launch/train/train_setup.h"

namespace moe {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr size_t kMaxCells = size_t(kMaxSweepCells);

std::vector<std::string> split_values(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    out.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

// A value as --set reads it: JSON when it parses, else the text as a string.
json parse_value(const std::string& text) {
  try {
    return json::parse(text);
  } catch (const std::exception&) {
    return json(text);
  }
}

// A file-name-safe form of a value as written: letters, digits and . _ + - kept, anything else '_'.
std::string safe_name(const std::string& text) {
  std::string out;
  for (const char c : text) out += (std::isalnum(static_cast<unsigned char>(c)) || std::strchr("._+-", c)) ? c : '_';
  return out.substr(0, 40);
}

// A key's short label in cell names: its last component, or the whole key when two axes share it.
std::vector<std::string> axis_labels(const std::vector<GridAxis>& axes) {
  std::vector<std::string> labels;
  for (const GridAxis& a : axes) labels.push_back(a.key.substr(a.key.rfind('.') + 1));
  for (size_t i = 0; i < labels.size(); ++i)
    for (size_t j = 0; j < labels.size(); ++j)
      if (i != j && labels[i] == labels[j]) labels[i] = axes[i].key;
  return labels;
}

// Data paths relative to where the sweep runs, made absolute: the cells read them from OUT/base_config.json,
// and a rerun from another directory reads the same files.
void absolute_data_paths(json& base) {
  for (json& source : base["data"]["sources"]) {
    const fs::path path = source["path"].get<std::string>();
    if (path.is_relative()) source["path"] = fs::absolute(path).lexically_normal().string();
  }
}

// The number of cells, checked against kMaxCells axis by axis, so that the product never overflows.
size_t count_cells(const std::vector<GridAxis>& axes, int64_t seeds) {
  size_t cells = size_t(seeds);
  std::string shape = std::to_string(seeds) + " seed(s)";
  for (const GridAxis& a : axes) {
    cells *= a.values.size();
    shape = std::to_string(a.values.size()) + " value(s) of " + a.key + " x " + shape;
    if (cells > kMaxCells)
      MOE_BAD_INPUT("--grid, --seeds: " << shape << " make more than " << kMaxCells << " cells; at most " << kMaxCells
                                        << " are allowed (split the sweep)");
  }
  return cells;
}

void add_cells(SweepPlan& plan) {
  const std::vector<std::string> labels = axis_labels(plan.axes);
  size_t points = 1;
  for (const GridAxis& a : plan.axes) points *= a.values.size();
  plan.cells.reserve(points * plan.seeds.size());
  for (size_t p = 0; p < points; ++p) {
    // The first axis varies slowest.
    std::vector<size_t> at(plan.axes.size());
    for (size_t rest = p, i = plan.axes.size(); i-- > 0;)
      at[i] = rest % plan.axes[i].values.size(), rest /= plan.axes[i].values.size();
    for (const int64_t seed : plan.seeds) {
      SweepCell cell;
      cell.seed = seed;
      char index[16];
      std::snprintf(index, sizeof index, "%03zu", plan.cells.size());
      cell.name = index;
      cell.params = json::object();
      for (size_t i = 0; i < plan.axes.size(); ++i) {
        const GridAxis& a = plan.axes[i];
        cell.params[a.key] = a.values[at[i]];
        cell.name += "-" + labels[i] + "=" + safe_name(a.texts[at[i]]);
        cell.overrides.push_back(a.key + "=" + a.values[at[i]].dump());
      }
      cell.name += "-seed" + std::to_string(seed);
      cell.overrides.push_back("train.seed=" + std::to_string(seed));
      plan.cells.push_back(std::move(cell));
    }
  }
}

// Each cell's config loaded as its moe launch will load it, and its layout checked for --np.
void check_cells(const SweepPlan& plan) {
  for (const SweepCell& cell : plan.cells) {
    try {
      const Config config =
          config_from_json(plan.base, cell.overrides, "the base config with --grid " + cell.params.dump());
      check_launch_layout(config, plan.np);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::BadInput) throw;
      MOE_BAD_INPUT("cell " << cell.name << " (" << cell.params.dump() << ", seed " << cell.seed
                            << ") cannot run: " << e.message());
    }
  }
}

// The content identity of the data every cell trains on: one data_provenance per distinct data section (a
// --grid over data.* keys gives several), read from the files themselves as `moe train` reads them.
json data_identity(const SweepPlan& plan) {
  json out = json::array();
  std::set<std::string> seen;
  for (const SweepCell& cell : plan.cells) {
    const Config config = config_from_json(plan.base, cell.overrides, "the base config with --grid");
    if (!seen.insert(config.resolved["data"].dump()).second) continue;
    out.push_back(data::data_provenance(load_training_corpus(config)));
  }
  return out;
}

}  // namespace

json SweepPlan::identity() const {
  json grid = json::array();
  for (const GridAxis& a : axes) grid.push_back({{"key", a.key}, {"values", a.values}});
  return {{"base", base}, {"grid", grid}, {"seeds", seeds}, {"np", np}, {"data", data}};
}

GridAxis parse_grid_axis(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    MOE_BAD_INPUT("--grid " << text << ": expected KEY=V1,V2,... (a config key, '=', values separated by commas)");
  GridAxis axis;
  axis.key = text.substr(0, eq);
  const config_schema::KeySpec* spec = config_schema::find_key(axis.key);
  if (!spec) {
    const std::string near = config_schema::nearest_key(axis.key);
    MOE_BAD_INPUT("--grid " << text << ": '" << axis.key << "' is not a config key"
                            << (near.empty() ? "" : "; did you mean '" + near + "'?") << " (docs/config.md)");
  }
  const std::string list = text.substr(eq + 1);
  if (size_t(std::count(list.begin(), list.end(), ',')) >= kMaxCells)
    MOE_BAD_INPUT("--grid " << axis.key << ": more than " << kMaxCells << " values; at most " << kMaxCells
                            << " cells are allowed");
  for (const std::string& value : split_values(list)) {
    if (value.empty())
      MOE_BAD_INPUT("--grid " << text << ": an empty value; expected " << config_schema::describe_expected(*spec)
                              << " for each value, separated by commas");
    // Canonical: the value as the schema reads it (a number by value, an integer as an integer).
    const json canonical = config_schema::check_value(*spec, parse_value(value), "--grid " + text);
    for (size_t i = 0; i < axis.values.size(); ++i)
      if (axis.values[i] == canonical)
        MOE_BAD_INPUT("--grid " << axis.key << ": the values " << axis.texts[i] << " and " << value << " are equal ("
                                << canonical.dump() << "); list each value once");
    axis.values.push_back(canonical);
    axis.texts.push_back(value);
  }
  return axis;
}

SweepPlan make_sweep_plan(const SweepOptions& o) {
  if (o.grids.empty()) MOE_BAD_INPUT("moe sweep: at least one --grid KEY=V1,V2,... is needed");
  if (o.seeds < 1) MOE_BAD_INPUT("--seeds: expected a whole number >= 1, got " << o.seeds);
  if (o.seeds > kMaxSweepCells)
    MOE_BAD_INPUT("--seeds " << o.seeds << ": at most " << kMaxSweepCells << " (the most cells a sweep may have)");
  if (o.np < 1) MOE_BAD_INPUT("--np: expected a whole number of ranks >= 1, got " << o.np);
  if (o.concurrent < 1) MOE_BAD_INPUT("--concurrent: expected a whole number >= 1, got " << o.concurrent);
  SweepPlan plan;
  plan.np = o.np;
  plan.base = load_config(o.config_path, o.overrides).resolved;
  absolute_data_paths(plan.base);
  std::set<std::string> keys;
  for (const std::string& text : o.grids) {
    plan.axes.push_back(parse_grid_axis(text));
    if (!keys.insert(plan.axes.back().key).second)
      MOE_BAD_INPUT("--grid " << text << ": the key " << plan.axes.back().key << " has another --grid already");
  }
  if (keys.count("train.seed") && o.seeds > 1)
    MOE_BAD_INPUT("--grid train.seed=... and --seeds " << o.seeds << " both choose seeds; use one of them");
  count_cells(plan.axes, o.seeds);
  const int64_t first_seed = plan.base["train"]["seed"].get<int64_t>();
  int64_t last_seed = 0;
  if (__builtin_add_overflow(first_seed, o.seeds - 1, &last_seed))
    MOE_BAD_INPUT("--seeds " << o.seeds << ": train.seed " << first_seed << " + " << o.seeds - 1
                             << " is past the largest seed");
  config_schema::check_value(*config_schema::find_key("train.seed"), last_seed,
                             "--seeds " + std::to_string(o.seeds) + " (its last seed)");
  for (int64_t s = 0; s < o.seeds; ++s) plan.seeds.push_back(first_seed + s);
  add_cells(plan);
  if (keys.count("train.seed"))  // the axis chooses the seed: drop the default one
    for (SweepCell& cell : plan.cells) {
      cell.overrides.pop_back();
      cell.seed = cell.params["train.seed"].get<int64_t>();
    }
  check_cells(plan);
  plan.data = data_identity(plan);
  return plan;
}

CLI::App* add_sweep_command(CLI::App& app, SweepOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "sweep",
      "Ablations: the cross product of --grid axes times --seeds seeds, each cell a run under moe launch; "
      "resumable; sweep.json and sweep.csv at the end (docs/sweep.md).");
  cmd->add_option("--config", o.config_path, "Base experiment config (JSON)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--set", o.overrides, "Override a key of the base config (repeatable), as for moe train");
  cmd->add_option("--grid", o.grids,
                  "An axis: KEY=V1,V2,... (any config key; values as for --set; repeatable, cross product)")
      ->required();
  cmd->add_option("--seeds", o.seeds, "Seeds per grid point: train.seed, train.seed + 1, ... (default 1)")
      ->default_val(1);
  cmd->add_option("--np", o.np, "Ranks per cell (moe launch --np; > 1 adds mpirun's oversubscribe flags)")
      ->default_val(1);
  cmd->add_option("--concurrent", o.concurrent, "Cells run at the same time (default 1)")->default_val(1);
  cmd->add_option("--mpirun-arg", o.mpirun_args, "An extra argument for mpirun (repeatable), as for moe launch");
  cmd->add_option("--out", o.out, "The sweep's directory (created; a rerun continues it)")->required();
  cmd->add_flag("--quiet", o.quiet, "Only the sweep's own progress lines");
  cmd->add_flag("--allow-data-change", o.allow_data_change,
                "Continue a sweep although its data changed (content hash of a source or tokenizer); its cells' "
                "launches get --allow-data-change too");
  return cmd;
}

}  // namespace moe
