// The output directory of `moe prep` (see prep_output.h).
#include "data/prep_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace moe::data {
namespace {

namespace fs = std::filesystem;

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISREG(mode)) return "a file";
  return "not a directory";
}

// Publishes `from` as `to` only if `to` does not exist. RENAME_NOREPLACE makes that atomic; where the file
// system lacks it, `to` is checked just before a plain rename.
int rename_no_replace(const fs::path& from, const fs::path& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return -1;
  struct stat st {};
  if (::lstat(to.c_str(), &st) == 0) return errno = EEXIST, -1;
  return ::rename(from.c_str(), to.c_str());
}

}  // namespace

fs::path out_path(const std::string& out) {
  std::string text = out;
  while (text.size() > 1 && text.back() == '/') text.pop_back();
  const fs::path path(text);
  const std::string name = path.filename().string();
  if (text.empty() || text == "/" || name == "." || name == "..")
    MOE_BAD_INPUT("--out '" << out << "': expected the path of a new directory to write");
  return path;
}

void check_out_path(const std::string& out) {
  const fs::path path = out_path(out);
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0)
    MOE_BAD_INPUT("--out " << out << " exists (" << kind_of(st.st_mode)
                           << "); moe prep writes a new directory and overwrites nothing");
  if (errno != ENOENT && errno != ENOTDIR)
    MOE_BAD_INPUT("--out " << out << ": cannot be used (" << std::strerror(errno) << ")");
  // The nearest existing parent must be a directory to create in (the others are made).
  for (fs::path p = path.parent_path();; p = p.parent_path()) {
    const fs::path at = p.empty() ? fs::path(".") : p;
    if (::stat(at.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode))
        MOE_BAD_INPUT("--out " << out << ": " << at.string() << " is " << kind_of(st.st_mode)
                               << ", not a directory; name a new directory");
      if (::access(at.c_str(), W_OK | X_OK) != 0)
        MOE_BAD_INPUT("--out " << out << ": cannot create a directory in " << at.string() << " ("
                               << std::strerror(errno) << ")");
      return;
    }
    if (errno != ENOENT && errno != ENOTDIR)
      MOE_BAD_INPUT("--out " << out << ": " << at.string() << " cannot be used (" << std::strerror(errno) << ")");
    if (p.empty() || p == p.parent_path()) return;
  }
}

OutputDir::OutputDir(const std::string& out) : out_text_(out), out_(fs::absolute(out_path(out))) {
  std::vector<fs::path> missing;
  for (fs::path p = out_.parent_path(); !p.empty() && p != p.parent_path(); p = p.parent_path()) {
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0) break;
    missing.insert(missing.begin(), p);
  }
  for (const fs::path& p : missing) {
    if (::mkdir(p.c_str(), 0777) == 0) {
      made_.push_back(p);
    } else if (errno != EEXIST) {
      MOE_BAD_INPUT("--out " << out << ": cannot create " << p.string() << " (" << std::strerror(errno) << ")");
    }
  }
  const std::string stem = out_.filename().string() + ".partial-" + std::to_string(::getpid());
  for (int n = 0;; ++n) {
    partial_ = out_.parent_path() / (n == 0 ? stem : stem + "-" + std::to_string(n));
    if (::mkdir(partial_.c_str(), 0777) == 0) return;
    if (errno != EEXIST || n == 1000) {
      const int error = errno;
      partial_.clear();
      MOE_BAD_INPUT("--out " << out << ": cannot create a directory beside it (" << std::strerror(error) << ")");
    }
  }
}

OutputDir::~OutputDir() {
  if (committed_) return;
  std::error_code ec;
  if (!partial_.empty()) fs::remove_all(partial_, ec);  // made new above: only this run's files are in it
  for (auto it = made_.rbegin(); it != made_.rend(); ++it) ::rmdir(it->c_str());  // only when still empty
}

void OutputDir::commit() {
  if (rename_no_replace(partial_, out_) != 0) {
    const int error = errno;
    if (error == EEXIST || error == ENOTEMPTY)
      MOE_BAD_INPUT("--out " << out_text_ << " was created while moe prep ran; it is left as it is and nothing "
                             << "was written (run again with a new --out)");
    MOE_RUN_FAILED("--out " << out_text_ << ": the finished output cannot be renamed into place ("
                            << std::strerror(error) << ")");
  }
  committed_ = true;
}

}  // namespace moe::data
