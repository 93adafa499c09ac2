// One checkpoint shard file in HDF5: named numeric datasets, each a part of a global tensor (a hyperslab
// and a range of its row-major order, slab.h) with where it lies as attributes, plus file-level string
// attributes. What goes into which file, the manifest and the commit by rename belong
// to the checkpoint layer above; this file only writes and reads one file.
//
// Every dataset is chunked and carries a Fletcher-32 checksum per chunk, so damaged data fail on read
// instead of loading silently. Files use the HDF5 1.8 format (readable by h5py and any HDF5 >= 1.8; its
// object headers carry checksums too). Not thread-safe: HDF5 here is a serial build, so one thread must
// own every call on every ShardWriter and ShardReader of the process.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/slab.h"

namespace moe::ckpt {

enum class DType { F32, F64, I64, U32 };
const char* dtype_name(DType t);  // "f32", "f64", "i64", "u32"

// Row-major flattening helpers used by the checkpoint layer. numel({}) == 1 (a scalar).
int64_t numel(const std::vector<int64_t>& shape);

// A chunk holds at most this many elements: the stored shape is cut along its leading dimensions.
inline constexpr int64_t kShardChunkElements = int64_t{1} << 20;

struct DatasetInfo {
  std::string name;  // e.g. "params/layers.0.attn.wq" (slashes make groups)
  DType dtype;
  std::vector<int64_t> shape;         // the stored (local) shape
  std::vector<int64_t> global_shape;  // the full tensor's shape (attribute "global_shape")
  // Where the stored elements lie in the global tensor. Written by write(..., Slab): the attributes
  // "slab_start", "slab_shape" and "range" ([begin, count]). Written the "moe-checkpoint-1" way (attribute
  // "flat_offset": the stored elements are [flat_offset, flat_offset + numel) of the tensor's flattening),
  // or by another tool (no attributes: the whole tensor), it is read as that range of the whole tensor.
  Slab slab;
  bool has_slab = false;    // the dataset has the slab attributes
  int64_t flat_offset = 0;  // attribute "flat_offset" ("moe-checkpoint-1"); 0 when absent
  int64_t numel() const { return ckpt::numel(shape); }
};

class ShardWriter {  // one file; not thread-safe: one thread owns all calls (HDF5 is not thread-safe)
 public:
  explicit ShardWriter(const std::string& path);  // creates; refuses (MOE_FAIL) to overwrite an existing file
  ~ShardWriter();                                 // closes if open (no throw)
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // data: numel(shape) elements. compress: HDF5 shuffle + deflate (level 4) — for XOR deltas.
  // A scalar (shape {}) is stored as shape {1}; ShardReader reports it as {} again when global_shape is {}.
  // The "moe-checkpoint-1" form (attributes global_shape and flat_offset), also that of `moe ckpt export`.
  void write(const std::string& name, DType dtype, const void* data, const std::vector<int64_t>& shape,
             const std::vector<int64_t>& global_shape, int64_t flat_offset, bool compress = false);
  // A part of a global tensor: slab.count elements, stored in slab.stored_shape(), with the attributes
  // global_shape, slab_start, slab_shape and range.
  void write(const std::string& name, DType dtype, const void* data, const Slab& slab, bool compress = false);
  void set_attribute(const std::string& key, const std::string& value);  // file-level string attribute
  void close();  // flushes, closes, then fsyncs the file (open + fsync + close) so it is on disk
  const std::string& path() const { return path_; }

 private:
  void check_writable(const std::string& name);

  std::string path_;
  int64_t file_ = -1;  // hid_t; -1 once closed
  std::set<std::string> names_written_;
};

class ShardReader {
 public:
  explicit ShardReader(const std::string& path);  // read-only; BadInput naming the path if not a readable HDF5 file
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const std::vector<DatasetInfo>& datasets() const { return datasets_; }  // with attributes, sorted by name
  bool has(const std::string& name) const;
  const DatasetInfo& info(const std::string& name) const;  // BadInput naming file and dataset if absent
  // Elements [begin, begin + count) of the dataset's stored (flattened) elements, converted to nothing:
  // dtype must match (MOE_CHECK). Verifies the Fletcher-32 checksums of the chunks read (HDF5 does it on
  // read); a mismatch is BadInput naming the file and the dataset.
  void read(const std::string& name, DType dtype, int64_t begin, int64_t count, void* out) const;
  std::string attribute(const std::string& key) const;  // file-level; "" if absent
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int64_t file_ = -1;  // hid_t
  std::vector<DatasetInfo> datasets_;
};

}  // namespace moe::ckpt
