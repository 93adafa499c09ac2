// The files of a run directory (config.json, manifest.json, metrics.jsonl, config_history.jsonl, ...),
// opened so that nothing planted there is written through, blocks, or is read for ever: the last component
// of a path is never followed when it is a symbolic link, and only regular files are read or written. A
// failed write (a full disk) is a RunFailed naming the file, never an internal error.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace moe {

enum class FileMode { Read, Truncate, Append };

// The file at `path` as a stdio stream, or nullptr when Read finds no file. BadInput naming the file when it
// is a symbolic link, a FIFO, a directory or anything but a regular file; RunFailed when it cannot be created.
std::FILE* open_run_file(const std::string& path, FileMode mode);
// Writes all of `text` to `file` and flushes it; RunFailed naming `path` (with the system's reason) otherwise.
void write_all(std::FILE* file, const std::string& text, const std::string& path);
// Replaces `path` by `text`: written to path.tmp (created anew, no link followed), synced, renamed over it.
// On failure path.tmp is removed and `path` is left as it was.
void replace_run_file(const std::string& path, const std::string& text);

// Calls `line` with every line of the file at `path` (none when there is no file), without its newline. A
// line longer than max_bytes (a file that is not the program's) is skipped without being held whole.
void for_each_line(const std::string& path, const std::function<void(const std::string&)>& line,
                   int64_t max_bytes = int64_t(1) << 24);

}  // namespace moe
