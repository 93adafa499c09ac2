// The checks behind every verification of a checkpoint (docs/checkpoint.md, "What is verified"). One
// routine, verify_checkpoint (checkpointer.h), runs them for `moe ckpt ls|verify|export`, `--resume auto`
// and `--resume PATH`; the pieces here are what it is made of, for the callers that look further
// (`moe ckpt verify` also reads every chunk and the peer copies; node-local roots verify per host).
// Every refusal is BadInput with a message naming the checkpoint, the file and the field.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "parallel/communicator.h"

namespace moe::ckpt {

// What a run needs of a checkpoint: every tensor it restores, with its dtype and global shape.
struct TensorExpectation {
  std::string tensor;
  DType dtype = DType::F32;
  std::vector<int64_t> global_shape;
};

// A tensor as a checkpoint's pieces describe it.
struct TensorSummary {
  DType dtype = DType::F32;
  std::vector<int64_t> global_shape;
};

// "step-00000010" -> 10 (exactly the name the writer gives step 10); -1 for any other name.
int64_t step_of_checkpoint_name(const std::string& name);
std::string checkpoint_name(int64_t step);
std::string rank_file_name(int64_t rank);

// The manifest's own fields, without touching a file: format and kind, the step against `dir_name` and
// the chain, chain_manifests, file names (confined to the checkpoint directory, as the writer names
// them), and every dataset entry's fields.
void check_manifest(const Manifest& m, const std::string& dir_name, const std::string& origin);

// `path` is a regular file (lstat: not a symlink, FIFO, device or directory) of f.size bytes and xxh64 f.xxh64,
// checked in that order: the type before opening, the size before hashing. false with `problem` otherwise.
bool check_file(const std::string& path, const FileEntry& f, std::string* problem);

// The HDF5 file at `path` holds exactly the datasets `content` lists, each with the dtype, element count,
// global shape and flat offset the manifest gives (in 32-bit words for an XOR delta), and says step m.step.
void check_shard(const std::string& path, const FileEntry& content, const Manifest& m);

// Every tensor of `m` is tiled exactly once by the pieces of its primary files, all pieces agreeing on
// dtype and global shape; returns the tensors.
std::map<std::string, TensorSummary> check_coverage(const Manifest& m, const std::string& dir);

// The checkpoint's tensors are exactly those `expected` names, each with the dtype and global shape given.
void check_expected(const std::map<std::string, TensorSummary>& tensors, const std::vector<TensorExpectation>& expected,
                    const std::string& dir);

// Collective: the union of what every rank's `expected` names (sorted by tensor), the same on every rank.
std::vector<TensorExpectation> gather_expectations(Communicator& world, const std::vector<TensorExpectation>& mine);

}  // namespace moe::ckpt
