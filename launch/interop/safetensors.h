// The safetensors file format, read and written directly: an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the tensors' raw little-endian bytes, back to back
// (https://github.com/huggingface/safetensors, "Format"). The writer streams: the header is fixed from the list of
// tensors before any data, then each tensor is written as it comes, so memory is one tensor's. The reader checks the
// whole header against the file before any tensor is read (a header that lies about offsets or dtypes, a truncated
// file), then reads one tensor at a time. Not here: which tensors a model has (hf_architectures.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moe {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32" | "BF16"
  std::vector<int64_t> shape;
  int64_t bytes() const;  // of its data
};

// Bytes of one element of a safetensors dtype ("F32" 4, "BF16" 2, ...); 0 for a dtype this code does not know.
int64_t safetensors_element_bytes(const std::string& dtype);

class SafetensorsWriter {
 public:
  // Creates `path` (which must not exist) and writes the header: the entries in this order, and __metadata__.
  SafetensorsWriter(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                    const nlohmann::json& metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next tensor's bytes, in the order of the entries: `name` and the size must be the next entry's.
  void write(const std::string& name, const void* data, size_t bytes);
  // After every tensor: flushes and fsyncs the file.
  void close();
  // The file's size once complete: 8 + header + data.
  int64_t size() const { return size_; }

 private:
  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  size_t next_ = 0;
  std::FILE* file_ = nullptr;
  int64_t size_ = 0;
};

// One tensor of a file being read: its dtype, shape and byte range in the data (after the header).
struct SafetensorsTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;
};

class SafetensorsFile {
 public:
  // Reads and checks the header: a length inside the file, JSON of the format, every dtype known, every byte range
  // the size its dtype and shape make, the ranges covering the data exactly. BadInput naming the file otherwise.
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
  // The tensor's values as fp32 (F32 as is, BF16 and F16 widened exactly), row-major.
  std::vector<float> read_f32(const std::string& name) const;

 private:
  std::string path_;
  int64_t data_start_ = 0;
  std::map<std::string, SafetensorsTensor> tensors_;
};

// The tensors of a model directory by name, and the file each is in: from model.safetensors.index.json's
// weight_map (every file it names must exist in `dir` and hold the tensors it is named for), or the one
// model.safetensors. BadInput naming the file and the tensor otherwise.
class SafetensorsModel {
 public:
  explicit SafetensorsModel(const std::string& dir);
  bool has(const std::string& name) const { return file_of_.count(name) > 0; }
  const SafetensorsTensor& tensor(const std::string& name) const;
  std::vector<float> read_f32(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> file_of_;
};

}  // namespace moe
