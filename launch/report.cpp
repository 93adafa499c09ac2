// `moe report` (launch/report.h): what a run's and a sweep's pages show, and the command.
#include "launch/report.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"
#include "launch/json_files.h"
#include "launch/report_svg.h"
#include "launch/run_dir.h"

namespace moe {
namespace fs = std::filesystem;
using json = nlohmann::json;
using report::Heatmap;
using report::LineChart;
using report::Series;

namespace {

// Indices of n points thinned to at most `most`, the first and the last always kept.
std::vector<size_t> thinned(size_t n, size_t most) {
  std::vector<size_t> keep;
  const size_t stride = std::max<size_t>(1, (n + most - 1) / most);
  for (size_t i = 0; i < n; i += stride) keep.push_back(i);
  if (n > 0 && keep.back() != n - 1) keep.push_back(n - 1);
  return keep;
}

// A series of a field of the lines that have it: get(line) returns nullopt where there is no value.
template <typename Get>
Series series_of(const std::string& name, const std::vector<const json*>& lines, Get get) {
  Series all{name, {}, {}};
  for (const json* line : lines)
    if (const std::optional<double> v = get(*line); v && std::isfinite(*v)) {
      all.x.push_back(line->at("step").get<double>());
      all.y.push_back(*v);
    }
  Series out{name, {}, {}};
  for (const size_t i : thinned(all.x.size(), kReportMaxPoints)) out.x.push_back(all.x[i]), out.y.push_back(all.y[i]);
  return out;
}

std::optional<double> number_at(const json& j, const std::string& key) {
  if (j.contains(key) && j[key].is_number()) return j[key].get<double>();
  return std::nullopt;
}

// The page's data and markup, built together so what is embedded is what is drawn.
struct Page {
  json data = {{"charts", json::object()}, {"heatmaps", json::object()}};
  std::string body;
  void add(const LineChart& c) {
    json series = json::array();
    for (const Series& s : c.series) series.push_back({{"name", s.name}, {"x", s.x}, {"y", s.y}});
    data["charts"][c.id] = {{"title", c.title}, {"series", series}};
    body += report::line_chart_svg(c);
  }
  void add(const Heatmap& m) {
    json values = json::array();
    for (const auto& row : m.values) {
      json r = json::array();
      for (const auto& v : row) r.push_back(v ? json(*v) : json(nullptr));
      values.push_back(r);
    }
    data["heatmaps"][m.id] = {{"title", m.title}, {"rows", m.row_labels}, {"cols", m.col_labels}, {"values", values}};
    body += report::heatmap_svg(m);
  }
  void section(const std::string& title) { body += "<h2>" + report::escape(title) + "</h2>\n"; }
};

std::string page_html(const std::string& title, const std::string& subtitle, const Page& page) {
  std::string data = page.data.dump();
  // JSON inside a <script> element: "</" would end it early.
  for (size_t at = 0; (at = data.find("</", at)) != std::string::npos; at += 3) data.replace(at, 2, "<\\/");
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + report::escape(title) +
         "</title>\n<style>body{font-family:sans-serif;margin:24px;color:#222;max-width:1600px}"
         "figure.chart{display:inline-block;margin:8px;vertical-align:top}figcaption{font-weight:bold;font-size:14px}"
         "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}"
         "th{background:#f3f3f3}td.l,th.l{text-align:left}.note{color:#555;font-size:13px}</style></head>\n<body>"
         "<h1>" +
         report::escape(title) + "</h1><p class=\"note\">" + subtitle + "</p>\n" + page.body +
         "<script type=\"application/json\" id=\"moe-report-data\">" + data + "</script>\n</body></html>\n";
}

// Per MoE layer, a series of one of its fields.
std::vector<Series> per_layer(const std::vector<const json*>& train, size_t layers, const std::string& field) {
  std::vector<Series> out;
  for (size_t l = 0; l < layers; ++l)
    out.push_back(series_of("layer " + std::to_string(l), train, [&](const json& line) -> std::optional<double> {
      const json& moe = line.at("moe");
      return l < moe.size() ? number_at(moe[l], field) : std::nullopt;
    }));
  return out;
}

// One heatmap per MoE layer: each expert's share of the layer's assignments, over the logged steps (averaged
// over the steps of a column when there are more lines than columns).
void add_load_heatmaps(Page& page, const std::vector<const json*>& train, size_t layers) {
  for (size_t l = 0; l < layers; ++l) {
    std::vector<std::pair<int64_t, std::vector<double>>> shares;  // (step, share per expert)
    for (const json* line : train) {
      if (l >= line->at("moe").size()) continue;
      const json& layer = line->at("moe")[l];
      std::vector<double> counts = layer.at("tokens_per_expert").get<std::vector<double>>(), share;
      double total = 0;
      for (const double c : counts) total += c;
      for (const double c : counts) share.push_back(total > 0 ? c / total : 0.0);
      shares.emplace_back(line->at("step").get<int64_t>(), share);
    }
    if (shares.empty()) continue;
    const size_t E = shares[0].second.size(), cols = std::min(shares.size(), kReportMaxColumns);
    Heatmap m{"heatmap-load-layer-" + std::to_string(l),
              "Expert load, layer " + std::to_string(l) + " (share of assignments)", "step", "expert"};
    m.values.assign(E, std::vector<std::optional<double>>(cols));
    for (size_t e = 0; e < E; ++e) m.row_labels.push_back(std::to_string(e));
    for (size_t c = 0; c < cols; ++c) {
      const size_t first = c * shares.size() / cols, end = (c + 1) * shares.size() / cols;
      m.col_labels.push_back(std::to_string(shares[end - 1].first));
      for (size_t e = 0; e < E; ++e) {
        double sum = 0;
        for (size_t i = first; i < end; ++i) sum += e < shares[i].second.size() ? shares[i].second[e] : 0.0;
        m.values[e][c] = sum / double(end - first);
      }
    }
    page.add(m);
  }
}

// The assignment shares over all MoE layers: dropped, rerouted, sent to the fallback.
std::optional<double> share_of(const json& line, const char* field) {
  double processed = 0, dropped = 0, fallback = 0, part = 0;
  for (const json& layer : line.at("moe")) {
    for (const json& c : layer.at("tokens_per_expert")) processed += c.get<double>();
    dropped += layer.value("dropped", 0.0), fallback += layer.value("fallback", 0.0);
    part += layer.value(field, 0.0);
  }
  const double all = processed + dropped + fallback;
  return all > 0 ? std::optional<double>(part / all) : std::nullopt;
}

void add_routing_charts(Page& page, const std::vector<const json*>& train) {
  size_t layers = 0;
  for (const json* line : train) layers = std::max(layers, line->at("moe").size());
  if (layers == 0) return;
  page.section("Routing");
  add_load_heatmaps(page, train, layers);
  std::vector<Series> drops;
  for (const char* f : {"dropped", "rerouted", "fallback"})
    drops.push_back(series_of(std::string(f) + " share", train, [&](const json& l) { return share_of(l, f); }));
  for (Series& s : per_layer(train, layers, "overflow_ratio")) drops.push_back({"overflow " + s.name, s.x, s.y});
  page.add(LineChart{"chart-overflow", "Drops, reroutes and overflow (share of assignments)", "step", "share", drops});
  page.add(LineChart{"chart-entropy", "Routing entropy (mean per token, nats)", "step", "entropy",
                     per_layer(train, layers, "entropy")});
  page.add(
      LineChart{"chart-cv", "Load cv (std / mean of tokens per expert)", "step", "cv", per_layer(train, layers, "cv")});
  page.add(LineChart{"chart-max-over-mean", "Load max / mean", "step", "max / mean",
                     per_layer(train, layers, "load_max_over_mean")});
  page.add(LineChart{"chart-stability", "Routing stability (probe tokens with the same top-1 as the last logged step)",
                     "step", "fraction", per_layer(train, layers, "stability")});
  page.add(LineChart{"chart-dead",
                     "Dead experts (no token in 100 steps)",
                     "step",
                     "experts",
                     {series_of("dead experts", train, [](const json& l) { return number_at(l, "dead_experts"); })}});
}

std::string alerts_table(const std::vector<const json*>& train) {
  std::string rows;
  for (const json* line : train)
    for (const json& a : line->value("alerts", json::array()))
      rows += "<tr><td>" + std::to_string(line->at("step").get<int64_t>()) + "</td><td class=\"l\">" +
              report::escape(a.value("kind", "")) + "</td><td>" + std::to_string(a.value("layer", int64_t(0))) +
              "</td><td>" + (a.contains("expert") ? std::to_string(a["expert"].get<int64_t>()) : "") + "</td><td>" +
              report::format_number(a.value("value", 0.0)) + "</td><td>" +
              report::format_number(a.value("threshold", 0.0)) + "</td><td>" +
              std::to_string(a.value("since_step", int64_t(0))) + "</td></tr>";
  if (rows.empty()) return "<p class=\"note\" id=\"alerts\">No routing-health alert fired.</p>\n";
  return "<table id=\"alerts\"><tr><th>step</th><th class=\"l\">alert</th><th>layer</th><th>expert</th><th>value</th>"
         "<th>threshold</th><th>since step</th></tr>" +
         rows + "</table>\n";
}

}  // namespace

std::string run_report_html(const std::string& title, const std::vector<json>& lines, const json& manifest) {
  std::vector<const json*> train, eval;
  for (const json& line : lines) {
    if (!line.is_object() || !line.contains("step")) continue;
    if (line.contains("lm_loss") && line.contains("moe")) train.push_back(&line);
    if (line.contains("eval_loss")) eval.push_back(&line);
  }
  Page page;
  page.data["kind"] = "run";
  page.section("Training");
  page.add(LineChart{"chart-loss",
                     "Loss",
                     "step",
                     "nats / token",
                     {series_of("loss", train, [](const json& l) { return number_at(l, "loss"); }),
                      series_of("lm_loss", train, [](const json& l) { return number_at(l, "lm_loss"); })}});
  std::vector<Series> ev = {series_of("eval_loss", eval, [](const json& l) { return number_at(l, "eval_loss"); })};
  std::vector<std::string> sources;
  for (const json* l : eval) {
    const json by_source = l->value("eval_loss_by_source", json::object());
    for (const auto& [name, v] : by_source.items())
      if (std::find(sources.begin(), sources.end(), name) == sources.end()) sources.push_back(name);
  }
  for (const std::string& s : sources)
    ev.push_back(series_of("eval " + s, eval, [&](const json& l) {
      return l.contains("eval_loss_by_source") ? number_at(l["eval_loss_by_source"], s) : std::nullopt;
    }));
  page.add(LineChart{"chart-eval", "Held-out loss, all sources and by source", "step", "nats / token", ev});
  page.add(LineChart{"chart-lr", "Learning rate", "step", "lr", {series_of("lr", train, [](const json& l) {
                       return number_at(l, "lr");
                     })}});
  page.add(LineChart{"chart-grad-norm",
                     "Gradient norm (before clipping)",
                     "step",
                     "L2 norm",
                     {series_of("grad_norm", train, [](const json& l) { return number_at(l, "grad_norm"); })}});
  page.add(LineChart{
      "chart-tokens-per-s", "Throughput", "step", "tokens / s", {series_of("tokens_per_s", train, [](const json& l) {
        return number_at(l, "tokens_per_s");
      })}});
  add_routing_charts(page, train);
  page.section("Alerts");
  page.body += alerts_table(train);
  std::string subtitle =
      std::to_string(train.size()) + " training lines, " + std::to_string(eval.size()) + " evaluation lines" +
      (train.empty() ? "" : "; last step " + std::to_string(train.back()->at("step").get<int64_t>()));
  if (manifest.is_object())
    subtitle += "; config hash " + report::escape(manifest.value("config_hash", "?")) + ", commit " +
                report::escape(manifest.value("git_commit", manifest.value("commit", "?")));
  return page_html(title, subtitle, page);
}

namespace {

// The two axes of the sweep's heatmaps: tau and the capacity factor when both are swept, else the first two.
std::pair<int, int> heatmap_axes(const json& grid) {
  int tau = -1, cf = -1;
  for (int i = 0; i < int(grid.size()); ++i) {
    if (grid[size_t(i)]["key"] == "moe.router.tau") tau = i;
    if (grid[size_t(i)]["key"] == "moe.capacity_factor") cf = i;
  }
  if (tau >= 0 && cf >= 0) return {tau, cf};
  return {0, grid.size() > 1 ? 1 : -1};
}

// A heatmap of one figure's mean over the grid points (averaged over the other axes' values).
Heatmap sweep_heatmap(const json& sweep, const std::string& id, const std::string& figure, const std::string& title) {
  const json& grid = sweep["grid"];
  const auto [row_axis, col_axis] = heatmap_axes(grid);
  const json& rows = grid[size_t(row_axis)]["values"];
  const json cols = col_axis >= 0 ? grid[size_t(col_axis)]["values"] : json::array({nullptr});
  Heatmap m{id, title, col_axis >= 0 ? grid[size_t(col_axis)]["key"].get<std::string>() : "",
            grid[size_t(row_axis)]["key"].get<std::string>()};
  m.show_values = true;
  m.lower_is_better = true;
  for (const json& r : rows) m.row_labels.push_back(r.dump());
  for (const json& c : cols) m.col_labels.push_back(c.is_null() ? "" : c.dump());
  for (const json& r : rows) {
    std::vector<std::optional<double>> row;
    for (const json& c : cols) {
      double sum = 0;
      int n = 0;
      for (const json& g : sweep["summary"]) {
        const json& p = g["params"];
        if (p[grid[size_t(row_axis)]["key"].get<std::string>()] != r) continue;
        if (col_axis >= 0 && p[grid[size_t(col_axis)]["key"].get<std::string>()] != c) continue;
        if (g["mean"].contains(figure)) sum += g["mean"][figure].get<double>(), ++n;
      }
      row.push_back(n ? std::optional<double>(sum / n) : std::nullopt);
    }
    m.values.push_back(row);
  }
  return m;
}

// A cell's short name in legends: each swept key's last part (tau, capacity_factor as cf) and value, and the
// seed when there are several.
std::string cell_label(const json& sweep, const json& cell) {
  std::string label;
  for (const json& axis : sweep["grid"]) {
    const std::string key = axis["key"];
    std::string part = key.substr(key.rfind('.') + 1);
    if (part == "capacity_factor") part = "cf";
    if (!label.empty()) label += ' ';
    label += part + "=" + cell["params"].value(key, json()).dump();
  }
  if (sweep.value("seeds", json::array()).size() > 1) label += " s" + cell["seed"].dump();
  return label;
}

std::string summary_table(const json& sweep) {
  static const std::vector<std::pair<std::string, std::string>> kColumns = {
      {"eval_loss", "eval loss"},          {"overflow_ratio", "overflow"}, {"dropped_share", "dropped"},
      {"rerouted_share", "rerouted"},      {"entropy", "entropy"},         {"cv", "cv"},
      {"load_max_over_mean", "max/mean"},  {"dead_experts", "dead"},       {"tokens_per_s", "tokens/s"},
      {"peak_rss_bytes", "peak RSS (MiB)"}};
  std::string t = "<table id=\"summary\"><tr>";
  for (const json& a : sweep["grid"]) t += "<th>" + report::escape(a["key"].get<std::string>()) + "</th>";
  t += "<th>seeds</th>";
  for (const auto& [key, label] : kColumns) t += "<th>" + label + "</th>";
  t += "</tr>";
  for (const json& g : sweep["summary"]) {
    t += "<tr>";
    for (const json& a : sweep["grid"])
      t += "<td>" + report::escape(g["params"][a["key"].get<std::string>()].dump()) + "</td>";
    t += "<td>" + g["n"].dump() + "</td>";
    for (const auto& [key, label] : kColumns) {
      const bool has = g["mean"].contains(key);
      // Bytes as MiB, throughput as a whole number: what a reader compares at a glance.
      const double scale = key == "peak_rss_bytes" ? 1.0 / (1 << 20) : 1.0;
      const auto shown = [&](double v) {
        return key == "tokens_per_s" || key == "peak_rss_bytes" ? std::to_string(int64_t(std::llround(v * scale)))
                                                                : report::format_number(v);
      };
      t += "<td data-figure=\"" + key + "\">" +
           (has ? shown(g["mean"][key].get<double>()) +
                      (g["n"].get<int>() > 1 ? " ± " + shown(g["std"][key].get<double>()) : "")
                : "") +
           "</td>";
    }
    t += "</tr>";
  }
  return t + "</table>\n";
}

}  // namespace

std::string sweep_report_html(const std::string& title, const json& sweep,
                              const std::vector<std::vector<json>>& cells) {
  Page page;
  page.data["kind"] = "sweep";
  page.data["summary"] = sweep["summary"];
  size_t done = 0;
  for (const json& c : sweep["cells"]) done += c.value("status", "") == "done";
  page.section("Summary (mean ± std over seeds)");
  page.body += summary_table(sweep);
  if (!sweep["grid"].empty()) {
    page.section("Grid");
    page.add(sweep_heatmap(sweep, "heatmap-eval-loss", "eval_loss", "Final eval loss"));
    page.add(sweep_heatmap(sweep, "heatmap-overflow", "overflow_ratio", "Overflow ratio (second half of the run)"));
  }
  page.section("Curves per cell");
  std::vector<Series> loss, eval;
  for (size_t i = 0; i < cells.size() && i < sweep["cells"].size(); ++i) {
    std::vector<const json*> train, ev;
    for (const json& l : cells[i]) {
      if (l.contains("lm_loss")) train.push_back(&l);
      if (l.contains("eval_loss")) ev.push_back(&l);
    }
    const std::string name = cell_label(sweep, sweep["cells"][i]);
    loss.push_back(series_of(name, train, [](const json& l) { return number_at(l, "lm_loss"); }));
    eval.push_back(series_of(name, ev, [](const json& l) { return number_at(l, "eval_loss"); }));
  }
  page.add(LineChart{"chart-cells-loss", "Training loss per cell", "step", "lm_loss", loss});
  page.add(LineChart{"chart-cells-eval", "Eval loss per cell", "step", "eval_loss", eval});
  const std::string subtitle = std::to_string(done) + " of " + std::to_string(sweep["cells"].size()) + " cells done";
  return page_html(title, subtitle, page);
}

void run_report(const ReportOptions& o) {
  const fs::path path = o.path;
  std::error_code ec;
  if (!fs::is_directory(path, ec))
    MOE_BAD_INPUT("moe report " << o.path
                                << ": expected a run directory (with metrics.jsonl) or a sweep directory "
                                   "(with sweep.json)");
  const bool sweep = fs::is_regular_file(path / "sweep.json", ec);
  if (!sweep && !fs::is_regular_file(path / "metrics.jsonl", ec))
    MOE_BAD_INPUT("moe report " << o.path << ": holds neither metrics.jsonl (a run) nor sweep.json (a sweep)");
  const fs::path out = o.out.empty() ? path / "report.html" : fs::path(o.out);
  if (fs::is_directory(out, ec)) MOE_BAD_INPUT("--out " << out.string() << ": is a directory; expected FILE.html");
  const fs::path parent = fs::absolute(out).parent_path();
  if (!fs::is_directory(parent, ec))
    MOE_BAD_INPUT("--out " << out.string() << ": its directory " << parent.string()
                           << " is missing (or not a directory)");
  check_dir_writable(parent.string(), "--out " + out.string());
  const std::string title = (sweep ? "Sweep " : "Run ") + fs::absolute(path).lexically_normal().string();
  std::string html;
  if (sweep) {
    const json doc = read_json_file(path / "sweep.json", true);
    if (!doc.is_object() || !doc.contains("cells") || !doc.contains("grid") || !doc.contains("summary"))
      MOE_BAD_INPUT((path / "sweep.json").string() << ": not a sweep.json of moe sweep (cells, grid, summary)");
    std::vector<std::vector<json>> cells;
    for (const json& c : doc["cells"])
      cells.push_back(read_json_lines(path / c.value("run_dir", "") / "metrics.jsonl"));
    html = sweep_report_html(title, doc, cells);
  } else {
    html =
        run_report_html(title, read_json_lines(path / "metrics.jsonl"), read_json_file(path / "manifest.json", false));
  }
  const fs::path tmp = out.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc | std::ios::binary);
    f << html;
    if (!f) MOE_FAIL("cannot write " << tmp.string());
  }
  fs::rename(tmp, out);
  std::printf("wrote %s (%.1f KiB)\n", out.string().c_str(), double(html.size()) / 1024.0);
}

CLI::App* add_report_command(CLI::App& app, ReportOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "report", "A run or a sweep as one self-contained HTML page (inline SVG charts; works while it runs).");
  cmd->add_option("PATH", o.path, "A run directory (metrics.jsonl) or a sweep directory (sweep.json)")->required();
  cmd->add_option("--out", o.out, "The page to write (default: PATH/report.html)");
  return cmd;
}

}  // namespace moe
