// The page of a sweep directory for `moe report`: sweep.json's summary table and grid heatmaps, and each cell's
// training and eval loss curves, read from the cell's metrics.jsonl a line at a time (fewer points per curve when
// there are many cells, so the page stays bounded). A cell whose metrics.jsonl cannot be read (a FIFO, a link, a
// run_dir outside the sweep) is skipped, counted and named; sweep.json itself must have moe sweep's shape. Not
// here: opening sweep.json (launch/sweep/report.cpp).
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "launch/sweep/report_input.h"

namespace moe::report {

// The points of all cells' curves of one chart together: each cell gets its share, at least 16 and at most
// kMaxPoints.
inline constexpr size_t kMaxSweepChartPoints = 200000;

// BadInput naming `file` and the field when `sweep` does not have the shape of moe sweep's sweep.json (an object
// with the arrays grid, of {"key": string, "values": array}, cells and summary).
void check_sweep_json(const nlohmann::json& sweep, const std::filesystem::path& file);

// The page of the sweep in `dir` (its sweep.json `sweep`, checked); what was skipped is added to `skipped`.
std::string sweep_page(const std::string& title, const std::filesystem::path& dir, const nlohmann::json& sweep,
                       Skipped& skipped);

}  // namespace moe::report
