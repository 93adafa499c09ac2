// The directory an --out names: see output_dir.h.
#include "launch/run/output_dir.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "checkpoint/manifest.h"
#include "core/error.h"

namespace moe {

namespace fs = std::filesystem;

std::filesystem::path output_directory(const std::string& text, const std::string& option) {
  if (text.empty()) MOE_BAD_INPUT(option << ": an empty path; expected a directory to make");
  fs::path out = fs::path(text).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();  // "dir/" -> "dir"
  const std::string name = out.filename().string();
  if (name.empty() || name == "." || name == "..")
    MOE_BAD_INPUT(option << " " << text << ": name the directory itself, not \".\" or \"..\"");
  std::error_code ec;
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  if (!fs::is_directory(fs::status(parent, ec)))
    MOE_BAD_INPUT(option << " " << text << ": directory " << parent.string() << " does not exist");
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    MOE_BAD_INPUT(option << " " << text << ": cannot write into " << parent.string() << " (" << std::strerror(errno)
                         << ")");
  const std::string parent_name = fs::absolute(parent, ec).lexically_normal().filename().string();
  if (parent_name.rfind("step-", 0) == 0 || parent_name.rfind("tmp-step-", 0) == 0 ||
      fs::exists(parent / ckpt::kManifestName, ec))
    MOE_BAD_INPUT(option << " " << text << " is inside a checkpoint directory (" << parent.string()
                         << "); checkpoints are never modified, choose another place");
  return out;
}

}  // namespace moe
