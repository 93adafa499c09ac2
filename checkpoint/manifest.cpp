// Manifest (de)serialisation, file checksums, directory fsync.
#include "checkpoint/manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace moe::ckpt {
namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int64_t kMaxManifestBytes = int64_t{256} << 20;

DType dtype_from_name(const std::string& name, const std::string& origin) {
  if (name == "f32") return DType::F32;
  if (name == "f64") return DType::F64;
  if (name == "i64") return DType::I64;
  if (name == "u32") return DType::U32;
  MOE_BAD_INPUT(origin << ": unknown dtype '" << name << "'; expected f32, f64, i64 or u32");
}

json to_json(const FileEntry& f) {
  json datasets = json::array();
  for (const DatasetEntry& d : f.datasets)
    datasets.push_back({{"dataset", d.dataset},
                        {"tensor", d.tensor},
                        {"dtype", dtype_name(d.dtype)},
                        {"global_shape", d.slab.global_shape},
                        {"start", d.slab.start},
                        {"shape", d.slab.shape},
                        {"range", {d.slab.begin, d.slab.count}},
                        {"xor_delta", d.xor_delta}});
  return {{"name", f.name}, {"rank", f.rank},   {"peer_copy", f.peer_copy},
          {"size", f.size}, {"xxh64", f.xxh64}, {"datasets", datasets}};
}

json to_json(const Manifest& m) {
  json files = json::array();
  for (const FileEntry& f : m.files) files.push_back(to_json(f));
  json j = {{"format", kFormat},
            {"step", m.step},
            {"kind", m.kind},
            {"chain", m.chain},
            {"chain_manifests", m.chain_manifests},
            {"created", m.created},
            {"config", m.config},
            {"layout", m.layout},
            {"versions", m.versions},
            {"files", files}};
  if (!m.data.is_null()) j["data"] = m.data;
  if (!m.run_id.empty()) j["run_id"] = m.run_id;
  return j;
}

FileEntry file_entry_from_json(const json& f, const std::string& origin, int format) {
  try {
    FileEntry e;
    e.name = f.at("name").get<std::string>();
    e.rank = f.at("rank").get<int64_t>();
    e.peer_copy = f.value("peer_copy", false);
    e.size = f.at("size").get<int64_t>();
    e.xxh64 = f.at("xxh64").get<std::string>();
    for (const json& d : f.at("datasets")) {
      DatasetEntry de;
      de.dataset = d.at("dataset").get<std::string>();
      de.tensor = d.at("tensor").get<std::string>();
      de.dtype = dtype_from_name(d.at("dtype").get<std::string>(), origin);
      const auto global_shape = d.at("global_shape").get<std::vector<int64_t>>();
      if (format == 1) {
        de.slab = Slab::flat(global_shape, d.at("flat_offset").get<int64_t>(), d.at("count").get<int64_t>());
      } else {
        const auto range = d.at("range").get<std::vector<int64_t>>();
        if (range.size() != 2) MOE_BAD_INPUT(origin << ": dataset " << de.dataset << ": range is not [begin, count]");
        de.slab = {global_shape, d.at("start").get<std::vector<int64_t>>(), d.at("shape").get<std::vector<int64_t>>(),
                   range[0], range[1]};
      }
      de.xor_delta = d.value("xor_delta", false);
      e.datasets.push_back(std::move(de));
    }
    return e;
  } catch (const json::exception& e) {
    MOE_BAD_INPUT(origin << ": malformed file entry (" << e.what() << ")");
  }
}

