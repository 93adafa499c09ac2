// Read-only memory maps of token shards, and the xxh64 of a file read in bounded pieces. Not here: what
// the bytes mean (shards.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace moe::data {

// A whole file mapped read-only. The pages are the kernel's page cache: resident memory grows only with
// the pages a rank touches, and the map is advised for random access (a window per training sequence).
class MappedFile {
 public:
  MappedFile() = default;
  // Throws BadInput naming `path` when it cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

// The xxh64 (seed 0) of the file's bytes, read 1 MiB at a time with read(), not through a map, so that
// verifying a shard leaves no pages mapped into the process. `size_out`, when given, receives the size.
// Throws BadInput naming `path` when it cannot be read.
uint64_t file_xxh64(const std::string& path, uint64_t* size_out = nullptr);

// 16 lowercase hex digits, the form manifests hold hashes in.
std::string hex64(uint64_t value);
// The inverse of hex64; false when `text` is not 16 hex digits.
bool parse_hex64(const std::string& text, uint64_t* value);

}  // namespace moe::data
