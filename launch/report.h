// `moe report PATH [--out FILE.html]`: a run directory or a sweep directory as one self-contained HTML page
// (inline SVG charts from launch/report_svg.h, inline CSS, no script, nothing fetched), with the plotted data
// also embedded as JSON (<script type="application/json" id="moe-report-data">). It reads only metrics.jsonl,
// manifest.json and sweep.json, so it works on a run or sweep still in progress. docs/cli.md describes it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace moe {

struct ReportOptions {
  std::string path;
  std::string out;  // default: PATH/report.html
};

CLI::App* add_report_command(CLI::App& app, ReportOptions& options);

// Curves are thinned to at most this many points and the load heatmaps to at most this many columns, so a
// long run's page stays small (a 10,000-step run with a line per step: well under 3 MB).
inline constexpr size_t kReportMaxPoints = 1000;
inline constexpr size_t kReportMaxColumns = 150;

// The page of a run directory (its metrics.jsonl lines, its manifest.json or null).
std::string run_report_html(const std::string& title, const std::vector<nlohmann::json>& lines,
                            const nlohmann::json& manifest);
// The page of a sweep directory (its sweep.json, and each cell's metrics.jsonl lines by cell name).
std::string sweep_report_html(const std::string& title, const nlohmann::json& sweep,
                              const std::vector<std::vector<nlohmann::json>>& cell_lines);

// Writes the page; BadInput (nothing written) when PATH is neither a run nor a sweep directory, or --out cannot
// be written. Prints where the page went.
void run_report(const ReportOptions& options);

}  // namespace moe
