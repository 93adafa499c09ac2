// The safetensors format, written directly: see safetensors.h.
#include "launch/interop/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

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

namespace moe {
namespace {

constexpr int64_t kMaxHeaderBytes = int64_t{100} << 20;  // the reference reader's limit

std::string shape_text(const std::vector<int64_t>& shape) { return nlohmann::json(shape).dump(); }

SafetensorsTensor parse_entry(const std::string& path, const std::string& name, const nlohmann::json& j) {
  auto bad = [&](const std::string& what) {
    MOE_BAD_INPUT(path << ": tensor " << name << " in the header: " << what << " (" << j.dump() << ")");
  };
  if (!j.is_object() || !j.contains("dtype") || !j["dtype"].is_string() || !j.contains("shape") ||
      !j["shape"].is_array() || !j.contains("data_offsets") || !j["data_offsets"].is_array() ||
      j["data_offsets"].size() != 2)
    bad("expected {\"dtype\": string, \"shape\": [...], \"data_offsets\": [begin, end]}");
  SafetensorsTensor t;
  t.dtype = j["dtype"].get<std::string>();
  if (safetensors_element_bytes(t.dtype) == 0) bad("unknown dtype " + t.dtype);
  int64_t bytes = safetensors_element_bytes(t.dtype);
  for (const nlohmann::json& d : j["shape"]) {
    if (!d.is_number_unsigned() || d.get<int64_t>() > (int64_t{1} << 40)) bad("a dimension that is not a size");
    t.shape.push_back(d.get<int64_t>());
    if (t.shape.back() > 0 && bytes > (int64_t{1} << 50) / t.shape.back()) bad("a shape too large");
    bytes *= t.shape.back();
  }
  for (const nlohmann::json& o : j["data_offsets"])
    if (!o.is_number_unsigned()) bad("data_offsets that are not byte offsets");
  t.begin = j["data_offsets"][0].get<int64_t>(), t.end = j["data_offsets"][1].get<int64_t>();
  if (t.end < t.begin || t.end - t.begin != bytes)
    bad("data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] hold " +
        std::to_string(t.end - t.begin) + " bytes, but " + t.dtype + " " + shape_text(t.shape) + " is " +
        std::to_string(bytes) + " bytes");
  return t;
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  if (exponent == 0x1f) {
    const uint32_t bits = sign | 0x7f800000u | (mantissa << 13);
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  const float magnitude =
      exponent == 0 ? std::ldexp(float(mantissa), -24) : std::ldexp(float(mantissa | 0x400), int(exponent) - 25);
  return sign ? -magnitude : magnitude;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) MOE_BAD_INPUT(path << ": cannot open it (" << std::strerror(errno) << ")");
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  struct stat st {};
  if (::fstat(::fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) MOE_BAD_INPUT(path << ": not a regular file");
  const int64_t size = st.st_size;
  unsigned char length_bytes[8];
  if (size < 8 || std::fread(length_bytes, 1, 8, f) != 8)
    MOE_BAD_INPUT(path << ": " << size << " bytes, too short for the 8-byte header length; truncated?");
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | length_bytes[i];
  if (length < 2 || int64_t(length) > kMaxHeaderBytes || int64_t(length) > size - 8)
    MOE_BAD_INPUT(path << ": the header length " << length << " does not fit the file of " << size << " bytes (at most "
                       << kMaxHeaderBytes << "); truncated, or not a safetensors file");
  std::string text(size_t(length), '\0');
  if (std::fread(text.data(), 1, text.size(), f) != text.size()) MOE_BAD_INPUT(path << ": cannot read the header");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    MOE_BAD_INPUT(path << ": the header is not JSON (" << e.what() << ")");
  }
  if (!header.is_object()) MOE_BAD_INPUT(path << ": the header is not a JSON object");
  data_start_ = 8 + int64_t(length);
  std::vector<std::pair<int64_t, std::string>> order;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    tensors_[name] = parse_entry(path, name, entry);
    order.emplace_back(tensors_[name].begin, name);
  }
  // The ranges tile the data: no gap, no overlap, nothing past the end and nothing missing from it.
  std::sort(order.begin(), order.end());
  int64_t at = 0;
  for (const auto& [begin, name] : order) {
    if (begin != at)
      MOE_BAD_INPUT(path << ": tensor " << name << " starts at data byte " << begin
                         << ", but the tensor before it ends at " << at
                         << " (the header's data_offsets overlap or leave a gap)");
    at = tensors_[name].end;
  }
  if (at != size - data_start_)
    MOE_BAD_INPUT(path << ": the header's tensors need " << at << " bytes of data, the file holds "
                       << size - data_start_
                       << (at > size - data_start_ ? " (truncated)" : " (bytes past the last tensor)"));
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  const SafetensorsTensor& t = tensors_.at(name);
  const int64_t element = safetensors_element_bytes(t.dtype), n = (t.end - t.begin) / element;
  if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16")
    MOE_BAD_INPUT(path_ << ": tensor " << name << " is " << t.dtype << "; expected F32, BF16 or F16");
  std::vector<unsigned char> raw(size_t(t.end - t.begin));
  std::FILE* f = std::fopen(path_.c_str(), "rb");
  if (!f) MOE_BAD_INPUT(path_ << ": cannot open it (" << std::strerror(errno) << ")");
  const bool ok = std::fseek(f, long(data_start_ + t.begin), SEEK_SET) == 0 &&
                  std::fread(raw.data(), 1, raw.size(), f) == raw.size();
  std::fclose(f);
  if (!ok) MOE_BAD_INPUT(path_ << ": cannot read tensor " << name << " (the file changed while read?)");
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const unsigned char* b = raw.data() + i * element;
    if (t.dtype == "F32") {
      std::memcpy(&values[size_t(i)], b, 4);
    } else {
      const uint16_t h = uint16_t(b[0] | (b[1] << 8));
      if (t.dtype == "BF16") {
        const uint32_t bits = uint32_t(h) << 16;
        std::memcpy(&values[size_t(i)], &bits, 4);
      } else {
        values[size_t(i)] = f16_to_float(h);
      }
    }
  }
  return values;
}

