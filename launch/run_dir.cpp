// Run-directory checks, config.json and manifest.json, the metrics writer.
#include "launch/run_dir.h"

#include <cblas.h>
#include <unistd.h>
#include <xxhash.h>

#include <CLI/Version.hpp>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/host.h"
#include "moe_version.h"

namespace moe {
namespace fs = std::filesystem;

void check_run_dir_usable(const std::string& run_dir, bool overwrite) {
  std::error_code ec;
  const fs::path dir(run_dir);
  if (!fs::exists(dir, ec)) {
    // The directory will be created: its nearest existing ancestor must be a directory.
    fs::path ancestor = dir.parent_path();
    while (!ancestor.empty() && !fs::exists(ancestor, ec)) ancestor = ancestor.parent_path();
    if (!ancestor.empty() && !fs::is_directory(ancestor, ec))
      MOE_BAD_INPUT("--run-dir " << run_dir << ": cannot be created because " << ancestor.string()
                                 << " is not a directory; expected a directory or a new path");
    return;
  }
  if (!fs::is_directory(dir, ec))
    MOE_BAD_INPUT("--run-dir " << run_dir << ": exists and is not a directory; expected a directory or a new path");
  for (const char* name : {"metrics.jsonl", "config.json"})
    if (fs::exists(dir / name, ec) && !overwrite)
      MOE_BAD_INPUT("--run-dir " << run_dir << ": already holds a run (" << name
                                 << ") and there is no checkpoint to resume from; pass --overwrite to start it "
                                    "again, or choose another --run-dir");
}

std::string config_hash(const Config& config) {
  const std::string canonical = config.resolved.dump();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(XXH64(canonical.data(), canonical.size(), 0)));
  return hex;
}

nlohmann::json build_versions() {
  nlohmann::json v;
  v["compiler"] = std::string("gcc ") + __VERSION__;
  v["openblas"] = openblas_get_config();
  v["nlohmann_json"] = std::to_string(NLOHMANN_JSON_VERSION_MAJOR) + "." + std::to_string(NLOHMANN_JSON_VERSION_MINOR) +
                       "." + std::to_string(NLOHMANN_JSON_VERSION_PATCH);
  v["cli11"] = CLI11_VERSION;
  v["xxhash"] = std::to_string(XXH_versionNumber());
  return v;
}

namespace {
void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  if (!out) MOE_FAIL("cannot write " << path.string());
}
}  // namespace

void write_run_files(const std::string& run_dir, const Config& config, const std::vector<std::string>& command_line,
                     int threads, const RankGrid& grid) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) MOE_FAIL("cannot create run directory " << run_dir << ": " << ec.message());
  write_file(fs::path(run_dir) / "config.json", config.resolved.dump(2) + "\n");
  nlohmann::json m;
  m["program"] = "moe";
  m["git_commit"] = MOE_GIT_COMMIT;
  m["config_hash"] = config_hash(config);
  m["created"] = utc_now();
  m["versions"] = build_versions();
  m["layout"] = {{"world", grid.sizes().world}, {"tp", grid.sizes().tp}, {"pp", grid.sizes().pp},
                 {"dp", grid.sizes().dp},       {"ep", grid.sizes().ep}, {"edp", grid.edp()},
                 {"zero", config.optim.zero}};
  m["hosts"] = {host_name()};
  m["threads_per_rank"] = threads;
  m["command"] = command_line;
  write_file(fs::path(run_dir) / "manifest.json", m.dump(2) + "\n");
}

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "w");
  if (!file_) MOE_FAIL("cannot open " << path << " for writing");
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& line) {
  const std::string text = line.dump() + "\n";
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0)
    MOE_FAIL("cannot write " << path_);
}

}  // namespace moe
