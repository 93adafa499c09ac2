// The safetensors file format, written directly: an 8-byte little-endian header length, a JSON header naming
// each tensor's dtype, shape and byte range, then the tensors' raw little-endian bytes, back to back in header
// order (https://github.com/huggingface/safetensors, "Format"). The writer streams: the header is fixed from
// the list of tensors before any data, then each tensor is written as it comes, so memory is one tensor's. Not
// here: which tensors a model has (export_hf.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
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

}  // namespace moe
