// The page of a run directory for `moe report`: metrics.jsonl read a line at a time into bounded curves and
// heatmaps (launch/sweep/report_sampling.h), so a run of any length takes bounded memory and makes a page of bounded
// size. A line or field of an unexpected type is skipped and counted, never fatal. Not here: opening the files
// (launch/sweep/report.cpp).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "launch/sweep/report_input.h"

namespace moe::report {

// Per-layer curves and heatmaps are drawn for at most this many MoE layers (the rest are counted in the page);
// a load heatmap has at most this many experts (rows) and cells.
inline constexpr size_t kMaxLayersDrawn = 32;
inline constexpr size_t kMaxExpertsDrawn = 1024;
inline constexpr size_t kMaxHeatmapCells = 38400;  // 150 columns of 256 experts
inline constexpr size_t kMaxAlertRows = 500;
inline constexpr size_t kMaxSourcesDrawn = 32;

// The page of the run whose metrics.jsonl is open on `metrics_fd` (-1: none yet), with its manifest.json (or
// null); what was skipped is added to `skipped` and said in the page.
std::string run_page(const std::string& title, int metrics_fd, const nlohmann::json& manifest, Skipped& skipped);

}  // namespace moe::report
