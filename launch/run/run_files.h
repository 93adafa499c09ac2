// The files of run and sweep directories (config.json, manifest.json, metrics.jsonl, a sweep's plan, status
// files and logs), read and written so that nothing planted there is written through, blocks, or is read for
// ever: the last component of a path is never followed when it is a symbolic link, only regular files are read
// or written (opened without blocking, so a FIFO never waits for a writer), replaced files go through a new
// temporary created exclusively and a rename, and a directory made or entered must be a real directory. A
// failed write (a full disk) is a RunFailed naming the file, never an internal error. Not here: what the files
// hold.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace moe {

// What stands at `path` (lstat: a link is a link, whatever it points at).
enum class Entry { Missing, Regular, Directory, Link, Other };
Entry entry_kind(const std::filesystem::path& path);

// BadInput naming `path` (and `what` it is for) unless it is missing or a regular file.
void check_regular_or_missing(const std::filesystem::path& path, const std::string& what);
// Makes the directory `path` unless it is one already; BadInput when a link or anything else stands there.
void make_real_dir(const std::filesystem::path& path, const std::string& what);

enum class FileMode { Truncate, Append };
// The regular file at `path` opened for writing, created when missing. BadInput naming it when it is a
// symbolic link, a FIFO, a directory or anything but a regular file; RunFailed when it cannot be created.
std::FILE* open_run_file(const std::filesystem::path& path, FileMode mode);
// The same as a descriptor, for appending (a cell's log handed to its process).
int open_append_fd(const std::filesystem::path& path);
// Writes all of `text` to `file` and flushes it; RunFailed naming `path` (with the system's reason) otherwise.
void write_all(std::FILE* file, const std::string& text, const std::filesystem::path& path);
// Replaces `path` by `text`: written to PATH.tmp (a leftover or planted PATH.tmp removed first, a link as a
// link), created with O_EXCL | O_NOFOLLOW, synced, renamed over `path` (which replaces a link, never writes
// through it). On failure PATH.tmp is removed and `path` left as it was.
void replace_run_file(const std::filesystem::path& path, const std::string& text);

// Gives `fn` every line of `path` without its newline, a line longer than max_bytes skipped without being held
// whole. False when the file is missing or not a regular file: nothing is read and nothing blocks (callers that
// must refuse such a file call check_regular_or_missing first).
constexpr int64_t kMaxLineBytes = int64_t(16) << 20;
bool for_each_line(const std::filesystem::path& path, const std::function<void(const std::string&)>& fn,
                   int64_t max_bytes = kMaxLineBytes);
// The JSON document of a regular file of at most `max_bytes`; null when missing, not regular, larger or
// not JSON.
nlohmann::json read_json_regular(const std::filesystem::path& path, int64_t max_bytes = int64_t(64) << 20);

}  // namespace moe
