// A sweep's page (launch/sweep/report_sweep.h).
#include "launch/sweep/report_sweep.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

#include "core/error.h"
#include "launch/sweep/report_page.h"
#include "launch/sweep/report_run.h"
#include "launch/sweep/report_sampling.h"

namespace moe::report {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A member of an object, or null when `j` is not an object or has no such member: sweep.json is data, read
// without trusting its types.
const json& member(const json& j, const std::string& key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  const auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

std::string text_of(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

std::optional<double> number_of(const json& v) {
  if (!v.is_number() || !std::isfinite(v.get<double>())) return std::nullopt;
  return v.get<double>();
}

// A grid value as a lookup key: numbers by value (1 and 1.0 are one value), anything else by its JSON text.
std::string value_key(const json& v) {
  if (!v.is_number()) return text_of(v);
  char text[40];
  std::snprintf(text, sizeof text, "n%.17g", v.get<double>());
  return text;
}

std::string key_of(const json& axis) { return member(axis, "key").get<std::string>(); }

// The two axes of the sweep's heatmaps: tau and the capacity factor when both are swept, else the first two.
std::pair<size_t, std::optional<size_t>> heatmap_axes(const json& grid) {
  std::optional<size_t> tau, cf;
  for (size_t i = 0; i < grid.size(); ++i) {
    if (key_of(grid[i]) == "moe.router.tau") tau = i;
    if (key_of(grid[i]) == "moe.capacity_factor") cf = i;
  }
  if (tau && cf) return {*tau, cf};
  return {0, grid.size() > 1 ? std::optional<size_t>(1) : std::nullopt};
}

// Positions of an axis's values by value_key (the first of equal values).
std::map<std::string, size_t> positions(const json& values) {
  std::map<std::string, size_t> at;
  for (size_t i = 0; i < values.size(); ++i) at.emplace(value_key(values[i]), i);
  return at;
}

// A heatmap of one figure's mean over the grid points (averaged over the other axes' values); nullopt when it
// would have more than kMaxHeatmapCells cells.
std::optional<Heatmap> sweep_heatmap(const json& sweep, const std::string& id, const std::string& figure,
                                     const std::string& title) {
  const json& grid = sweep["grid"];
  const auto [row_axis, col_axis] = heatmap_axes(grid);
  const json& rows = grid[row_axis]["values"];
  const json cols = col_axis ? grid[*col_axis]["values"] : json::array({nullptr});
  if (rows.size() * std::max<size_t>(cols.size(), 1) > kMaxHeatmapCells) return std::nullopt;
  Heatmap m;
  m.id = id, m.title = title, m.x_label = col_axis ? key_of(grid[*col_axis]) : "", m.y_label = key_of(grid[row_axis]);
  m.show_values = true;
  m.lower_is_better = true;
  for (const json& r : rows) m.row_labels.push_back(text_of(r));
  for (const json& c : cols) m.col_labels.push_back(c.is_null() ? "" : text_of(c));
  const std::map<std::string, size_t> row_at = positions(rows), col_at = positions(cols);
  std::vector<std::vector<std::pair<double, int>>> sums(rows.size(), std::vector<std::pair<double, int>>(cols.size()));
  for (const json& g : sweep["summary"]) {
    const json& params = member(g, "params");
    const auto r = row_at.find(value_key(member(params, key_of(grid[row_axis]))));
    const auto c = col_axis ? col_at.find(value_key(member(params, key_of(grid[*col_axis])))) : col_at.begin();
    const std::optional<double> v = number_of(member(member(g, "mean"), figure));
    if (r == row_at.end() || c == col_at.end() || !v) continue;
    sums[r->second][c->second].first += *v, ++sums[r->second][c->second].second;
  }
  for (const auto& row : sums) {
    m.values.emplace_back();
    for (const auto& [sum, n] : row) m.values.back().push_back(n ? std::optional<double>(sum / n) : std::nullopt);
  }
  return m;
}

// A cell's short name in legends: each swept key's last part (tau, capacity_factor as cf) and value, and the
// seed when there are several.
std::string cell_label(const json& sweep, const json& cell) {
  std::string label;
  for (const json& axis : sweep["grid"]) {
    const std::string key = key_of(axis);
    std::string part = key.substr(key.rfind('.') + 1);
    if (part == "capacity_factor") part = "cf";
    if (!label.empty()) label += ' ';
    label += part + "=" + text_of(member(member(cell, "params"), key));
  }
  const json& seeds = member(sweep, "seeds");
  if (seeds.is_array() && seeds.size() > 1) label += " s" + text_of(member(cell, "seed"));
  return label;
}

std::string figure_text(const std::string& key, double v) {
  // Bytes as MiB, throughput as a whole number: what a reader compares at a glance.
  if (key == "peak_rss_bytes") v /= double(1 << 20);
  if (key == "tokens_per_s" || key == "peak_rss_bytes")
    return std::to_string(int64_t(std::llround(std::clamp(v, -9e18, 9e18))));
  return format_number(v);
}

std::string summary_table(const json& sweep) {
  static const std::vector<std::pair<std::string, std::string>> kColumns = {
      {"eval_loss", "eval loss"},          {"overflow_ratio", "overflow"}, {"dropped_share", "dropped"},
      {"rerouted_share", "rerouted"},      {"entropy", "entropy"},         {"cv", "cv"},
      {"load_max_over_mean", "max/mean"},  {"dead_experts", "dead"},       {"tokens_per_s", "tokens/s"},
      {"peak_rss_bytes", "peak RSS (MiB)"}};
  std::string t = "<table id=\"summary\"><tr>";
  for (const json& a : sweep["grid"]) t += "<th>" + escape(key_of(a)) + "</th>";
  t += "<th>seeds</th>";
  for (const auto& [key, label] : kColumns) t += "<th>" + label + "</th>";
  t += "</tr>";
  for (const json& g : sweep["summary"]) {
    t += "<tr>";
    for (const json& a : sweep["grid"]) t += "<td>" + escape(text_of(member(member(g, "params"), key_of(a)))) + "</td>";
    const json& n = member(g, "n");
    t += "<td>" + escape(text_of(n)) + "</td>";
    const bool several = number_of(n).value_or(0) > 1;
    for (const auto& [key, label] : kColumns) {
      const std::optional<double> mean = number_of(member(member(g, "mean"), key)),
                                  std = number_of(member(member(g, "std"), key));
      t += "<td data-figure=\"" + key + "\">" +
           (mean ? figure_text(key, *mean) + (several && std ? " ± " + figure_text(key, *std) : "") : "") + "</td>";
    }
    t += "</tr>";
  }
  return t + "</table>\n";
}

// DIR/run_dir/metrics.jsonl of a cell, or why it may not be read: run_dir must be a relative path inside the
// sweep with no symbolic link on the way (sweep.json is data; it does not choose what else is read).
std::optional<fs::path> cell_metrics(const fs::path& dir, const json& cell, std::string& why) {
  const json& run_dir = member(cell, "run_dir");
  if (!run_dir.is_string()) {
    why = "run_dir is not a string";
    return std::nullopt;
  }
  const fs::path rel = fs::path(run_dir.get<std::string>()).lexically_normal();
  if (rel.empty() || rel.is_absolute() || *rel.begin() == ".." || rel == ".") {
    why = "run_dir " + text_of(run_dir) + " is not a directory inside the sweep";
    return std::nullopt;
  }
  fs::path at = dir;
  for (const fs::path& part : rel) {
    at /= part;
    std::error_code ec;
    if (fs::is_symlink(fs::symlink_status(at, ec))) {
      why = at.string() + " is a symbolic link";
      return std::nullopt;
    }
  }
  return at / "metrics.jsonl";
}

struct CellCurves {
  SeriesSampler loss, eval;
};

// The cell's curves, or why it was skipped.
std::optional<CellCurves> read_cell(const fs::path& dir, const json& cell, size_t points, Skipped& skipped,
                                    std::string& why) {
  CellCurves curves{SeriesSampler(points), SeriesSampler(points)};
  const std::optional<fs::path> metrics = cell_metrics(dir, cell, why);
  if (!metrics) return std::nullopt;
  const Fd fd = open_regular(*metrics, why);
  if (!why.empty()) {
    why = metrics->string() + " " + why;
    return std::nullopt;
  }
  if (fd.get() < 0) return curves;  // not started yet
  for_each_json_line(fd.get(), skipped, [&](const json& line) {
    const std::optional<double> step = number_of(member(line, "step"));
    if (!step) return void(++skipped.odd_lines);
    const json &loss = member(line, "lm_loss"), &eval = member(line, "eval_loss");
    if (!loss.is_null() && !number_of(loss)) ++skipped.odd_fields;
    if (!eval.is_null() && !number_of(eval)) ++skipped.odd_fields;
    if (const auto v = number_of(loss)) curves.loss.add(*step, *v);
    if (const auto v = number_of(eval)) curves.eval.add(*step, *v);
  });
  return curves;
}

void add_cell_curves(Page& page, const fs::path& dir, const json& sweep, Skipped& skipped) {
  const json& cells = sweep["cells"];
  const size_t points = std::clamp<size_t>(kMaxSweepChartPoints / std::max<size_t>(cells.size(), 1), 16, kMaxPoints);
  std::vector<Series> loss, eval;
  for (const json& cell : cells) {
    const std::string name = cell_label(sweep, cell);
    std::string why;
    const std::optional<CellCurves> curves = read_cell(dir, cell, points, skipped, why);
    if (!curves) {
      if (++skipped.cells <= 5) skipped.cell_reasons.push_back("cell " + text_of(member(cell, "name")) + ": " + why);
      continue;
    }
    loss.push_back(curves->loss.series(name));
    eval.push_back(curves->eval.series(name));
  }
  page.add(LineChart{"chart-cells-loss", "Training loss per cell", "step", "lm_loss", loss});
  page.add(LineChart{"chart-cells-eval", "Eval loss per cell", "step", "eval_loss", eval});
  for (size_t i = 0; i < skipped.cell_reasons.size(); ++i)
    page.note("skipped-cell-" + std::to_string(i), "Skipped " + skipped.cell_reasons[i]);
}

}  // namespace

void check_sweep_json(const json& sweep, const fs::path& file) {
  const auto bad = [&](const std::string& what) {
    MOE_BAD_INPUT(file.string() << ": " << what << "; expected the sweep.json of moe sweep");
  };
  if (!sweep.is_object()) bad("not a JSON object");
  for (const char* key : {"grid", "cells", "summary"})
    if (!member(sweep, key).is_array()) bad(std::string("\"") + key + "\" is missing or not an array");
  for (size_t i = 0; i < sweep["grid"].size(); ++i)
    if (!member(sweep["grid"][i], "key").is_string() || !member(sweep["grid"][i], "values").is_array())
      bad("grid[" + std::to_string(i) + "] is not {\"key\": string, \"values\": array}");
}

std::string sweep_page(const std::string& title, const fs::path& dir, const json& sweep, Skipped& skipped) {
  check_sweep_json(sweep, dir / "sweep.json");
  Page page;
  page.data["kind"] = "sweep";
  page.data["summary"] = sweep["summary"];
  size_t done = 0;
  for (const json& c : sweep["cells"]) done += member(c, "status") == "done";
  page.section("Summary (mean ± std over seeds)");
  page.body += summary_table(sweep);
  if (!sweep["grid"].empty()) {
    page.section("Grid");
    for (const auto& [id, figure, heading] :
         {std::tuple<const char*, const char*, const char*>{"heatmap-eval-loss", "eval_loss", "Final eval loss"},
          {"heatmap-overflow", "overflow_ratio", "Overflow ratio (second half of the run)"}}) {
      if (const std::optional<Heatmap> m = sweep_heatmap(sweep, id, figure, heading))
        page.add(*m);
      else
        page.note(std::string(id) + "-not-drawn", std::string(heading) + ": more grid points than " +
                                                      std::to_string(kMaxHeatmapCells) + "; not drawn.");
    }
  }
  page.section("Curves per cell");
  add_cell_curves(page, dir, sweep, skipped);
  page.data["skipped"] = {{"long_lines", skipped.long_lines}, {"not_json", skipped.not_json},
                          {"odd_lines", skipped.odd_lines},   {"odd_fields", skipped.odd_fields},
                          {"cells", skipped.cells},           {"cell_reasons", skipped.cell_reasons}};
  std::string subtitle = std::to_string(done) + " of " + std::to_string(sweep["cells"].size()) + " cells done";
  if (skipped.any()) subtitle += "; skipped: " + skipped.text();
  return page_html(title, subtitle, page);
}

}  // namespace moe::report
