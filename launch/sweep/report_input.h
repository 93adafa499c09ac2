// What `moe report` reads, read so that no input can block it, exhaust its memory or stop it: a file is opened
// without blocking, not through a symbolic link, and read only when fstat says it is a regular file (a FIFO, a
// directory, a device: refused); a whole JSON document has a size bound; JSON Lines are streamed a line
// at a time, a line past a length bound skipped without being read whole. Not here: what the lines mean
// (launch/sweep/report_run.cpp, launch/sweep/report_sweep.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moe::report {

inline constexpr size_t kMaxLineBytes = size_t(1) << 20;           // a metrics line is a few KiB
inline constexpr uint64_t kMaxDocumentBytes = uint64_t(64) << 20;  // a sweep.json of 10,000 cells: a few MB

// What was skipped while reading, said on stderr and in the page.
struct Skipped {
  uint64_t long_lines = 0;  // past kMaxLineBytes
  uint64_t not_json = 0;    // not one JSON value (a last line still being written, with no newline, is not counted)
  uint64_t odd_lines = 0;   // JSON, but not an object with a number "step"
  uint64_t odd_fields = 0;  // a known field of an unexpected type (the rest of its line is used)
  uint64_t cells = 0;       // sweep cells whose metrics.jsonl could not be read
  std::vector<std::string> cell_reasons;  // the first few of them
  bool any() const { return long_lines + not_json + odd_lines + odd_fields + cells > 0; }
  // "2 lines longer than 1048576 bytes, 1 line not JSON, ..." ("" when nothing was skipped).
  std::string text() const;
};

// A file descriptor closed on destruction.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  int release();

 private:
  int fd_;
};

// Opens `path` to read a regular file, never through a symbolic link (the last component) and without ever
// blocking. An invalid Fd and `problem`
// empty: nothing is there; an invalid Fd and `problem` set: why it cannot be read ("is a FIFO", "Permission
// denied", ...).
Fd open_regular(const std::filesystem::path& path, std::string& problem);

// The JSON document in `path`: null when it is missing, or does not parse and is not `required`; BadInput naming
// the file when it is not a regular file, is larger than kMaxDocumentBytes, or is `required` and does not parse.
nlohmann::json read_json_document(const std::filesystem::path& path, bool required);

// Calls `line` with each JSON value of a JSON Lines file already opened by open_regular, counting in `skipped`
// what is not one.
void for_each_json_line(int fd, Skipped& skipped, const std::function<void(const nlohmann::json&)>& line);

}  // namespace moe::report
