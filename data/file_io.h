// Reading the files the data module is named: opening only regular files (a FIFO or a device never
// blocks or streams forever), small files read whole up to a bound, token shards read with pread, and
// the xxh64 of a file read in bounded pieces. Not here: what the bytes mean (shards.h, prep_input.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace moe::data {

// An open file descriptor, closed when it goes out of scope.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& other) noexcept;
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  // Gives up ownership: the descriptor is no longer closed here.
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

// Opens `path` read-only if it is a regular file. O_NONBLOCK while opening, so a FIFO with no writer
// does not block; the kind is checked on the descriptor (fstat), so a name swapped after a check is
// caught too. `size`, when given, receives the file's size. Throws BadInput "WHO: ..." naming what the
// path is (missing, a FIFO, a device, a directory...).
UniqueFd open_regular_file(const std::string& path, const std::string& who, uint64_t* size = nullptr);

// The whole of a regular file of at most `max_bytes` bytes; BadInput "WHO: ..." otherwise.
std::string read_regular_file(const std::string& path, uint64_t max_bytes, const std::string& who);

// A token shard opened for reading with pread. Not a memory map: a shard truncated while training reads it
// would kill a mapping's reader with SIGBUS; here the read that finds it short throws, naming the file.
class ShardFile {
 public:
  // Throws BadInput naming `path` when it is not a regular file that can be opened.
  explicit ShardFile(const std::string& path);
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }  // when opened
  int fd() const { return fd_.get(); }
  // Bytes [offset, offset + count) into out. Throws RunFailed naming the file when it has shrunk since it
  // was opened (or cannot be read).
  void read(uint64_t offset, size_t count, void* out) const;

 private:
  std::string path_;
  UniqueFd fd_;
  uint64_t size_ = 0;
};

// The xxh64 (seed 0) of the file's bytes, read 1 MiB at a time with read(), not through a map, so that
// verifying a shard leaves no pages mapped into the process. `size_out`, when given, receives the size.
// Throws BadInput naming `path` when it cannot be read or is not a regular file.
uint64_t file_xxh64(const std::string& path, uint64_t* size_out = nullptr);

// 16 lowercase hex digits, the form manifests hold hashes in.
std::string hex64(uint64_t value);
// The inverse of hex64; false when `text` is not 16 hex digits.
bool parse_hex64(const std::string& text, uint64_t* value);

}  // namespace moe::data
