// `moe report PATH [--out FILE.html]`: a run directory or a sweep directory as one self-contained HTML page
// (inline SVG charts from launch/sweep/report_svg.h, inline CSS, no script, nothing fetched), with the plotted data
// also embedded as JSON (<script type="application/json" id="moe-report-data">). It reads only metrics.jsonl,
// manifest.json and sweep.json (and the cells' metrics.jsonl), within bounds (launch/sweep/report_input.h), so it works
// on a run or sweep still in progress; it writes only --out (launch/sweep/report_output.h). docs/cli.md describes it.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace moe {

struct ReportOptions {
  std::string path;
  std::string out;  // default: PATH/report.html
};

CLI::App* add_report_command(CLI::App& app, ReportOptions& options);

// Writes the page; BadInput (nothing written) when PATH is neither a run nor a sweep directory, an input is not a
// regular file, or --out may not be written. Prints where the page went, and on stderr what was skipped.
void run_report(const ReportOptions& options);

}  // namespace moe