Manifest manifest_from_json(const json& j, const std::string& origin) {
  try {
    const std::string format = j.value("format", std::string());
    if (format != kFormat && format != kFormatV1)
      MOE_BAD_INPUT(origin << ": not a checkpoint manifest of format " << kFormat << " or " << kFormatV1 << " (format '"
                           << j.value("format", std::string("?")) << "')");
    Manifest m;
    m.format = format == kFormat ? 2 : 1;
    m.step = j.at("step").get<int64_t>();
    m.kind = j.at("kind").get<std::string>();
    m.chain = j.at("chain").get<std::vector<std::string>>();
    m.chain_manifests = j.value("chain_manifests", std::vector<std::string>());
    m.created = j.value("created", std::string());
    m.config = j.at("config");
    m.layout = j.value("layout", json::object());
    m.versions = j.value("versions", json::object());
    m.data = j.value("data", json());
    m.run_id = j.value("run_id", std::string());
    for (const json& f : j.at("files")) m.files.push_back(file_entry_from_json(f, origin, m.format));
    if (m.chain.empty()) MOE_BAD_INPUT(origin << ": empty chain");
    return m;
  } catch (const json::exception& e) {
    MOE_BAD_INPUT(origin << ": malformed manifest (" << e.what() << ")");
  }
}

namespace {
void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) MOE_FAIL("cannot open " << path << " to sync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) MOE_FAIL("fsync of " << path << " failed");
}
}  // namespace

void fsync_directory(const std::string& dir) { fsync_path(dir, O_RDONLY | O_DIRECTORY); }
void fsync_file(const std::string& path) { fsync_path(path, O_RDONLY); }

void write_manifest(const std::string& dir, const Manifest& m) {
  const fs::path tmp = fs::path(dir) / (std::string(kManifestName) + ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << to_json(m).dump(1, ' ', false, json::error_handler_t::replace) << "\n";
    out.flush();
    if (!out)
      MOE_RUN_FAILED("cannot write " << tmp.string() << " (is the disk full?); the checkpoint is not committed and "
                                     << "the previous one stays the newest: free space, then resume");
  }
  fsync_path(tmp.string(), O_RDONLY);
  fs::rename(tmp, fs::path(dir) / kManifestName);
  fsync_directory(dir);
}

Manifest read_manifest(const std::string& dir) {
  const fs::path path = fs::path(dir) / kManifestName;
  // The type before opening (a FIFO would block the read), the size before reading.
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0)
    MOE_BAD_INPUT("checkpoint " << dir << ": no " << kManifestName << " (not a committed checkpoint)");
  if (!S_ISREG(st.st_mode))
    MOE_BAD_INPUT(path.string() << " is not a regular file (a symbolic link, FIFO, device or directory)");
  if (st.st_size > kMaxManifestBytes)
    MOE_BAD_INPUT(path.string() << " is " << st.st_size << " bytes, more than any manifest (" << kMaxManifestBytes
                                << ")");
  std::ifstream in(path);
  if (!in) MOE_BAD_INPUT("checkpoint " << dir << ": cannot read " << kManifestName);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    MOE_BAD_INPUT(path.string() << ": malformed JSON (" << e.what() << ")");
  }
  return manifest_from_json(j, path.string());
}

std::string file_xxh64(const std::string& path, int64_t* size) {
  // Non-blocking, so that a FIFO cannot hang the open; anything but a regular file is refused.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) MOE_BAD_INPUT("cannot read " << path << ": " << std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    MOE_BAD_INPUT(path << " is not a regular file");
  }
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  std::vector<char> buffer(1 << 20);
  int64_t total = 0;
  ssize_t n = 0;
  while ((n = ::read(fd, buffer.data(), buffer.size())) > 0 || (n < 0 && errno == EINTR)) {
    if (n < 0) continue;
    XXH64_update(state, buffer.data(), size_t(n));
    total += int64_t(n);
  }
  const int read_errno = errno;
  ::close(fd);
  const unsigned long long h = XXH64_digest(state);
  XXH64_freeState(state);
  if (n < 0) MOE_BAD_INPUT("cannot read " << path << ": " << std::strerror(read_errno));
  if (size) *size = total;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", h);
  return hex;
}

}  // namespace moe::ckpt
