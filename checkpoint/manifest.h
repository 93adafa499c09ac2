// The manifest of one checkpoint (manifest.json, written last: its presence commits the checkpoint). It
// lists every file with its size and xxh64 checksum and every dataset each file holds (tensor name, global
// shape, the flat range it covers), and describes the run: step, kind (full or delta), the chain of
// checkpoints a delta needs, config, layout, versions. docs/checkpoint.md documents it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/shard_file.h"

namespace moe::ckpt {

inline constexpr const char* kFormat = "moe-checkpoint-1";
inline constexpr const char* kManifestName = "manifest.json";

struct DatasetEntry {
  std::string dataset;  // the HDF5 dataset path in the file
  std::string tensor;   // the tensor's global name, e.g. "params/layers.0.attn.wq"
  DType dtype = DType::F32;
  std::vector<int64_t> global_shape;
  int64_t flat_offset = 0, count = 0;  // the elements [flat_offset, flat_offset + count) of the tensor
  bool xor_delta = false;              // stored as the XOR of its bits with the previous checkpoint's
};

struct FileEntry {
  std::string name;        // relative to the checkpoint directory, e.g. "rank-00003.h5"
  int64_t rank = 0;        // the rank that wrote it
  bool peer_copy = false;  // a copy of `rank`'s file kept by another rank
  int64_t size = 0;
  std::string xxh64;  // 16 hex digits of the whole file
  std::vector<DatasetEntry> datasets;
};

struct Manifest {
  int64_t step = 0;
  std::string kind = "full";       // "full" | "delta"
  std::vector<std::string> chain;  // directory names from the full base to this one (this one last)
  // xxh64 of the manifest.json of each earlier member of the chain: a delta is only ever restored onto
  // the very checkpoints it was computed from (a later run may have rewritten a directory of that name).
  std::vector<std::string> chain_manifests;
  std::string created;
  nlohmann::json config;  // the resolved config of the run that wrote it
  nlohmann::json layout;  // world, dp, ep, zero
  nlohmann::json versions;
  std::vector<FileEntry> files;
};

nlohmann::json to_json(const Manifest& m);
nlohmann::json to_json(const FileEntry& f);
FileEntry file_entry_from_json(const nlohmann::json& j, const std::string& origin);
// Throws BadInput naming `origin` when a field is missing or of the wrong type.
Manifest manifest_from_json(const nlohmann::json& j, const std::string& origin);
// Writes dir/manifest.json through a temporary file, fsync and rename.
void write_manifest(const std::string& dir, const Manifest& m);
// Reads dir/manifest.json; BadInput naming the path if missing or malformed.
Manifest read_manifest(const std::string& dir);

const char* dtype_name(DType t);
DType dtype_from_name(const std::string& name, const std::string& origin);

// xxh64 of a file's bytes, as 16 hex digits; size in bytes. Throws BadInput naming the path if unreadable.
std::string file_xxh64(const std::string& path, int64_t* size = nullptr);
// fsync of a directory (so a rename inside it is durable).
void fsync_directory(const std::string& dir);

}  // namespace moe::ckpt
