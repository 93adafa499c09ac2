// Reading what a run writes, while it may still be writing: JSON Lines (metrics.jsonl, events.log) and whole
// JSON files (manifest.json, sweep.json, a sweep cell's status). Shared by moe sweep's results and moe report.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"

namespace moe {

// Every line of `path` that parses; a line still being written (or any unparsable one) is skipped, and a
// missing file gives none.
inline std::vector<nlohmann::json> read_json_lines(const std::filesystem::path& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string text; std::getline(in, text);) {
    try {
      lines.push_back(nlohmann::json::parse(text));
    } catch (const std::exception&) {
    }
  }
  return lines;
}

// The JSON document in `path`; null when it is missing or does not parse, unless `required` (then BadInput
// naming the file).
inline nlohmann::json read_json_file(const std::filesystem::path& path, bool required = false) {
  std::ifstream in(path);
  if (!in && !required) return nlohmann::json();
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    if (required) MOE_BAD_INPUT(path.string() << ": not valid JSON (" << e.what() << ")");
    return nlohmann::json();
  }
}

}  // namespace moe
