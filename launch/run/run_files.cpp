// Run and sweep directory files: no link followed, regular files only, failures named (launch/run/run_files.h).
#include "launch/run/run_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace moe {
namespace fs = std::filesystem;

namespace {

const char* describe(Entry e) {
  switch (e) {
    case Entry::Link:
      return "a symbolic link";
    case Entry::Directory:
      return "a directory";
    case Entry::Regular:
      return "a regular file";
    default:
      return "not a regular file (a FIFO, device or socket)";
  }
}

[[noreturn]] void not_regular(const fs::path& path, Entry e) {
  MOE_BAD_INPUT(path.string() << " is " << describe(e)
                              << ": the program reads and writes only regular files of its own in a run or sweep "
                                 "directory, never through a link (remove it)");
}

[[noreturn]] void write_failed(const fs::path& path, int error) {
  MOE_RUN_FAILED("cannot write " << path.string() << " (" << std::strerror(error)
                                 << "; is the disk full?); free space, then resume");
}

// A descriptor for reading `path` when it is a regular file, else -1 (missing, a link, a FIFO, ...).
int open_regular(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A descriptor for writing the regular file `path` (created when missing, with `flags`); refusals as
// open_run_file says.
int open_regular_for_writing(const fs::path& path, int flags) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | flags, 0644);
  struct stat st {};
  if (fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
  }
  const int error = errno;
  if (fd >= 0) ::close(fd);
  const Entry e = entry_kind(path);
  if (e != Entry::Missing && e != Entry::Regular) not_regular(path, e);
  if (error == ENOSPC || error == EDQUOT) write_failed(path, error);
  MOE_BAD_INPUT("cannot open " << path.string() << " for writing (" << std::strerror(error) << ")");
}

}  // namespace

Entry entry_kind(const fs::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT ? Entry::Missing : Entry::Other;
  if (S_ISLNK(st.st_mode)) return Entry::Link;
  if (S_ISREG(st.st_mode)) return Entry::Regular;
  if (S_ISDIR(st.st_mode)) return Entry::Directory;
  return Entry::Other;
}

void check_regular_or_missing(const fs::path& path, const std::string& what) {
  const Entry e = entry_kind(path);
  if (e != Entry::Missing && e != Entry::Regular)
    MOE_BAD_INPUT(path.string() << " (" << what << ") is " << describe(e)
                                << "; the program reads and writes only regular files of its own there (remove it)");
}

void make_real_dir(const fs::path& path, const std::string& what) {
  if (::mkdir(path.c_str(), 0755) == 0) return;
  const int err = errno;
  const Entry e = entry_kind(path);
  if (err == EEXIST && e == Entry::Directory) return;
  if (err == EEXIST)
    MOE_BAD_INPUT(path.string() << " (" << what << ") is " << describe(e)
                                << ", not a directory of its own; the program never writes through a link (remove it)");
  MOE_BAD_INPUT(path.string() << " (" << what << "): cannot be created (" << std::strerror(err) << ")");
}

std::FILE* open_run_file(const fs::path& path, FileMode mode) {
  const int fd = open_regular_for_writing(path, mode == FileMode::Append ? O_APPEND : O_TRUNC);
  std::FILE* file = ::fdopen(fd, mode == FileMode::Append ? "a" : "w");
  if (!file) {
    const int error = errno;
    ::close(fd);
    MOE_RUN_FAILED("cannot open " << path.string() << ": " << std::strerror(error));
  }
  return file;
}

int open_append_fd(const fs::path& path) { return open_regular_for_writing(path, O_APPEND); }

void write_all(std::FILE* file, const std::string& text, const fs::path& path) {
  errno = 0;
  if (std::fwrite(text.data(), 1, text.size(), file) != text.size() || std::fflush(file) != 0)
    write_failed(path, errno ? errno : EIO);
}

void replace_run_file(const fs::path& path, const std::string& text) {
  const std::string tmp = path.string() + ".tmp";
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT)
    MOE_BAD_INPUT(tmp << ": cannot be removed (" << std::strerror(errno) << "); it stands where the program writes "
                      << path.string());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == ENOSPC || errno == EDQUOT) write_failed(path, errno);
    MOE_BAD_INPUT(tmp << ": cannot be created (" << std::strerror(errno) << ")");
  }
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : EIO;
      ::close(fd), ::unlink(tmp.c_str());
      write_failed(path, error);
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    write_failed(path, error);
  }
}

bool for_each_line(const fs::path& path, const std::function<void(const std::string&)>& fn, int64_t max_bytes) {
  const int fd = open_regular(path);
  if (fd < 0) return false;
  std::string line;
  bool skipping = false;  // inside a line past max_bytes
  char buffer[1 << 16];
  try {
    for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) != 0;) {
      if (n < 0) {
        if (errno == EINTR) continue;
        break;
      }
      for (ssize_t i = 0; i < n;) {
        const char* start = buffer + i;
        const char* newline = static_cast<const char*>(std::memchr(start, '\n', size_t(n - i)));
        const size_t length = newline ? size_t(newline - start) : size_t(n - i);
        if (!skipping && int64_t(line.size() + length) > max_bytes) line.clear(), skipping = true;
        if (!skipping) line.append(start, length);
        i += ssize_t(length);
        if (!newline) continue;
        if (!skipping) fn(line);
        line.clear(), skipping = false, ++i;
      }
    }
    if (!skipping && !line.empty()) fn(line);  // a last line without its newline (perhaps still being written)
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return true;
}

nlohmann::json read_json_regular(const fs::path& path, int64_t max_bytes) {
  const int fd = open_regular(path);
  if (fd < 0) return nlohmann::json();
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) == 0 && st.st_size <= max_bytes) {
    text.resize(size_t(st.st_size));
    const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
    text.resize(n > 0 ? size_t(n) : 0);
  }
  ::close(fd);
  nlohmann::json document = nlohmann::json::parse(text, nullptr, false);
  return document.is_discarded() ? nlohmann::json() : document;
}

}  // namespace moe
