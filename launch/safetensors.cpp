// The safetensors format, written directly: see safetensors.h.
#include "launch/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace moe {

int64_t safetensors_element_bytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64") return 8;
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "BF16" || dtype == "F16" || dtype == "I16") return 2;
  if (dtype == "U8" || dtype == "I8" || dtype == "BOOL") return 1;
  return 0;
}

int64_t SafetensorsEntry::bytes() const {
  int64_t n = safetensors_element_bytes(dtype);
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                                     const nlohmann::json& metadata)
    : path_(path), entries_(entries) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const SafetensorsEntry& e : entries_) {
    MOE_CHECK(safetensors_element_bytes(e.dtype) > 0, "safetensors dtype " << e.dtype);
    MOE_CHECK(!header.contains(e.name), "tensor " << e.name << " twice in " << path);
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes()}}};
    offset += e.bytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned, as the reference writer does
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) MOE_BAD_INPUT("cannot create " << path << " (" << std::strerror(errno) << ")");
  file_ = ::fdopen(fd, "wb");
  MOE_CHECK(file_, "fdopen of " << path);
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));
  if (std::fwrite(length, 1, 8, file_) != 8 || std::fwrite(text.data(), 1, text.size(), file_) != text.size())
    MOE_FAIL("writing " << path << ": " << std::strerror(errno));
  size_ = 8 + int64_t(text.size()) + offset;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_) std::fclose(file_);
}

void SafetensorsWriter::write(const std::string& name, const void* data, size_t bytes) {
  MOE_CHECK(
      file_ && next_ < entries_.size() && entries_[next_].name == name && int64_t(bytes) == entries_[next_].bytes(),
      "tensor " << name << " (" << bytes << " bytes) out of the order of the header of " << path_);
  if (bytes > 0 && std::fwrite(data, 1, bytes, file_) != bytes)
    MOE_FAIL("writing " << path_ << ": " << std::strerror(errno));
  ++next_;
}

void SafetensorsWriter::close() {
  MOE_CHECK(file_ && next_ == entries_.size(),
            path_ << ": " << next_ << " of " << entries_.size() << " tensors written before close");
  if (std::fflush(file_) != 0 || ::fsync(::fileno(file_)) != 0)
    MOE_FAIL("writing " << path_ << ": " << std::strerror(errno));
  std::FILE* f = file_;
  file_ = nullptr;
  if (std::fclose(f) != 0) MOE_FAIL("closing " << path_ << ": " << std::strerror(errno));
}

}  // namespace moe
