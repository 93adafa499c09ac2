// Checkpoint roots: who owns one, what in it is the program's, and the deletions a fresh start makes.
#include "checkpoint/root.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "checkpoint/manifest.h"
#include "core/error.h"

namespace moe::ckpt {
namespace fs = std::filesystem;

namespace {

constexpr size_t kForeignShown = 5;
constexpr int64_t kOwnerMaxBytes = 1 << 16;

bool digits_after(const std::string& name, const std::string& prefix) {
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return false;
  return std::all_of(name.begin() + prefix.size(), name.end(), [](unsigned char c) { return std::isdigit(c); });
}

// A name the program writes in a root, with the file type it writes it as.
bool is_program_entry(const std::string& name, const struct stat& st) {
  if (S_ISDIR(st.st_mode)) return digits_after(name, "step-") || digits_after(name, "tmp-step-");
  if (!S_ISREG(st.st_mode)) return false;
  return name == kLatestName || name == std::string(kLatestName) + ".tmp" || name == std::string(kOwnerName) + ".tmp";
}

// owner.json's run id and run directory; false when it is not a small regular file of that form.
bool read_owner(const fs::path& path, RootOwner& owner) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= kOwnerMaxBytes) {
    text.resize(size_t(st.st_size));
    if (::read(fd, text.data(), text.size()) != ssize_t(text.size())) text.clear();
  }
  ::close(fd);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("run_id") || !j["run_id"].is_string()) return false;
  owner.run_id = j["run_id"].get<std::string>();
  owner.run_dir = j.value("run_dir", std::string());
  return !owner.run_id.empty();
}

std::string listed(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& n : names) text += (text.empty() ? "" : ", ") + n;
  return text;
}

}  // namespace

RootView view_root(const std::string& root) {
  RootView view;
  struct stat st {};
  // A path that cannot be looked at holds nothing to delete; whether it can be written is checked elsewhere.
  if (::lstat(root.c_str(), &st) != 0) return view;
  view.exists = true;
  if (S_ISLNK(st.st_mode) && ::stat(root.c_str(), &st) != 0) {
    view.foreign.push_back("is a symbolic link to nothing");
    return view;
  }
  if (!S_ISDIR(st.st_mode)) {
    view.foreign.push_back("is not a directory");
    return view;
  }
  std::error_code ec;
  std::vector<std::string> foreign;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    struct stat est {};
    if (::lstat(entry.path().c_str(), &est) != 0) continue;
    if (name == kOwnerName) {
      view.has_owner = S_ISREG(est.st_mode) && read_owner(entry.path(), view.owner);
      if (!view.has_owner) foreign.push_back(name + " (not an owner file of this program)");
    } else if (is_program_entry(name, est)) {
      view.ours.push_back(name);
    } else {
      foreign.push_back(name);
    }
  }
  if (ec) foreign.push_back("cannot be listed (" + ec.message() + ")");
  std::sort(foreign.begin(), foreign.end());
  if (foreign.size() > kForeignShown) foreign.resize(kForeignShown), foreign.push_back("...");
  view.foreign = std::move(foreign);
  std::sort(view.ours.begin(), view.ours.end());
  return view;
}

std::string root_refusal(const RootView& view, const std::string& label, const std::string& run_id,
                         bool unowned_is_ours) {
  const std::string fix = "; choose another checkpoint directory (the program deletes nothing it did not write)";
  if (!view.foreign.empty())
    return label + " holds what this program did not write there: " + listed(view.foreign) + fix;
  if (view.has_owner) {
    if (!run_id.empty() && view.owner.run_id == run_id) return "";
    return label + " holds the checkpoints of another run (run id " + view.owner.run_id +
           (view.owner.run_dir.empty() ? "" : ", run directory " + view.owner.run_dir) +
           "): a checkpoint directory belongs to one run; continue that run with its --run-dir, start from one of "
           "its checkpoints with --resume PATH and another checkpoint.dir, or choose another checkpoint.dir";
  }
  if (view.ours.empty() || unowned_is_ours) return "";
  return label + " holds checkpoints (" + listed(view.ours) + ") of no recorded run (no " + kOwnerName +
         "); start from one with --resume PATH, or choose another checkpoint.dir";
}

void clear_root(const std::string& root) {
  for (const std::string& name : view_root(root).ours) {
    std::error_code ec;
    fs::remove_all(fs::path(root) / name, ec);  // removes links themselves, never what they point at
    if (ec) MOE_RUN_FAILED("cannot delete " << (fs::path(root) / name).string() << ": " << ec.message());
  }
}

void write_owner(const std::string& root, const RootOwner& owner) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) MOE_RUN_FAILED("cannot create the checkpoint directory " << root << ": " << ec.message());
  const fs::path tmp = fs::path(root) / (std::string(kOwnerName) + ".tmp"), path = fs::path(root) / kOwnerName;
  fs::remove(tmp, ec);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) MOE_RUN_FAILED("cannot create " << tmp.string() << ": " << std::strerror(errno));
  const std::string text = nlohmann::json{{"run_id", owner.run_id}, {"run_dir", owner.run_dir}}.dump(1) + "\n";
  const bool written = ::write(fd, text.data(), text.size()) == ssize_t(text.size()) && ::fsync(fd) == 0;
  const int error = errno;
  ::close(fd);
  if (!written) {
    fs::remove(tmp, ec);
    MOE_RUN_FAILED("cannot write " << tmp.string() << " (" << std::strerror(error) << "; is the disk full?)");
  }
  fs::rename(tmp, path, ec);
  if (ec) MOE_RUN_FAILED("cannot rename " << tmp.string() << " to " << path.string() << ": " << ec.message());
  fsync_directory(root);
}

void write_latest(const std::string& root, const std::string& name) {
  const fs::path tmp = fs::path(root) / (std::string(kLatestName) + ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << name << "\n";
  }
  fsync_file(tmp.string());
  fs::rename(tmp, fs::path(root) / kLatestName);
  fsync_directory(root);
}

std::string read_latest(const std::string& root) {
  const fs::path path = fs::path(root) / kLatestName;
  std::error_code ec;
  if (!fs::is_regular_file(fs::status(path, ec))) return "";
  std::ifstream in(path);
  std::string name;
  if (in) std::getline(in, name);
  while (!name.empty() && (name.back() == '\r' || name.back() == ' ')) name.pop_back();
  return name;
}

std::string new_run_id() {
  std::random_device source;
  const uint64_t id = (uint64_t(source()) << 32) ^ uint64_t(source());
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(id));
  return hex;
}

}  // namespace moe::ckpt
