// Reading cells' figures and writing sweep.json and sweep.csv (launch/sweep/sweep_results.h).
#include "launch/sweep/sweep_results.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "launch/run/run_files.h"

namespace moe {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Per training line: the shares of the assignments over all MoE layers, and the layer means.
void add_routing(const json& line, std::map<std::string, std::vector<double>>& series) {
  const json& layers = line.at("moe");
  if (layers.empty()) return;
  double processed = 0, dropped = 0, rerouted = 0, fallback = 0;
  std::map<std::string, double> sums;
  for (const json& layer : layers) {
    for (const json& c : layer.at("tokens_per_expert")) processed += c.get<double>();
    dropped += layer.value("dropped", 0.0), rerouted += layer.value("rerouted", 0.0);
    fallback += layer.value("fallback", 0.0);
    for (const char* key : {"overflow_ratio", "entropy", "cv", "load_max_over_mean"})
      if (layer.contains(key)) sums[key] += layer[key].get<double>();
  }
  // Every assignment was processed by its expert (rerouted ones included), dropped, or sent to the fallback.
  const double assignments = processed + dropped + fallback;
  if (assignments > 0) {
    series["dropped_share"].push_back(dropped / assignments);
    series["rerouted_share"].push_back(rerouted / assignments);
    series["fallback_share"].push_back(fallback / assignments);
  }
  for (const auto& [key, sum] : sums) series[key].push_back(sum / double(layers.size()));
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (const double x : v) s += x;
  return s / double(v.size());
}

}  // namespace

json run_figures(const std::string& run_dir, int64_t steps) {
  json figures = json::object();
  std::map<std::string, std::vector<double>> series;
  std::vector<json> lines;
  for_each_line(fs::path(run_dir) / "metrics.jsonl", [&](const std::string& text) {
    try {
      lines.push_back(json::parse(text));
    } catch (const std::exception&) {  // a line still being written
    }
  });
  for (const json& line : lines) {
    if (!line.is_object()) continue;
    const int64_t step = line.value("step", int64_t(0));
    if (line.contains("eval_loss")) {
      figures["eval_loss"] = line["eval_loss"];
      if (line.contains("eval_loss_by_source")) figures["eval_loss_by_source"] = line["eval_loss_by_source"];
      continue;
    }
    if (!line.contains("lm_loss")) continue;
    figures["steps_done"] = step;
    figures["final_lm_loss"] = line["lm_loss"];
    if (line.contains("dead_experts")) figures["dead_experts"] = line["dead_experts"];
    if (2 * step <= steps && step != steps) continue;  // the second half of the run
    if (line.contains("moe")) add_routing(line, series);
    if (step > 1 && line.contains("tokens_per_s")) series["tokens_per_s"].push_back(line["tokens_per_s"]);
  }
  for (const auto& [key, values] : series)
    if (!values.empty()) figures[key] = mean_of(values);
  const json manifest = read_json_regular(fs::path(run_dir) / "manifest.json");
  if (manifest.is_object() && manifest.contains("memory") && manifest["memory"].contains("total"))
    figures["memory_estimate_bytes"] = manifest["memory"]["total"];
  return figures;
}

int64_t cell_steps(const SweepPlan& plan, const SweepCell& cell) {
  const json& v = cell.params.contains("train.steps") ? cell.params["train.steps"] : plan.base["train"]["steps"];
  return v.get<int64_t>();
}

std::string cell_results_problem(const std::string& out, const SweepPlan& plan, const SweepCell& cell) {
  const fs::path dir = fs::path(out) / "cells" / cell.name;
  const json config = read_json_regular(dir / "config.json");
  if (!config.is_object()) return "its config.json is missing or unreadable";
  for (const auto& [key, value] : cell.params.items()) {
    std::string pointer = "/" + key;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    if (config.value(json::json_pointer(pointer), json()) != value)
      return "its config.json has " + key + " = " + config.value(json::json_pointer(pointer), json()).dump() +
             ", not " + value.dump();
  }
  if (config.value(json::json_pointer("/train/seed"), json()) != cell.seed)
    return "its config.json has another train.seed than " + std::to_string(cell.seed);
  const int64_t steps = cell_steps(plan, cell);
  const json figures = run_figures(dir.string(), steps);
  if (!figures.contains("steps_done"))
    return "its metrics.jsonl is missing, not a regular file, or holds no training line";
  if (figures["steps_done"] != steps)
    return "its metrics.jsonl ends at step " + figures["steps_done"].dump() + " of " + std::to_string(steps);
  return "";
}

json average_figures(const std::vector<json>& figures) {
  std::map<std::string, std::vector<double>> values;
  for (const json& f : figures)
    for (const auto& [key, v] : f.items()) {
      if (v.is_number()) values[key].push_back(v.get<double>());
      if (key == "eval_loss_by_source")
        for (const auto& [source, loss] : v.items()) values["eval_loss_by_source." + source].push_back(loss);
    }
  json mean = json::object(), stdev = json::object();
  for (const auto& [key, v] : values) {
    const double m = mean_of(v);
    double ss = 0;
    for (const double x : v) ss += (x - m) * (x - m);
    mean[key] = m;
    stdev[key] = v.size() > 1 ? std::sqrt(ss / double(v.size() - 1)) : 0.0;
  }
  return {{"mean", mean}, {"std", stdev}, {"n", figures.size()}};
}

