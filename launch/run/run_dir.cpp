// Run-directory checks, config.json and manifest.json, the metrics writer.
#include "launch/run/run_dir.h"

#include <cblas.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <CLI/Version.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/host.h"
#include "launch/config/memory.h"
#include "launch/run/run_files.h"
#include "moe_version.h"

namespace moe {
namespace fs = std::filesystem;

namespace {

// `path` itself when it exists, else its nearest existing ancestor: where creating it would start.
// `to_create` receives the names of the directories below it that creating `path` would make. Refuses
// what stat cannot see past (a component without search permission).
fs::path nearest_existing(const fs::path& path, const std::string& label, std::vector<std::string>& to_create) {
  for (fs::path p = path;; p = p.parent_path()) {
    const fs::path probe = p.empty() ? fs::path(".") : p;
    struct stat st {};
    if (::stat(probe.c_str(), &st) == 0) return probe;
    const bool missing = errno == ENOENT || errno == ENOTDIR || errno == ENAMETOOLONG;
    if (!p.filename().empty()) to_create.push_back(p.filename().string());
    if (!missing || p.empty() || p == p.parent_path())
      MOE_BAD_INPUT(label << ": cannot look at " << probe.string() << " (" << std::strerror(errno)
                          << "); choose a path this user can reach");
  }
}

}  // namespace

void check_dir_writable(const std::string& dir, const std::string& label) {
  const fs::path path(dir);
  const std::string fix = "; choose a writable location";
  // Leave room for the names written inside (e.g. tmp-step-00000001/peer-of-rank-00000.h5).
  constexpr size_t kRoomForNames = 64;
  if (path.string().size() + kRoomForNames >= PATH_MAX)
    MOE_BAD_INPUT(label << ": the path is " << path.string().size() << " characters; expected at most "
                        << PATH_MAX - kRoomForNames << " (PATH_MAX " << PATH_MAX
                        << ", less room for the files inside)");
  std::vector<std::string> to_create;
  const fs::path existing = nearest_existing(path, label, to_create);
  const bool is_self = existing == path;
  std::error_code ec;
  if (!fs::is_directory(existing, ec)) {
    if (is_self) MOE_BAD_INPUT(label << ": exists and is not a directory; expected a directory or a new path");
    MOE_BAD_INPUT(label << ": cannot be created because " << existing.string()
                        << " is not a directory; expected a directory or a new path");
  }
  const std::string where = is_self ? "it" : "its nearest existing parent " + existing.string();
  struct statvfs fs_info {};
  if (::statvfs(existing.c_str(), &fs_info) == 0 && (fs_info.f_flag & ST_RDONLY))
    MOE_BAD_INPUT(label << ": " << where << " is on a read-only file system" << fix);
  if (::access(existing.c_str(), W_OK | X_OK) != 0)
    MOE_BAD_INPUT(label << ": " << where << " is not writable (" << std::strerror(errno) << ")" << fix);
  // The directories still to be created must have names the file system accepts.
  long name_max = ::pathconf(existing.c_str(), _PC_NAME_MAX);
  if (name_max <= 0) name_max = NAME_MAX;
  for (const std::string& name : to_create)
    if (long(name.size()) > name_max)
      MOE_BAD_INPUT(label << ": the name '" << name.substr(0, 40) << "...' is " << name.size()
                          << " characters; the file system allows at most " << name_max << "; choose a shorter one");
}

void check_checkpoint_roots_writable(const std::string& checkpoint_root, const CheckpointConfig& checkpoint) {
  if (checkpoint.every <= 0) return;  // nothing will be written there
  check_dir_writable(checkpoint_root, "checkpoint.dir (" + checkpoint_root + ")");
  for (size_t i = 0; i < checkpoint.replicas.size(); ++i)
    check_dir_writable(checkpoint.replicas[i],
                       "checkpoint.replicas[" + std::to_string(i) + "] (" + checkpoint.replicas[i] + ")");
}

void check_run_dir_usable(const std::string& run_dir, bool overwrite) {
  const std::string label = "--run-dir " + run_dir;
  check_dir_writable(run_dir, label);
  std::error_code ec;
  const fs::path dir(run_dir);
  if (!fs::exists(dir, ec)) return;
  for (const char* name : {"metrics.jsonl", "config.json"})
    if (fs::exists(dir / name, ec) && !overwrite)
      MOE_BAD_INPUT(label << ": already holds a run (" << name
                          << ") and there is no checkpoint to resume from; pass --overwrite to start it "
                             "again, or choose another --run-dir");
}

namespace {
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) p = fs::absolute(path).lexically_normal();
  return p.has_filename() || p == p.root_path() ? p : p.parent_path();  // "/a/b/" -> "/a/b"
}