SafetensorsModel::SafetensorsModel(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(index_path, ec))) {
    const fs::path single = fs::path(dir) / "model.safetensors";
    if (!fs::exists(fs::symlink_status(single, ec)))
      MOE_BAD_INPUT(dir << " holds neither model.safetensors.index.json nor model.safetensors");
    files_.emplace_back(single.string());
    for (const auto& [name, t] : files_.back().tensors()) file_of_[name] = 0;
    return;
  }
  std::ifstream in(index_path);
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    MOE_BAD_INPUT(index_path.string() << ": not JSON (" << e.what() << ")");
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    MOE_BAD_INPUT(index_path.string() << ": expected an object with \"weight_map\": {tensor: file}");
  std::map<std::string, size_t> file_index;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) MOE_BAD_INPUT(index_path.string() << ": tensor " << name << " maps to " << file.dump());
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      MOE_BAD_INPUT(index_path.string() << ": tensor " << name << " maps to " << f << ", not a file name in " << dir);
    if (!file_index.count(f)) {
      const fs::path path = fs::path(dir) / f;
      if (!fs::is_regular_file(fs::status(path, ec)))
        MOE_BAD_INPUT(index_path.string() << " names " << f << " (for tensor " << name << "), but " << path.string()
                                          << " does not exist or is not a regular file: a shard is missing");
      file_index[f] = files_.size();
      files_.emplace_back(path.string());
    }
    const size_t i = file_index[f];
    if (!files_[i].tensors().count(name))
      MOE_BAD_INPUT(index_path.string() << " places tensor " << name << " in " << f
                                        << ", whose header does not hold it");
    file_of_[name] = i;
  }
}

const SafetensorsTensor& SafetensorsModel::tensor(const std::string& name) const {
  return files_[file_of_.at(name)].tensors().at(name);
}

std::vector<float> SafetensorsModel::read_f32(const std::string& name) const {
  return files_[file_of_.at(name)].read_f32(name);
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : file_of_) names.push_back(name);
  return names;
}

}  // namespace moe
