// The files of a sweep directory, read and written so that nothing planted there redirects or blocks the
// sweep (docs/sweep.md "What the sweep reads and writes"): files are read only when they are regular files
// (opened without following a link and without blocking: a FIFO never waits for a writer), written under a
// new temporary name created exclusively (O_EXCL | O_NOFOLLOW) and renamed into place, and a directory the
// sweep makes or enters must be a real directory, never a symbolic link. Not here: what the files hold
// (launch/sweep_run.cpp, launch/sweep_results.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace moe {

// What stands at `path` (lstat: a link is a link, whatever it points at).
enum class Entry { Missing, Regular, Directory, Link, Other };
Entry entry_kind(const std::filesystem::path& path);

// BadInput naming `path` (and `what` it is for) unless it is missing or a regular file.
void check_regular_or_missing(const std::filesystem::path& path, const std::string& what);
// Makes the directory `path` unless it is one already; BadInput when a link or anything else stands there.
void make_real_dir(const std::filesystem::path& path, const std::string& what);

// The lines of a regular file, each given to `fn` (at most kMaxLineBytes; a longer line is skipped). False
// when the file is missing or not a regular file (nothing is read and nothing blocks).
constexpr size_t kMaxLineBytes = size_t(16) << 20;
bool for_each_line(const std::filesystem::path& path, const std::function<void(const std::string&)>& fn);
// The JSON document of a regular file of at most `max_bytes`; null when missing, not regular, larger or
// not JSON.
nlohmann::json read_json_regular(const std::filesystem::path& path, int64_t max_bytes = int64_t(64) << 20);

// `text` into `path`: written to PATH.tmp (a leftover or planted PATH.tmp is removed first, a link as a
// link) created with O_EXCL | O_NOFOLLOW, then renamed over `path` (which replaces a link, never writes
// through it). BadInput naming the file when it cannot be written (a full disk); the temporary is removed.
void write_file_replacing(const std::filesystem::path& path, const std::string& text);
// A file opened for appending (a cell's log): O_NOFOLLOW, regular only; BadInput naming it otherwise.
int open_append_regular(const std::filesystem::path& path);

}  // namespace moe
