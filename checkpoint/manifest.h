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

// The format written; "moe-checkpoint-1" (pieces as flat ranges of the whole tensor) is still read.
inline constexpr const char* kFormat = "moe-checkpoint-2";
inline constexpr const char* kFormatV1 = "moe-checkpoint-1";
inline constexpr const char* kManifestName = "manifest.json";

struct DatasetEntry {
  std::string dataset;  // the HDF5 dataset path in the file
  std::string tensor;   // the tensor's global name, e.g. "params/layers.0.attn.wq"
  DType dtype = DType::F32;
  // Where its elements lie in the tensor: "global_shape", "start" and "shape" (the hyperslab) and "range"
  // ([begin, count] of the hyperslab's row-major order). A "moe-checkpoint-1" entry ("flat_offset",
  // "count") is read as Slab::flat: the whole tensor's box, the range [flat_offset, flat_offset + count).
  Slab slab;
  bool xor_delta = false;  // stored as the XOR of its bits with the previous checkpoint's
  int64_t count() const { return slab.count; }
  const std::vector<int64_t>& global_shape() const { return slab.global_shape; }
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
  int format = 2;  // 1: read from a "moe-checkpoint-1" manifest (its files use flat_offset attributes)
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
  // Where the training data came from (launch: data_provenance); null in checkpoints written before it.
  nlohmann::json data;
  // The run that wrote it (root.h); "" in checkpoints written before run ids. Only that run resumes it
  // unless a user names it (--resume PATH).
  std::string run_id;
  std::vector<FileEntry> files;
};

nlohmann::json to_json(const Manifest& m);
nlohmann::json to_json(const FileEntry& f);
// format: of the manifest the entry comes from (1 or 2).
FileEntry file_entry_from_json(const nlohmann::json& j, const std::string& origin, int format = 2);
// Throws BadInput naming `origin` when a field is missing or of the wrong type.
Manifest manifest_from_json(const nlohmann::json& j, const std::string& origin);
// Writes dir/manifest.json through a temporary file, fsync and rename.
void write_manifest(const std::string& dir, const Manifest& m);
// Reads dir/manifest.json; BadInput naming the path if missing or malformed.
Manifest read_manifest(const std::string& dir);

DType dtype_from_name(const std::string& name, const std::string& origin);

// xxh64 of a file's bytes, as 16 hex digits; size in bytes. Throws BadInput naming the path if unreadable.
std::string file_xxh64(const std::string& path, int64_t* size = nullptr);
// fsync of a directory (so a rename inside it is durable), and of a file's bytes.
void fsync_directory(const std::string& dir);
void fsync_file(const std::string& path);

}  // namespace moe::ckpt
