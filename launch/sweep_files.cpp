// Reading and writing a sweep directory's files without following links or blocking (launch/sweep_files.h).
#include "launch/sweep_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace moe {
namespace fs = std::filesystem;

namespace {

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
                                << "; a sweep reads and writes only regular files of its own (remove it)");
}

void make_real_dir(const fs::path& path, const std::string& what) {
  if (::mkdir(path.c_str(), 0755) == 0) return;
  const int err = errno;
  const Entry e = entry_kind(path);
  if (err == EEXIST && e == Entry::Directory) return;
  if (err == EEXIST)
    MOE_BAD_INPUT(path.string() << " (" << what << ") is " << describe(e)
                                << ", not a directory of this sweep; a sweep never writes through a link (remove it)");
  MOE_BAD_INPUT(path.string() << " (" << what << "): cannot be created (" << std::strerror(err) << ")");
}

bool for_each_line(const fs::path& path, const std::function<void(const std::string&)>& fn) {
  const int fd = open_regular(path);
  if (fd < 0) return false;
  std::string line;
  bool skipping = false;  // inside a line past kMaxLineBytes
  char buffer[1 << 16];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (ssize_t i = 0; i < n; ++i) {
      if (buffer[i] == '\n') {
        if (!skipping) fn(line);
        line.clear(), skipping = false;
      } else if (!skipping && line.size() < kMaxLineBytes) {
        line += buffer[i];
      } else {
        line.clear(), skipping = true;
      }
    }
  }
  if (!skipping && !line.empty()) fn(line);  // a last line without its newline (perhaps still being written)
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
  try {
    return nlohmann::json::parse(text);
  } catch (const std::exception&) {
    return nlohmann::json();
  }
}

void write_file_replacing(const fs::path& path, const std::string& text) {
  const std::string tmp = path.string() + ".tmp";
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT)
    MOE_BAD_INPUT(tmp << ": cannot be removed (" << std::strerror(errno) << "); it stands where the sweep writes "
                      << path.string());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) MOE_BAD_INPUT(tmp << ": cannot be created (" << std::strerror(errno) << ")");
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd), ::unlink(tmp.c_str());
      MOE_BAD_INPUT(path.string() << ": cannot be written (" << std::strerror(err) << ")");
    }
    done += size_t(n);
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    MOE_BAD_INPUT(path.string() << ": cannot be written (" << std::strerror(err) << ")");
  }
}

int open_append_regular(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  struct stat st {};
  if (fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) return fd;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (fd < 0 && err != ELOOP) MOE_BAD_INPUT(path.string() << ": cannot be opened (" << std::strerror(err) << ")");
  MOE_BAD_INPUT(path.string() << " is " << describe(entry_kind(path))
                              << "; a sweep writes its logs only into regular files of its own (remove it)");
}

}  // namespace moe
