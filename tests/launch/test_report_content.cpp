// `moe report` on hostile and odd content. Names from sweep.json and metrics.jsonl (grid keys and values, cell
// names, eval sources, alert kinds) made to close the data's <script>, open a comment, inject an element or an
// attribute: the page's DOM in headless Chromium has no element or script from them and its embedded data reads
// back intact. Lines of unexpected types, lines that are not JSON and a line past the length bound are skipped
// and counted (exit 0); 200,000 lines make a page no larger than 10,000 do, within a memory limit the whole file
// parsed at once would pass, and a one-step spike is still drawn.
#include <gtest/gtest.h>

#include <fstream>

#include "report_harness.h"

namespace moe {
namespace {
using namespace report_test;

const std::vector<std::string> kHostile = {
    "</script><script>document.body.setAttribute('data-pwned','1')</script>",
    "<!--<script>",
    "<img src=x onerror=\"document.body.setAttribute('data-pwned','2')\">",
    "\" onmouseover=\"document.body.setAttribute('data-pwned','3')",
    "' autofocus onfocus='document.body.setAttribute(`data-pwned`,4)",
    "a\u2028b\u2029c &amp; ]]> <![CDATA[ </SCRIPT >",
    "<style>body{display:none}</style><link rel=stylesheet href=http://example.com/x.css>"};

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// In a page or its DOM: one script element (the data), no element or attribute from the hostile names.
void expect_no_injection(const std::string& html, const std::string& what) {
  EXPECT_EQ(count(html, "<script"), 1u) << what;
  EXPECT_EQ(count(html, "<SCRIPT"), 0u) << what;
  EXPECT_EQ(count(html, "<img"), 0u) << what;
  EXPECT_EQ(count(html, "<link"), 0u) << what;
  EXPECT_EQ(count(html, "<!--"), 0u) << what;
  EXPECT_EQ(count(html, "<style"), 1u) << what;
  EXPECT_EQ(count(html, "data-pwned=\""), 0u) << what;
  EXPECT_EQ(count(html, "<body data-pwned"), 0u) << what;
}

// The page in Chromium: no console message, no injection, and the data of the DOM equal to the page's.
void expect_browser_sees_text(const fs::path& page, const fs::path& dir) {
  const std::string browser = chromium();
  if (browser.empty()) GTEST_SKIP() << "chromium is not installed";
  ASSERT_EQ(browse(browser, page, "--dump-dom", dir / "dom.html", dir / "console.txt"), 0)
      << read_text_if_any(dir / "console.txt");
  const std::string dom = read_text(dir / "dom.html");
  EXPECT_EQ(read_text_if_any(dir / "console.txt").find(":CONSOLE"), std::string::npos)
      << read_text_if_any(dir / "console.txt");
  expect_no_injection(dom, "the DOM");
  EXPECT_EQ(embedded_data(dom), embedded_data(read_text(page)));
}

TEST(ReportContent, HostileNamesInASweepAreTextAndTheDataReadsBackIntact) {
  TempDir dir("report_hostile_sweep");
  const fs::path sweep = dir.path() / "sw";
  json cells = json::array(), summary = json::array(), values = json::array();
  for (size_t i = 0; i < kHostile.size(); ++i) {
    const std::string name = "c" + std::to_string(i);
    fs::create_directories(sweep / "cells" / name);
    std::ofstream(sweep / "cells" / name / "metrics.jsonl") << json{{"step", 1}, {"lm_loss", 2.0 + i}}.dump() << "\n";
    const json params = {{kHostile[0], kHostile[i]}, {kHostile[1], double(i)}};
    cells.push_back({{"name", kHostile[i]}, {"run_dir", "cells/" + name}, {"params", params}, {"status", kHostile[i]}});
    summary.push_back({{"params", params}, {"n", kHostile[i]}, {"mean", {{"eval_loss", 1.0 + i}}}, {"std", 0}});
    values.push_back(kHostile[i]);
  }
  const json grid = json::array(
      {{{"key", kHostile[0]}, {"values", values}}, {{"key", kHostile[1]}, {"values", json::array({0.0, 1.0})}}});
  const json doc = {{"grid", grid}, {"cells", cells}, {"summary", summary}, {"seeds", {1, 2}}};
  std::ofstream(sweep / "sweep.json") << doc.dump();
  ASSERT_EQ(moe_report(quoted(sweep.string()), dir.path()), 0) << read_text_if_any(dir.path() / "report.stderr");
  const std::string html = read_text(sweep / "report.html");
  expect_no_injection(html, "the page");
  const json data = embedded_data(html);
  ASSERT_TRUE(data.is_object()) << "the embedded data does not parse";
  EXPECT_EQ(data["summary"], summary) << "the summary reads back intact";
  EXPECT_EQ(data["heatmaps"]["heatmap-eval-loss"]["rows"][0], json(kHostile[0]).dump());
  EXPECT_EQ(data["charts"]["chart-cells-loss"]["series"].size(), kHostile.size());
  expect_browser_sees_text(sweep / "report.html", dir.path());
  // The table's header in the DOM is the key as text.
  const std::string dom = read_text(dir.path() / "dom.html");
  EXPECT_NE(dom.find("<th>&lt;/script&gt;&lt;script&gt;"), std::string::npos);
}

TEST(ReportContent, HostileNamesInARunAreTextAndTheDataReadsBackIntact) {
  TempDir dir("report_hostile_run");
  const fs::path run = dir.path() / "run";
  fs::create_directories(run);
  json sources = json::object(), alerts = json::array();
  for (size_t i = 0; i < kHostile.size(); ++i) {
    sources[kHostile[i]] = 2.0 + double(i);
    alerts.push_back({{"kind", kHostile[i]}, {"layer", 0}, {"value", 1.0}, {"threshold", 0.5}, {"since_step", 1}});
  }
  {
    std::ofstream m(run / "metrics.jsonl");
    m << json{{"step", 1}, {"loss", 3.0}, {"lm_loss", 3.0}, {"moe", json::array()}, {"alerts", alerts}}.dump() << "\n";
    m << json{{"step", 1}, {"eval_loss", 2.5}, {"eval_loss_by_source", sources}}.dump() << "\n";
  }
  std::ofstream(run / "manifest.json") << json{{"config_hash", kHostile[0]}, {"git_commit", kHostile[2]}}.dump();
  ASSERT_EQ(moe_report(quoted(run.string()), dir.path()), 0) << read_text_if_any(dir.path() / "report.stderr");
  const std::string html = read_text(run / "report.html");
  expect_no_injection(html, "the page");
  const json data = embedded_data(html);
  ASSERT_TRUE(data.is_object()) << "the embedded data does not parse";
  std::vector<std::string> names;
  for (const json& s : data["charts"]["chart-eval"]["series"]) names.push_back(s["name"]);
  for (const std::string& h : kHostile) EXPECT_NE(std::find(names.begin(), names.end(), "eval " + h), names.end()) << h;
  EXPECT_EQ(count(html, "<tr><td>1</td><td class=\"l\">"), kHostile.size()) << "one alert row each";
  expect_browser_sees_text(run / "report.html", dir.path());
}

TEST(ReportContent, LinesOfUnexpectedTypesAreSkippedAndCounted) {
  TempDir dir("report_odd_lines");
  const fs::path run = dir.path() / "run";
  fs::create_directories(run);
  {
    std::ofstream m(run / "metrics.jsonl", std::ios::binary);
    // Odd lines: JSON, but no object with a number step.
    for (const char* line : {R"({"step":"x","lm_loss":1,"moe":[]})", R"({"loss":[1]})", "[]", "3", "\"text\"", "null",
                             R"({"step":null})", R"({"step":[1],"eval_loss":2})"})
      m << line << "\n";
    // Not JSON: a cut line, a NUL inside, invalid UTF-8, two values on a line.
    m << "{\"step\":"
      << "\n"
      << std::string("{\"step\":1,\0\"x\":1}", 17) << "\n"
      << "{\"step\":1,\"s\":\"\xff\xfe\"}\n"
      << "{} {}\n";
    // Fields of unexpected types (9 with the alerts below), on lines otherwise used.
    m << R"({"step":1,"loss":[1],"lm_loss":2.0,"moe":"x"})"
      << "\n";
    m << R"({"step":2,"loss":1.5,"lm_loss":1.5,"lr":"0.1","moe":[5,{"tokens_per_expert":"x","entropy":"e"}]})"
      << "\n";
    m << R"({"step":3,"eval_loss":{},"eval_loss_by_source":[]})"
      << "\n";
    // A line past the length bound, then good lines.
    m << R"({"step":4,"pad":")" << std::string(3 << 20, 'a') << "\"}\n";
    m << R"({"step":5,"loss":1.0,"lm_loss":1.0,"moe":[{"tokens_per_expert":[1,3],"entropy":0.5}],"alerts":7})"
      << "\n";
    m << R"({"step":6,"eval_loss":0.9,"eval_loss_by_source":{"a":0.8}})"
      << "\n";
  }
  ASSERT_EQ(moe_report(quoted(run.string()), dir.path()), 0) << read_text_if_any(dir.path() / "report.stderr");
  const std::string err = read_text_if_any(dir.path() / "report.stderr");
  EXPECT_NE(err.find("1 line longer than 1048576 bytes, 4 lines not JSON, 8 lines not an object with a number "
                     "\"step\", 9 fields of an unexpected type"),
            std::string::npos)
      << err;
  const std::string html = read_text(run / "report.html");
  const json data = embedded_data(html);
  EXPECT_EQ(data["skipped"], json({{"long_lines", 1}, {"not_json", 4}, {"odd_lines", 8}, {"odd_fields", 9}}));
  EXPECT_NE(html.find("skipped: 1 line longer"), std::string::npos) << "the page says it too";
  EXPECT_EQ(data["charts"]["chart-loss"]["series"][1]["y"], json({2.0, 1.5, 1.0})) << "lm_loss of the used lines";
  EXPECT_EQ(data["charts"]["chart-loss"]["series"][0]["y"], json({1.5, 1.0}));
  EXPECT_EQ(data["charts"]["chart-eval"]["series"][0]["y"], json({0.9}));
  EXPECT_EQ(data["heatmaps"]["heatmap-load-layer-0"]["values"], json({{0.25}, {0.75}}));
}

// 200,000 lines (a line per step, two MoE layers of 8 experts, an evaluation every 100 steps, one spike).
TEST(ReportContent, ALargeMetricsFileIsStreamedIntoAPageOfBoundedSize) {
  TempDir dir("report_large");
  const fs::path run = dir.path() / "run";
  fs::create_directories(run);
  constexpr int kSteps = 200000, kSpike = 123457;
  {
    std::ofstream m(run / "metrics.jsonl");
    for (int step = 1; step <= kSteps; ++step) {
      char layer[200];
      std::snprintf(layer, sizeof layer,
                    R"({"tokens_per_expert":[%d,120,90,110,100,95,105,80],"dropped":3,"entropy":%.6f,"cv":0.1})",
                    100 + step % 7, 1.9 + 1e-6 * step);
      m << "{\"step\":" << step << ",\"loss\":" << (step == kSpike ? 100.0 : 3.0 - 1e-5 * step)
        << ",\"lm_loss\":2.9,\"lr\":0.001,\"moe\":[" << layer << "," << layer << "]}\n";
      if (step % 100 == 0) m << "{\"step\":" << step << ",\"eval_loss\":2.8}\n";
    }
  }
  // The report's peak resident memory, read by python3's resource module (an address-space limit would count
  // the GPU libraries a CUDA build maps): the lines parsed and held at once took several GB.
  const fs::path peak = dir.path() / "peak_kib.txt";
  ASSERT_EQ(shell("python3 -c 'import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], "
                  "stdout=subprocess.DEVNULL).returncode; "
                  "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r)' timeout 300 " +
                  std::string(MOE_BINARY) + " report " + quoted(run.string()) + " > " + quoted(peak.string()) + " 2> " +
                  quoted((dir.path() / "err.txt").string())),
            0)
      << read_text_if_any(dir.path() / "err.txt");
  EXPECT_LT(std::stoll(read_text(peak)), 512 << 10) << "KiB at the peak: more than 512 MiB";
  const uintmax_t bytes = fs::file_size(run / "report.html");
  EXPECT_LT(bytes, 3u << 20) << "no larger than a 10,000-step run's page";
  const json data = embedded_data(read_text(run / "report.html"));
  for (const auto& [id, chart] : data["charts"].items())
    for (const json& s : chart["series"]) EXPECT_LE(s["x"].size(), 1000u) << id;
  const json& loss = data["charts"]["chart-loss"]["series"][0];
  EXPECT_EQ(loss["x"].front(), 1);
  EXPECT_EQ(loss["x"].back(), kSteps) << "the last step is always kept";
  EXPECT_NE(std::find(loss["x"].begin(), loss["x"].end(), json(kSpike)), loss["x"].end()) << "the spike is drawn";
  EXPECT_EQ(data["heatmaps"]["heatmap-load-layer-1"]["cols"].size(), 150u);
  EXPECT_EQ(data["heatmaps"]["heatmap-load-layer-1"]["cols"].back(), std::to_string(kSteps));
  EXPECT_EQ(data["charts"]["chart-eval"]["series"][0]["x"].back(), kSteps);
}

}  // namespace
}  // namespace moe
