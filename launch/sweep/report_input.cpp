// Reading the inputs of `moe report` within bounds (launch/sweep/report_input.h).
#include "launch/sweep/report_input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace moe::report {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "is a directory";
  if (S_ISFIFO(mode)) return "is a FIFO";
  if (S_ISCHR(mode)) return "is a character device";
  if (S_ISBLK(mode)) return "is a block device";
  if (S_ISSOCK(mode)) return "is a socket";
  return "is not a regular file";
}

std::string plural(uint64_t n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); }

// Reads what is left of `fd`, at most `most` bytes plus one (so that a caller sees it was more).
std::string read_at_most(int fd, uint64_t most, const fs::path& path) {
  std::string text;
  char buffer[1 << 16];
  while (text.size() <= most) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) MOE_BAD_INPUT(path.string() << ": cannot be read (" << std::strerror(errno) << ")");
    if (n == 0) break;
    text.append(buffer, size_t(n));
  }
  return text;
}

}  // namespace

std::string Skipped::text() const {
  std::vector<std::string> parts;
  if (long_lines)
    parts.push_back(plural(long_lines, "line") + " longer than " + std::to_string(kMaxLineBytes) + " bytes");
  if (not_json) parts.push_back(plural(not_json, "line") + " not JSON");
  if (odd_lines) parts.push_back(plural(odd_lines, "line") + " not an object with a number \"step\"");
  if (odd_fields) parts.push_back(plural(odd_fields, "field") + " of an unexpected type");
  if (cells) parts.push_back(plural(cells, "cell") + " whose metrics.jsonl could not be read");
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

int Fd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

Fd open_regular(const fs::path& path, std::string& problem) {
  problem.clear();
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
  // O_NOFOLLOW: an input is never read through a link (one to /dev/zero or to a file outside the run).
  Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY));
  if (fd.get() < 0) {
    const int error = errno;
    struct stat st {};
    if (error == ELOOP && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
      problem = "is a symbolic link (moe report reads no file through a link)";
    else if (error != ENOENT)
      problem = std::strerror(error);
    return Fd();
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    problem = std::strerror(errno);
    return Fd();
  }
  if (!S_ISREG(st.st_mode)) {
    problem = kind_of(st.st_mode);
    return Fd();
  }
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  return fd;
}

json read_json_document(const fs::path& path, bool required) {
  std::string problem;
  const Fd fd = open_regular(path, problem);
  if (fd.get() < 0 && !problem.empty())
    MOE_BAD_INPUT(path.string() << ": " << problem << "; expected a regular file of JSON");
  if (fd.get() < 0) {
    if (required) MOE_BAD_INPUT(path.string() << ": missing");
    return json();
  }
  const std::string text = read_at_most(fd.get(), kMaxDocumentBytes, path);
  if (text.size() > kMaxDocumentBytes)
    MOE_BAD_INPUT(path.string() << ": larger than " << kMaxDocumentBytes << " bytes; expected a JSON document of "
                                << "moe's own (at most that size)");
  try {
    return json::parse(text);
  } catch (const std::exception& e) {
    if (required) MOE_BAD_INPUT(path.string() << ": not valid JSON (" << e.what() << ")");
    return json();
  }
}

void for_each_json_line(int fd, Skipped& skipped, const std::function<void(const json&)>& line) {
  std::string text;
  bool too_long = false;  // the current line passed the bound: the rest of it is dropped as it is read
  const auto finish = [&] {
    if (too_long) {
      ++skipped.long_lines;
    } else if (!text.empty()) {
      json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (value.is_discarded())
        ++skipped.not_json;
      else
        line(value);
    }
    text.clear();
    too_long = false;
  };
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // a read error ends the file like its end: what was read is reported
    for (const char *p = buffer, *end = buffer + n; p < end;) {
      const char* newline = static_cast<const char*>(std::memchr(p, '\n', size_t(end - p)));
      const size_t length = size_t((newline ? newline : end) - p);
      if (!too_long && text.size() + length > kMaxLineBytes) too_long = true, text.clear();
      if (!too_long) text.append(p, length);
      if (!newline) break;
      finish();
      p = newline + 1;
    }
  }
  // A last line with no newline may still be being written (a run in progress): used when it parses, else
  // skipped without being counted.
  if (too_long) ++skipped.long_lines;
  if (too_long || text.empty()) return;
  const json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!value.is_discarded()) line(value);
}

}  // namespace moe::report
