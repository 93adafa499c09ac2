// `moe report` (launch/sweep/report.h): a run's page and a sweep's page. The plotted values against metrics.jsonl and
// sweep.json, read back from the page's embedded data and from the SVG elements of the DOM as headless Chromium
// (Debian's `chromium`, started fully offline: report_harness.h) builds it: no console error, every chart present, each
// polyline's points an exact affine image of the values it carries, a screenshot kept beside the test binary. A
// 10,000-step run's page stays under 3 MB; a run still being written (a cut last line) is reported. The test skips the
// browser part only when chromium is not installed (make deps installs it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "report_harness.h"

namespace moe {
namespace {
using namespace report_test;
using json = nlohmann::json;

const std::string kConfig = std::string(MOE_SOURCE_DIR) + "/configs/tiny_moe.json";

// A real run: 12 steps, two MoE layers of 4 experts, a line per step, evaluations at 6 and 12.
void train_run(const fs::path& run_dir) {
  std::string command =
      std::string(MOE_BINARY) + " train --quiet --config " + quoted(kConfig) + " --run-dir " + quoted(run_dir.string());
  for (const char* s : {"train.threads=1", "model.d_model=32", "model.layers=2", "model.heads=2", "model.ffn_hidden=48",
                        "moe.num_experts=4", "moe.expert_hidden=32", "train.seq_len=32", "train.global_batch=8",
                        "train.micro_batch=2", "train.eval_sequences=2", "train.eval_every=6", "train.log_every=1",
                        "train.steps=12", "checkpoint.every=0", "moe.capacity_factor=1.0"})
    command += " --set " + quoted(s);
  ASSERT_EQ(shell(command + " > /dev/null 2>&1"), 0) << command;
}

std::vector<json> read_lines(const fs::path& path) {
  std::vector<json> lines;
  std::ifstream in(path);
  for (std::string text; std::getline(in, text);) lines.push_back(json::parse(text));
  return lines;
}

// The values a run's chart must show: (step, value) of a field of the training or evaluation lines.
std::pair<std::vector<double>, std::vector<double>> expected(const std::vector<json>& lines, const std::string& field,
                                                             int layer = -1) {
  std::pair<std::vector<double>, std::vector<double>> out;
  for (const json& l : lines) {
    const json* v = nullptr;
    if (layer < 0 && l.contains(field)) v = &l[field];
    if (layer >= 0 && l.contains("moe") && l["moe"][size_t(layer)].contains(field)) v = &l["moe"][size_t(layer)][field];
    if (!v || !v->is_number()) continue;
    out.first.push_back(l["step"].get<double>());
    out.second.push_back(v->get<double>());
  }
  return out;
}

// The pixel y of each point is the same affine function of its value (decreasing: up is more), to 0.01 px.
void expect_drawn_affinely(const Drawn& d, const std::string& what) {
  ASSERT_EQ(d.py.size(), d.y.size()) << what;
  size_t lo = 0, hi = 0;
  for (size_t i = 0; i < d.y.size(); ++i) lo = d.y[i] < d.y[lo] ? i : lo, hi = d.y[i] > d.y[hi] ? i : hi;
  if (d.y[hi] == d.y[lo]) return;
  const double slope = (d.py[hi] - d.py[lo]) / (d.y[hi] - d.y[lo]);
  EXPECT_LT(slope, 0) << what;
  for (size_t i = 0; i < d.y.size(); ++i)
    EXPECT_NEAR(d.py[i], d.py[lo] + slope * (d.y[i] - d.y[lo]), 0.011) << what << " point " << i;
}

TEST(Report, ARunPageShowsMetricsJsonlInEveryChartAndChromiumRendersIt) {
  TempDir dir("report_run");
  const fs::path run = dir.path() / "run", page = dir.path() / "run.html";
  train_run(run);
  ASSERT_EQ(shell(std::string(MOE_BINARY) + " report " + quoted(run.string()) + " --out " + quoted(page.string()) +
                  " > /dev/null"),
            0);
  const std::string html = read_text(page);
  const std::vector<json> lines = read_lines(run / "metrics.jsonl");
  const json data = embedded_data(html);
  ASSERT_TRUE(data.is_object()) << "no embedded data";
  // The embedded data is the metrics: each chart's series against its field.
  const std::vector<std::tuple<std::string, std::string, std::string, int>> checks = {
      {"chart-loss", "lm_loss", "lm_loss", -1},
      {"chart-loss", "loss", "loss", -1},
      {"chart-eval", "eval_loss", "eval_loss", -1},
      {"chart-lr", "lr", "lr", -1},
      {"chart-grad-norm", "grad_norm", "grad_norm", -1},
      {"chart-tokens-per-s", "tokens_per_s", "tokens_per_s", -1},
      {"chart-entropy", "layer 1", "entropy", 1},
      {"chart-cv", "layer 0", "cv", 0},
      {"chart-overflow", "overflow layer 1", "overflow_ratio", 1},
      {"chart-stability", "layer 0", "stability", 0},
      {"chart-max-over-mean", "layer 1", "load_max_over_mean", 1}};
  for (const auto& [chart, series, field, layer] : checks) {
    const auto [x, y] = expected(lines, field, layer);
    ASSERT_FALSE(x.empty()) << field;
    bool found = false;
    for (const json& s : data["charts"][chart]["series"])
      if (s["name"] == series) {
        found = true;
        EXPECT_EQ(s["x"].get<std::vector<double>>(), x) << chart << " " << series;
        EXPECT_EQ(s["y"].get<std::vector<double>>(), y) << chart << " " << series;
      }
    EXPECT_TRUE(found) << chart << " has no series " << series;
  }
  // The load heatmap of layer 1: expert e at the i-th line is its share of tokens_per_expert.
  const json& heat = data["heatmaps"]["heatmap-load-layer-1"]["values"];
  size_t col = 0;
  for (const json& l : lines) {
    if (!l.contains("moe")) continue;
    const auto tpe = l["moe"][1]["tokens_per_expert"].get<std::vector<double>>();
    double sum = 0;
    for (const double c : tpe) sum += c;
    for (size_t e = 0; e < tpe.size(); ++e) EXPECT_DOUBLE_EQ(heat[e][col].get<double>(), tpe[e] / sum);
    ++col;
  }
  EXPECT_EQ(col, 12u);

  const std::string browser = chromium();
  if (browser.empty()) GTEST_SKIP() << "chromium is not installed (apt-get install chromium; make deps does)";
  const fs::path dom_file = dir.path() / "dom.html", console = dir.path() / "console.txt";
  ASSERT_EQ(browse(browser, page, "--dump-dom", dom_file, console), 0) << read_text_if_any(console);
  const std::string dom = read_text(dom_file), log = read_text_if_any(console);
  EXPECT_EQ(log.find("Uncaught"), std::string::npos) << log;
  EXPECT_EQ(log.find(":CONSOLE"), std::string::npos) << "a console message: " << log;
  for (const char* id : {"chart-loss", "chart-eval", "chart-lr", "chart-grad-norm", "chart-tokens-per-s",
                         "heatmap-load-layer-0", "heatmap-load-layer-1", "chart-overflow", "chart-entropy", "chart-cv",
                         "chart-max-over-mean", "chart-stability", "chart-dead", "alerts"})
    EXPECT_NE(dom.find("id=\"" + std::string(id) + "\""), std::string::npos) << id << " missing from the DOM";
  for (const auto& [chart, series, field, layer] : checks) {
    const auto drawn = polylines(dom, chart);
    ASSERT_TRUE(drawn.count(series)) << chart << " " << series << " not drawn";
    const auto [x, y] = expected(lines, field, layer);
    EXPECT_EQ(drawn.at(series).x, x) << chart << " " << series;
    ASSERT_EQ(drawn.at(series).y.size(), y.size());
    for (size_t i = 0; i < y.size(); ++i) EXPECT_DOUBLE_EQ(drawn.at(series).y[i], y[i]) << chart << " " << series;
    expect_drawn_affinely(drawn.at(series), chart + " " + series);
  }
  // The screenshot stays beside the test binary for a person to look at.
  const fs::path shot = fs::current_path() / "report_run_screenshot.png";
  fs::remove(shot);
  browse(browser, page, "--window-size=1500,2600 --screenshot=" + quoted(shot.string()), dir.path() / "shot.out",
         dir.path() / "shot.err");
  ASSERT_TRUE(fs::exists(shot)) << read_text_if_any(dir.path() / "shot.err");
  EXPECT_GT(fs::file_size(shot), 20000u) << "a blank screenshot";
  std::cout << "[ artifact ] " << shot.string() << "\n";
}

// A sweep directory written by hand: a 2 x 2 grid of tau and capacity factor, its heatmaps carrying the summary
// means, the table, and one curve per cell.
TEST(Report, ASweepPageShowsTheGridHeatmapsTheTableAndEveryCell) {
  TempDir dir("report_sweep");
  const fs::path sweep = dir.path() / "sw";
  json cells = json::array(), summary = json::array();
  int i = 0;
  for (const double tau : {0.5, 1.0})
    for (const double cf : {1.0, 2.0}) {
      const std::string name = "00" + std::to_string(i) + "-cell";
      fs::create_directories(sweep / "cells" / name);
      std::ofstream m(sweep / "cells" / name / "metrics.jsonl");
      for (int step = 1; step <= 3; ++step)
        m << json{{"step", step}, {"lm_loss", 5.0 - step * 0.1 - i}, {"moe", json::array()}}.dump() << "\n";
      m << json{{"step", 3}, {"eval_loss", 4.0 + i}}.dump() << "\n";
      const json params = {{"moe.router.tau", tau}, {"moe.capacity_factor", cf}};
      cells.push_back(
          {{"name", name}, {"run_dir", "cells/" + name}, {"params", params}, {"seed", 1}, {"status", "done"}});
      summary.push_back({{"params", params},
                         {"n", 1},
                         {"mean", {{"eval_loss", 4.0 + i}, {"overflow_ratio", 0.1 * i}}},
                         {"std", {{"eval_loss", 0.0}, {"overflow_ratio", 0.0}}}});
      ++i;
    }
  const json grid = json::array(
      {{{"key", "moe.router.tau"}, {"values", {0.5, 1.0}}}, {{"key", "moe.capacity_factor"}, {"values", {1.0, 2.0}}}});
  std::ofstream(sweep / "sweep.json") << json{{"grid", grid}, {"cells", cells}, {"summary", summary}}.dump();
  ASSERT_EQ(shell(std::string(MOE_BINARY) + " report " + quoted(sweep.string()) + " > /dev/null"), 0);
  const std::string html = read_text(sweep / "report.html");
  const json data = embedded_data(html);
  EXPECT_EQ(data["heatmaps"]["heatmap-eval-loss"]["values"], json({{4.0, 5.0}, {6.0, 7.0}}));
  EXPECT_EQ(data["heatmaps"]["heatmap-overflow"]["values"][1][1].get<double>(), 0.1 * 3);
  EXPECT_EQ(data["charts"]["chart-cells-loss"]["series"].size(), 4u);
  EXPECT_EQ(data["charts"]["chart-cells-eval"]["series"][2]["y"], json({6.0}));
  EXPECT_NE(html.find("<table id=\"summary\">"), std::string::npos);
  const std::string browser = chromium();
  if (browser.empty()) GTEST_SKIP() << "chromium is not installed";
  ASSERT_EQ(browse(browser, sweep / "report.html", "--dump-dom", dir.path() / "dom.html", dir.path() / "console.txt"),
            0);
  const std::string dom = read_text(dir.path() / "dom.html");
  EXPECT_EQ(read_text_if_any(dir.path() / "console.txt").find(":CONSOLE"), std::string::npos);
  for (const char* id : {"summary", "heatmap-eval-loss", "heatmap-overflow", "chart-cells-loss", "chart-cells-eval"})
    EXPECT_NE(dom.find("id=\"" + std::string(id) + "\""), std::string::npos) << id;
  EXPECT_EQ(polylines(dom, "chart-cells-loss").size(), 4u);
  // Each cell's eval curve is one point: drawn as a marker.
  const size_t eval_from = dom.find("id=\"chart-cells-eval\"");
  const std::string eval_part = dom.substr(eval_from, dom.find("</figure>", eval_from) - eval_from);
  size_t markers = 0;
  for (size_t at = eval_part.find("<circle class=\"marker\""); at != std::string::npos;
       at = eval_part.find("<circle class=\"marker\"", at + 1))
    ++markers;
  EXPECT_EQ(markers, 4u);
  const std::regex cell("<rect class=\"cell\" data-row=\"(\\d)\" data-col=\"(\\d)\" data-value=\"([^\"]+)\"");
  const size_t from = dom.find("id=\"heatmap-eval-loss\"");
  const std::string part = dom.substr(from, dom.find("</figure>", from) - from);
  int rects = 0;
  for (std::sregex_iterator it(part.begin(), part.end(), cell), end; it != end; ++it, ++rects)
    EXPECT_EQ(std::stod((*it)[3]), 4.0 + 2 * std::stoi((*it)[1]) + std::stoi((*it)[2]));
  EXPECT_EQ(rects, 4);
}

// 10,000 training lines (a line per step, two MoE layers of 8 experts, an evaluation every 100 steps): the page
// thins its curves and heatmap columns and stays under 3 MB. A cut last line (a run being written) is skipped.
TEST(Report, ALongRunsPageStaysSmallAndARunInProgressIsReported) {
  TempDir dir("report_long");
  const fs::path run = dir.path() / "run";
  fs::create_directories(run);
  {
    std::ofstream m(run / "metrics.jsonl");
    for (int step = 1; step <= 10000; ++step) {
      json layers = json::array();
      for (int l = 0; l < 2; ++l)
        layers.push_back({{"tokens_per_expert", {100 + step % 7, 120, 90, 110, 100, 95, 105, 80}},
                          {"dropped", 3},
                          {"rerouted", 0},
                          {"fallback", 0},
                          {"entropy", 1.9 + 1e-5 * step},
                          {"cv", 0.1},
                          {"overflow_ratio", 0.004},
                          {"load_max_over_mean", 1.2},
                          {"stability", 0.97}});
      m << json{{"step", step},
                {"loss", 3.0 - 1e-4 * step},
                {"lm_loss", 2.9 - 1e-4 * step},
                {"lr", 1e-3},
                {"grad_norm", 0.5},
                {"tokens_per_s", 12345.6},
                {"dead_experts", 0},
                {"moe", layers}}
               .dump()
        << "\n";
      if (step % 100 == 0) m << json{{"step", step}, {"eval_loss", 2.8}}.dump() << "\n";
    }
    m << "{\"step\": 10001, \"loss\": 1.";  // being written
  }
  ASSERT_EQ(shell(std::string(MOE_BINARY) + " report " + quoted(run.string()) + " > /dev/null"), 0);
  const uintmax_t bytes = fs::file_size(run / "report.html");
  std::cout << "[ size ] a 10,000-step run's page: " << bytes << " bytes\n";
  EXPECT_LT(bytes, 3u << 20);
  const json data = embedded_data(read_text(run / "report.html"));
  const json& lm = data["charts"]["chart-loss"]["series"][1];
  EXPECT_LE(lm["x"].size(), 1001u);
  EXPECT_EQ(lm["x"].back(), 10000) << "the last step is always kept";
  EXPECT_EQ(data["heatmaps"]["heatmap-load-layer-0"]["cols"].size(), 150u);
  EXPECT_EQ(data["heatmaps"]["heatmap-load-layer-0"]["cols"].back(), "10000");
}

}  // namespace
}  // namespace moe
