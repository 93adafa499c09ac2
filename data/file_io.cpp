// Opening, reading and hashing files (see file_io.h).
#include "data/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "core/error.h"

namespace moe::data {
namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// read() until `count` bytes or the end of the file; the bytes read. EINTR is retried.
size_t read_fully(int fd, char* out, size_t count, const std::string& who) {
  size_t done = 0;
  while (done < count) {
    const ssize_t n = ::read(fd, out + done, count - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) MOE_BAD_INPUT(who << ": read failed (" << std::strerror(errno) << ")");
    if (n == 0) break;
    done += size_t(n);
  }
  return done;
}

}  // namespace

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

UniqueFd::UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

UniqueFd open_regular_file(const std::string& path, const std::string& who, uint64_t* size) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (fd.get() < 0) {
    const int error = errno;
    MOE_BAD_INPUT(who << ": cannot be opened for reading (" << (error == ENOENT ? "no such file" : std::strerror(error))
                      << ")");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) MOE_BAD_INPUT(who << ": cannot be examined (" << std::strerror(errno) << ")");
  if (!S_ISREG(st.st_mode)) MOE_BAD_INPUT(who << ": " << kind_of(st.st_mode) << ", not a regular file");
  // A regular file never blocks; clear the flag so reads behave as usual.
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  if (size) *size = uint64_t(st.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes, const std::string& who) {
  uint64_t size = 0;
  const UniqueFd fd = open_regular_file(path, who, &size);
  if (size > max_bytes)
    MOE_BAD_INPUT(who << ": " << size << " bytes; at most " << max_bytes << " are read (is it the right file?)");
  // One byte more than allowed, so a file that grows while it is read is refused too.
  std::string bytes(size_t(max_bytes < size + 1 ? max_bytes + 1 : size + 1), '\0');
  bytes.resize(read_fully(fd.get(), bytes.data(), bytes.size(), who));
  if (bytes.size() > max_bytes)
    MOE_BAD_INPUT(who << ": more than " << max_bytes << " bytes; at most " << max_bytes << " are read");
  return bytes;
}

ShardFile::ShardFile(const std::string& path) : path_(path) {
  fd_ = open_regular_file(path, path, &size_);
  // Training reads one window per sequence at a random place: read-ahead would only fill memory.
  ::posix_fadvise(fd_.get(), 0, 0, POSIX_FADV_RANDOM);
}

void ShardFile::read(uint64_t offset, size_t count, void* out) const {
  char* bytes = static_cast<char*>(out);
  size_t done = 0;
  while (done < count) {
    const ssize_t n = ::pread(fd_.get(), bytes + done, count - done, off_t(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) MOE_RUN_FAILED("shard " << path_ << ": read failed (" << std::strerror(errno) << ")");
    if (n == 0) {
      struct stat st {};
      const long long now = ::fstat(fd_.get(), &st) == 0 ? static_cast<long long>(st.st_size) : -1;
      MOE_RUN_FAILED("shard " << path_ << " has shrunk while in use: it has " << now << " bytes, " << size_
                              << " when it was opened and verified (was it rewritten or truncated? "
                              << "restore it or prepare the data again)");
    }
    done += size_t(n);
  }
}

uint64_t file_xxh64(const std::string& path, uint64_t* size_out) {
  const UniqueFd file = open_regular_file(path, path);
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> state(XXH64_createState(), &XXH64_freeState);
  XXH64_reset(state.get(), 0);
  std::vector<char> buffer(size_t(1) << 20);
  uint64_t total = 0;
  for (size_t n; (n = read_fully(file.get(), buffer.data(), buffer.size(), path)) > 0;) {
    XXH64_update(state.get(), buffer.data(), n);
    total += n;
  }
  // The pages read are the page cache's, not this process's; tell the kernel they may go.
  ::posix_fadvise(file.get(), 0, 0, POSIX_FADV_DONTNEED);
  if (size_out) *size_out = total;
  return XXH64_digest(state.get());
}

std::string hex64(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

bool parse_hex64(const std::string& text, uint64_t* value) {
  if (text.size() != 16) return false;
  uint64_t v = 0;
  for (const char c : text) {
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    if (digit < 0) return false;
    v = (v << 4) | uint64_t(digit);
  }
  *value = v;
  return true;
}

}  // namespace moe::data
