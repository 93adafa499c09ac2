// Writing the page of `moe report` (launch/sweep/report_output.h).
#include "launch/sweep/report_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "core/error.h"
#include "launch/run/run_dir.h"
#include "launch/sweep/report_input.h"
#include "launch/sweep/report_page.h"

namespace moe::report {
namespace fs = std::filesystem;

namespace {

// --out's directory, open, and its name in it: every later step is relative to the directory's descriptor, so a
// directory renamed or replaced meanwhile cannot redirect the write.
struct Target {
  Fd dir;
  std::string name;
};

[[noreturn]] void refuse(const fs::path& out, const std::string& why) {
  MOE_BAD_INPUT("--out " << out.string() << ": " << why << "; nothing written");
}

// Refuses a file inside the run or sweep directory other than PATH/report.html.
void check_not_inside(const fs::path& out, const fs::path& parent, const std::string& name, const fs::path& input) {
  std::error_code ec;
  const fs::path dir = fs::canonical(parent, ec), root = fs::canonical(input, ec);
  if (dir.empty() || root.empty()) return;
  const fs::path rel = dir.lexically_relative(root);
  if (rel.empty() || *rel.begin() == "..") return;  // outside
  if (rel == "." && name == "report.html") return;
  refuse(out, "is inside the directory being reported (" + root.string() +
                  "), where only its report.html may be written; choose a path outside it");
}

// Refuses an existing --out that is not a page this program wrote.
void check_existing(const fs::path& out, const Target& t) {
  struct stat st {};
  if (::fstatat(t.dir.get(), t.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return;
    refuse(out, std::string("cannot be examined (") + std::strerror(errno) + ")");
  }
  if (S_ISLNK(st.st_mode)) refuse(out, "is a symbolic link; the page is never written through a link");
  if (!S_ISREG(st.st_mode)) refuse(out, "exists and is not a regular file (a directory, FIFO or device)");
  const Fd fd(::openat(t.dir.get(), t.name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))
    refuse(out, "exists and cannot be read to check that it is a page of moe report");
  std::string start(kPageStart.size(), '\0');
  size_t got = 0;
  while (got < start.size()) {
    const ssize_t n = ::read(fd.get(), start.data() + got, start.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += size_t(n);
  }
  if (got != start.size() || start != kPageStart)
    refuse(out,
           "exists and is not a page moe report wrote (it does not begin with the page's mark); remove it or "
           "choose another --out");
}

Target checked_target(const fs::path& out, const fs::path& input) {
  const std::string name = out.filename().string();
  if (name.empty() || name == "." || name == "..") refuse(out, "names a directory; expected FILE.html");
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  Target t{Fd(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)), name};
  if (t.dir.get() < 0)
    refuse(out, "its directory " + parent.string() + " cannot be opened (" + std::strerror(errno) +
                    "); expected an existing directory");
  check_not_inside(out, parent, name, input);
  check_existing(out, t);
  return t;
}

std::string temporary_name(const std::string& name) {
  static std::mt19937_64 random(std::random_device{}());
  char suffix[40];
  std::snprintf(suffix, sizeof suffix, ".%d.%016llx.tmp", int(::getpid()), (unsigned long long)random());
  return "." + name + suffix;
}

bool write_all(int fd, const std::string& text) {
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += size_t(n);
  }
  return ::fsync(fd) == 0;
}

}  // namespace

void check_output(const fs::path& out, const fs::path& input_dir) {
  checked_target(out, input_dir);
  check_dir_writable(out.has_parent_path() ? out.parent_path().string() : ".", "--out " + out.string());
}

void write_output(const fs::path& out, const fs::path& input_dir, const std::string& html) {
  const Target t = checked_target(out, input_dir);
  std::string tmp;
  Fd fd;
  // O_EXCL: a name already taken (by anything, a planted link included) is never opened; another is drawn.
  for (int attempt = 0; attempt < 100 && fd.get() < 0; ++attempt) {
    tmp = temporary_name(t.name);
    fd = Fd(::openat(t.dir.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (fd.get() < 0 && errno != EEXIST)
      refuse(out, "cannot create a temporary file beside it (" + std::string(std::strerror(errno)) + ")");
  }
  if (fd.get() < 0) refuse(out, "no free temporary name beside it");
  const bool written = write_all(fd.get(), html);
  const int error = errno;
  const bool closed = ::close(fd.release()) == 0;
  if (!written || !closed || ::renameat(t.dir.get(), tmp.c_str(), t.dir.get(), t.name.c_str()) != 0) {
    const std::string why = std::strerror(written && closed ? errno : error);
    ::unlinkat(t.dir.get(), tmp.c_str(), 0);
    refuse(out, "cannot be written (" + why + ")");
  }
}

}  // namespace moe::report