namespace {

// Each cell's entry of sweep.json: its point, seed, status (from OUT/status/NAME.json) and figures.
json cell_entry(const fs::path& out, const SweepPlan& plan, const SweepCell& cell) {
  const int64_t steps = cell_steps(plan, cell);
  json entry = {{"name", cell.name},
                {"run_dir", "cells/" + cell.name},
                {"params", cell.params},
                {"seed", cell.seed},
                {"status", "pending"}};
  const json status = read_json_regular(out / "status" / (cell.name + ".json"));
  if (status.is_object()) entry.update(status);
  if (entry_kind(out / "cells" / cell.name / "metrics.jsonl") == Entry::Regular) {
    json figures = run_figures((out / "cells" / cell.name).string(), steps);
    if (status.is_object() && status.contains("peak_rss_bytes")) figures["peak_rss_bytes"] = status["peak_rss_bytes"];
    entry["figures"] = figures;
    if (entry["status"] == "pending") entry["status"] = "started";
  }
  return entry;
}

std::string csv_field(const json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    char text[32];
    std::snprintf(text, sizeof text, "%.9g", v.get<double>());
    return text;
  }
  return v.dump();
}

// The figure columns of sweep.csv: every figure some cell has, eval_loss_by_source flattened.
std::vector<std::string> figure_columns(const json& cells) {
  std::set<std::string> keys;
  for (const json& c : cells)
    if (c.contains("figures"))
      for (const auto& [key, v] : c["figures"].items()) {
        if (v.is_number()) keys.insert(key);
        if (key == "eval_loss_by_source")
          for (const auto& [source, loss] : v.items()) keys.insert("eval_loss_by_source." + source);
      }
  return {keys.begin(), keys.end()};
}

std::string sweep_csv(const SweepPlan& plan, const json& doc) {
  const std::vector<std::string> columns = figure_columns(doc["cells"]);
  std::ostringstream csv;
  csv << "row,cell";
  for (const GridAxis& a : plan.axes) csv << "," << a.key;
  csv << ",seed,status,n";
  for (const std::string& c : columns) csv << "," << c << "," << c << ".std";
  csv << "\n";
  for (const json& c : doc["cells"]) {
    csv << "cell," << c["name"].get<std::string>();
    for (const GridAxis& a : plan.axes) csv << "," << csv_field(c["params"][a.key]);
    csv << "," << c["seed"] << "," << c["status"].get<std::string>() << ",1";
    json flat = c.value("figures", json::object());
    const json by_source = flat.value("eval_loss_by_source", json::object());
    for (const auto& [source, loss] : by_source.items()) flat["eval_loss_by_source." + source] = loss;
    for (const std::string& col : columns) csv << "," << csv_field(flat.value(col, json())) << ",";
    csv << "\n";
  }
  for (const json& g : doc["summary"]) {
    csv << "mean,";
    for (const GridAxis& a : plan.axes) csv << "," << csv_field(g["params"][a.key]);
    csv << ",,," << g["n"];
    for (const std::string& col : columns)
      csv << "," << csv_field(g["mean"].value(col, json())) << "," << csv_field(g["std"].value(col, json()));
    csv << "\n";
  }
  return csv.str();
}

}  // namespace

void write_sweep_results(const std::string& out_dir, const SweepPlan& plan) {
  const fs::path out = out_dir;
  json cells = json::array();
  for (const SweepCell& cell : plan.cells) cells.push_back(cell_entry(out, plan, cell));
  // The grid points in cell order, each averaged over its finished seeds.
  json summary = json::array();
  std::vector<std::string> points;
  std::map<std::string, std::vector<json>> done;
  for (const json& c : cells) {
    const std::string point = c["params"].dump();
    if (std::find(points.begin(), points.end(), point) == points.end()) points.push_back(point);
    if (c["status"] == "done" && c.contains("figures")) done[point].push_back(c["figures"]);
  }
  for (const std::string& point : points) {
    json group = average_figures(done[point]);
    group["params"] = json::parse(point);
    summary.push_back(group);
  }
  json grid = json::array();
  for (const GridAxis& a : plan.axes) grid.push_back({{"key", a.key}, {"values", a.values}});
  const json doc = {{"version", 1},
                    {"grid", grid},
                    {"seeds", plan.seeds},
                    {"np", plan.np},
                    {"cells", cells},
                    {"summary", summary},
                    {"base_config", "base_config.json"}};
  replace_run_file(out / "sweep.json", doc.dump(1) + "\n");
  replace_run_file(out / "sweep.csv", sweep_csv(plan, doc));
}

}  // namespace moe
