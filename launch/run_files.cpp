// Run-directory files opened without following links, regular files only, failures named.
#include "launch/run_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace moe {
namespace {

[[noreturn]] void not_regular(const std::string& path, const char* what) {
  MOE_BAD_INPUT(path << " is " << what
                     << ", not a regular file: the program reads and writes only regular files in a run directory; "
                        "remove it");
}

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISSOCK(mode)) return "a socket";
  return "a device or other special file";
}

// What stands at `path` when open refused it for being special (a link, a FIFO without a reader).
[[noreturn]] void refused_open(const std::string& path, int error) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) not_regular(path, kind_of(st.st_mode));
  if (error == ENOSPC || error == EDQUOT)
    MOE_RUN_FAILED("cannot create " << path << " (" << std::strerror(error) << "); free space, then resume");
  MOE_BAD_INPUT("cannot open " << path << " (" << std::strerror(error) << ")");
}

}  // namespace

std::FILE* open_run_file(const std::string& path, FileMode mode) {
  // O_NONBLOCK: a FIFO must not block the open; it is refused just below.
  int flags = O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
  if (mode == FileMode::Read) flags |= O_RDONLY;
  if (mode == FileMode::Truncate) flags |= O_WRONLY | O_CREAT | O_TRUNC;
  if (mode == FileMode::Append) flags |= O_WRONLY | O_CREAT | O_APPEND;
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) {
    if (mode == FileMode::Read && errno == ENOENT) return nullptr;
    refused_open(path, errno);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    not_regular(path, kind_of(st.st_mode));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::FILE* file = ::fdopen(fd, mode == FileMode::Read ? "r" : mode == FileMode::Append ? "a" : "w");
  if (!file) {
    ::close(fd);
    MOE_RUN_FAILED("cannot open " << path << ": " << std::strerror(errno));
  }
  return file;
}

void write_all(std::FILE* file, const std::string& text, const std::string& path) {
  errno = 0;
  if (std::fwrite(text.data(), 1, text.size(), file) != text.size() || std::fflush(file) != 0)
    MOE_RUN_FAILED("cannot write " << path << " (" << std::strerror(errno ? errno : EIO)
                                   << "; is the disk full?); free space, then resume with --resume auto");
}

void replace_run_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::error_code ec;
  std::filesystem::remove(tmp, ec);  // one a crash left; a link is removed, not followed
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) refused_open(tmp, errno);
  std::FILE* file = ::fdopen(fd, "w");
  try {
    if (!file) MOE_RUN_FAILED("cannot open " << tmp << ": " << std::strerror(errno));
    write_all(file, text, path);
    if (::fsync(fd) != 0)
      MOE_RUN_FAILED("cannot write " << path << " (" << std::strerror(errno) << "; is the disk full?)");
  } catch (...) {
    file ? std::fclose(file) : ::close(fd);
    std::filesystem::remove(tmp, ec);
    throw;
  }
  std::fclose(file);
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    MOE_RUN_FAILED("cannot rename " << tmp << " to " << path << ": " << ec.message());
  }
}

void for_each_line(const std::string& path, const std::function<void(const std::string&)>& line, int64_t max_bytes) {
  std::FILE* file = open_run_file(path, FileMode::Read);
  if (!file) return;
  std::string text;
  bool too_long = false;
  char chunk[1 << 16];
  try {
    while (std::fgets(chunk, sizeof chunk, file)) {
      const size_t n = std::strlen(chunk);
      const bool ends = n > 0 && chunk[n - 1] == '\n';
      if (!too_long) text.append(chunk, ends ? n - 1 : n);
      if (int64_t(text.size()) > max_bytes) too_long = true, text.clear();
      if (!ends && !std::feof(file)) continue;
      if (!too_long) line(text);
      text.clear(), too_long = false;
    }
  } catch (...) {
    std::fclose(file);
    throw;
  }
  std::fclose(file);
}

}  // namespace moe
