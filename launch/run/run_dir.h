// The run directory (docs/cli.md): resolved config.json, manifest.json, metrics.jsonl. Deciding whether
// a directory may be used is separate from writing to it, so every refusal happens before anything
// is written or overwritten.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/config/config.h"
#include "parallel/rank_grid.h"

namespace moe {

// Refuses (BadInput) a run directory that already holds a run (config.json or metrics.jsonl) unless
// `overwrite`, and one that check_dir_writable refuses. Writes nothing.
void check_run_dir_usable(const std::string& run_dir, bool overwrite);

// Refuses (BadInput, the message starting with `label`) a directory that the program could not create
// or write: the path or its nearest existing ancestor is not a directory, is on a read-only file system
// (statvfs, so root is refused too), is not writable or searchable (access), or a name still to be
// created is longer than the file system allows. Creates nothing, so a refusal leaves nothing behind.
void check_dir_writable(const std::string& dir, const std::string& label);

// check_dir_writable for the checkpoint root (checkpoint.dir as resolved against the run directory)
// and each of checkpoint.replicas; nothing when checkpoint.every is 0.
void check_checkpoint_roots_writable(const std::string& checkpoint_root, const CheckpointConfig& checkpoint);

// Refuses (BadInput naming the key) a checkpoint root or replica that is the run directory itself or a
// directory above it (where a fresh start's deletions would reach the run's own files), and a replica that is
// the root. Looks at paths only (resolving `..` and symbolic links), whatever checkpoint.every says.
void check_checkpoint_placement(const std::string& run_dir, const std::string& checkpoint_root,
                                const CheckpointConfig& checkpoint);
// Whether `path` lies strictly inside `dir` (both resolved as check_checkpoint_placement does).
bool lies_inside(const std::string& path, const std::string& dir);
// The run id recorded in RUN_DIR/manifest.json, "" when there is none (a new run directory, or one written
// before run ids). Reads only a small regular file; never fails.
std::string recorded_run_id(const std::string& run_dir);

// Creates the directory and writes config.json (the resolved config) and manifest.json (with the memory
// estimate of launch/config/memory.h for this layout).
// `start`: this start of the run (step, checkpoint resumed from, changes), recorded as manifest.json's "start".
// `data`: where the training data came from (data::data_provenance), recorded as manifest.json's "data".
// `run_id`: the run's identity (checkpoint/root.h), recorded as manifest.json's "run_id".
void write_run_files(const std::string& run_dir, const Config& config, const std::vector<std::string>& command_line,
                     int threads, const RankGrid& grid, const nlohmann::json& start = nlohmann::json::object(),
                     const nlohmann::json& data = nlohmann::json(), const std::string& run_id = "");

// The config's identity: xxh64 of its canonical JSON, as 16 hex digits.
std::string config_hash(const Config& config);
// Versions of the compiler and the libraries linked, for manifest.json.
nlohmann::json build_versions();

// Appends one JSON object per line and flushes each, so a crash loses at most the line being written.
class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const nlohmann::json& line);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace moe
