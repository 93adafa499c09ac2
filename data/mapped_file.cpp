// Memory maps and streaming file hashes (see mapped_file.h).
#include "data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
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

// Closes a file descriptor when it goes out of scope.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int open_for_reading(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) MOE_BAD_INPUT(path << ": cannot be opened for reading (" << std::strerror(errno) << ")");
  return fd;
}

}  // namespace

MappedFile::MappedFile(const std::string& path) {
  Fd file{open_for_reading(path)};
  struct stat st {};
  if (::fstat(file.fd, &st) != 0 || !S_ISREG(st.st_mode)) MOE_BAD_INPUT(path << ": not a regular file");
  size_ = size_t(st.st_size);
  if (size_ == 0) return;  // mmap refuses length 0; an empty file is an empty map
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, file.fd, 0);
  if (p == MAP_FAILED) MOE_BAD_INPUT(path << ": cannot be memory-mapped (" << std::strerror(errno) << ")");
  // Training reads one window per sequence at a random place: read-ahead would only fill memory.
  ::madvise(p, size_, MADV_RANDOM);
  data_ = static_cast<const unsigned char*>(p);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

uint64_t file_xxh64(const std::string& path, uint64_t* size_out) {
  Fd file{open_for_reading(path)};
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> state(XXH64_createState(), &XXH64_freeState);
  XXH64_reset(state.get(), 0);
  std::vector<char> buffer(size_t(1) << 20);
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(file.fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) MOE_BAD_INPUT(path << ": read failed (" << std::strerror(errno) << ")");
    if (n == 0) break;
    XXH64_update(state.get(), buffer.data(), size_t(n));
    total += uint64_t(n);
  }
  // The pages read are the page cache's, not this process's; tell the kernel they may go.
  ::posix_fadvise(file.fd, 0, 0, POSIX_FADV_DONTNEED);
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
