// TFRecord framing with Boost.CRC's CRC-32C, and the events file that writes it.
#include "launch/run/event_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <boost/crc.hpp>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "launch/run/run_files.h"

namespace moe {
namespace {

// Castagnoli's polynomial, reflected in and out, initial and final XOR all ones: CRC-32C as TFRecord uses it.
using Crc32c = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

void append_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char((value >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  Crc32c crc;
  crc.process_bytes(bytes.data(), bytes.size());
  return crc.checksum();
}

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  append_le(out, data.size(), 8);
  append_le(out, masked_crc32c(out), 4);
  out.append(data);
  append_le(out, masked_crc32c(data), 4);
  return out;
}

EventFile::EventFile(const std::filesystem::path& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) MOE_RUN_FAILED("cannot create " << path.string() << ": " << std::strerror(errno));
  file_ = ::fdopen(fd, "w");
  if (!file_) {
    const int error = errno;
    ::close(fd);
    MOE_RUN_FAILED("cannot open " << path.string() << ": " << std::strerror(error));
  }
}

EventFile::~EventFile() {
  if (file_) std::fclose(file_);
}

void EventFile::write(const tensorboard::Event& event) {
  std::string data;
  if (!event.SerializeToString(&data)) MOE_RUN_FAILED("cannot serialise an event for " << path_.string());
  write_all(file_, tfrecord(data), path_);
}

}  // namespace moe