// Whether `inner` is `outer` or lies below it.
bool at_or_below(const fs::path& inner, const fs::path& outer) {
  auto a = inner.begin(), b = outer.begin();
  for (; b != outer.end() && !b->empty(); ++a, ++b)
    if (a == inner.end() || *a != *b) return false;
  return true;
}
}  // namespace

bool lies_inside(const std::string& path, const std::string& dir) {
  const fs::path p = resolved(path), d = resolved(dir);
  return p != d && at_or_below(p, d);
}

void check_checkpoint_placement(const std::string& run_dir, const std::string& checkpoint_root,
                                const CheckpointConfig& checkpoint) {
  const fs::path run = resolved(run_dir), root = resolved(checkpoint_root);
  const auto check = [&](const fs::path& p, const std::string& key, const std::string& value) {
    if (at_or_below(run, p))
      MOE_BAD_INPUT(key << " = \"" << value << "\" is " << p.string()
                        << (p == run ? ", the run directory itself"
                                     : ", a directory that holds the run directory " + run.string())
                        << "; checkpoints need a directory of their own (the default \"checkpoints\" lies inside the "
                           "run directory)");
  };
  check(root, "checkpoint.dir", checkpoint.dir);
  for (size_t i = 0; i < checkpoint.replicas.size(); ++i) {
    const std::string key = "checkpoint.replicas[" + std::to_string(i) + "]";
    const fs::path replica = resolved(checkpoint.replicas[i]);
    check(replica, key, checkpoint.replicas[i]);
    if (at_or_below(replica, root) || at_or_below(root, replica))
      MOE_BAD_INPUT(key << " = \"" << checkpoint.replicas[i] << "\" overlaps checkpoint.dir (" << root.string()
                        << "); a replica is a copy on another disk, in a directory of its own");
  }
}

std::string recorded_run_id(const std::string& run_dir) {
  const nlohmann::json m = read_json_regular(fs::path(run_dir) / "manifest.json", int64_t(1) << 24);
  return m.is_object() && m.contains("run_id") && m["run_id"].is_string() ? m["run_id"].get<std::string>() : "";
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

void write_run_files(const std::string& run_dir, const Config& config, const std::vector<std::string>& command_line,
                     int threads, const RankGrid& grid, const nlohmann::json& start, const nlohmann::json& data,
                     const std::string& run_id) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) MOE_RUN_FAILED("cannot create run directory " << run_dir << ": " << ec.message());
  replace_run_file((fs::path(run_dir) / "config.json").string(), config.resolved.dump(2) + "\n");
  nlohmann::json m;
  m["program"] = "moe";
  if (!run_id.empty()) m["run_id"] = run_id;
  m["git_commit"] = MOE_GIT_COMMIT;
  m["config_hash"] = config_hash(config);
  m["created"] = utc_now();
  m["versions"] = build_versions();
  m["layout"] = {{"world", grid.sizes().world}, {"tp", grid.sizes().tp}, {"pp", grid.sizes().pp},
                 {"dp", grid.sizes().dp},       {"ep", grid.sizes().ep}, {"edp", grid.edp()},
                 {"zero", config.optim.zero}};
  m["hosts"] = {host_name()};
  m["threads_per_rank"] = threads;
  const StageEstimate memory = largest_stage_estimate(config, grid.sizes().tp, grid.sizes().dp, grid.sizes().ep);
  m["memory"] = memory_json(memory.memory);
  if (grid.sizes().pp > 1) m["memory"]["pipeline_stage"] = memory.stage;
  m["command"] = command_line;
  m["start"] = start;
  if (!data.is_null()) m["data"] = data;
  m["history"] = "config_history.jsonl";
  replace_run_file((fs::path(run_dir) / "manifest.json").string(),
                   m.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) { file_ = open_run_file(path, FileMode::Truncate); }

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& line) { write_all(file_, line.dump() + "\n", path_); }

}  // namespace moe
