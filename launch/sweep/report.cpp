// `moe report` (launch/sweep/report.h): which directory it is, its inputs, the page, and the command.
#include "launch/sweep/report.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "launch/sweep/report_input.h"
#include "launch/sweep/report_output.h"
#include "launch/sweep/report_run.h"
#include "launch/sweep/report_sweep.h"

namespace moe {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A whole-run input that is there but may not be read (a FIFO, a directory, a link): refused.
report::Fd open_run_input(const fs::path& path) {
  std::string problem;
  report::Fd fd = report::open_regular(path, problem);
  if (!problem.empty()) MOE_BAD_INPUT(path.string() << ": " << problem << "; expected a regular file");
  return fd;
}

std::string run_html(const fs::path& path, const std::string& title, report::Skipped& skipped) {
  const report::Fd metrics = open_run_input(path / "metrics.jsonl");
  if (metrics.get() < 0) MOE_BAD_INPUT("moe report " << path.string() << ": metrics.jsonl is gone");
  const json manifest = report::read_json_document(path / "manifest.json", false);
  return report::run_page(title, metrics.get(), manifest, skipped);
}

}  // namespace

void run_report(const ReportOptions& o) {
  const fs::path path = o.path;
  std::error_code ec;
  if (!fs::is_directory(path, ec))
    MOE_BAD_INPUT("moe report " << o.path
                                << ": expected a run directory (with metrics.jsonl) or a sweep directory "
                                   "(with sweep.json)");
  const bool sweep = fs::exists(fs::symlink_status(path / "sweep.json", ec));
  if (!sweep && !fs::exists(fs::symlink_status(path / "metrics.jsonl", ec)))
    MOE_BAD_INPUT("moe report " << o.path << ": holds neither metrics.jsonl (a run) nor sweep.json (a sweep)");
  const fs::path out = o.out.empty() ? path / "report.html" : fs::path(o.out);
  report::check_output(out, path);
  const std::string title = (sweep ? "Sweep " : "Run ") + fs::absolute(path).lexically_normal().string();
  report::Skipped skipped;
  const std::string html =
      sweep ? report::sweep_page(title, path, report::read_json_document(path / "sweep.json", true), skipped)
            : run_html(path, title, skipped);
  report::write_output(out, path, html);
  if (skipped.any()) std::fprintf(stderr, "moe report: skipped %s\n", skipped.text().c_str());
  for (const std::string& why : skipped.cell_reasons) std::fprintf(stderr, "moe report: skipped %s\n", why.c_str());
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
