// What the trainer, checkpoint and supervisor tests share: a temporary directory per test, reading files,
// and comparing metrics.jsonl runs bit for bit apart from the fields that measure the machine.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace moe::test_support {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Fields of a metrics line that measure the machine, not the run: the only ones allowed to differ. The host's
// waits and bytes read back depend on the layout and on what runs beside the step (docs/metrics.md).
inline const std::set<std::string> kTimingFields = {"tokens_per_s", "elapsed_s", "comm_wait_s", "ckpt_stall_s",
                                                    "a2a_wait_s",   "threads",   "host_syncs",  "d2h_bytes"};

inline json without_timing(json line) {
  for (const std::string& field : kTimingFields) line.erase(field);
  return line;
}

// A fresh directory, removed afterwards unless a check of the test failed (then it is kept to look at).
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    std::string pattern = (fs::temp_directory_path() / ("moe_test_" + tag + "_XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    if (::testing::Test::HasFailure()) {
      std::cout << "[ kept ] " << path_ << " (a check failed)\n";
      return;
    }
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// The file's bytes; "" when it cannot be read (a /proc entry that vanished, a directory).
inline std::string read_text_if_any(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  if (in) out << in.rdbuf();
  return out.str();
}

// The file's bytes, and a failed check when it cannot be read.
inline std::string read_text(const fs::path& path) {
  EXPECT_TRUE(std::ifstream(path, std::ios::binary).good()) << "cannot open " << path.string();
  return read_text_if_any(path);
}

// "" when `a` and `b` are the same JSON with every double the same bits; else where they first differ.
inline std::string first_difference(const json& a, const json& b, const std::string& where = "") {
  if (a.type() != b.type()) return where + ": " + a.dump() + " vs " + b.dump() + " (types differ)";
  if (a.is_number_float()) {
    const auto bits_a = std::bit_cast<uint64_t>(a.get<double>()), bits_b = std::bit_cast<uint64_t>(b.get<double>());
    return bits_a == bits_b ? "" : where + ": " + a.dump() + " vs " + b.dump();
  }
  if (a.is_object()) {
    for (const auto& [key, value] : a.items()) {
      if (!b.contains(key)) return where + "." + key + ": missing from the second";
      if (std::string d = first_difference(value, b.at(key), where + "." + key); !d.empty()) return d;
    }
    for (const auto& [key, value] : b.items())
      if (!a.contains(key)) return where + "." + key + ": missing from the first";
    return "";
  }
  if (a.is_array()) {
    if (a.size() != b.size())
      return where + ": " + std::to_string(a.size()) + " vs " + std::to_string(b.size()) + " items";
    for (size_t i = 0; i < a.size(); ++i)
      if (std::string d = first_difference(a[i], b[i], where + "[" + std::to_string(i) + "]"); !d.empty()) return d;
    return "";
  }
  return a == b ? "" : where + ": " + a.dump() + " vs " + b.dump();
}

// The live (not zombie) processes whose command line mentions `needle` (a run directory: every process of a
// job has it).
inline std::vector<pid_t> processes_mentioning(const std::string& needle) {
  std::vector<pid_t> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = pid_t(std::atol(name.c_str()));
    if (pid == ::getpid()) continue;
    std::string cmdline = read_text_if_any(entry.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(needle) == std::string::npos) continue;
    // A zombie is already gone for every purpose but its parent's wait.
    const std::string stat = read_text_if_any(entry.path() / "stat");
    const size_t paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z') continue;
    found.push_back(pid);
  }
  return found;
}

}  // namespace moe::test_support
