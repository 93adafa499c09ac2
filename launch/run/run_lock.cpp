// The run-directory lock (flock on RUN_DIR/.lock).
#include "launch/run/run_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/host.h"

namespace moe {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int kAttempts = 20;               // a holder releasing (unlinking) between our open and our flock: try again
constexpr off_t kMaxHolderBytes = 1 << 20;  // a holder's JSON is a few hundred bytes

// The lock file opened without following a link and without blocking (a FIFO would wait for a writer), and
// only when it is a regular file: anything else planted at the path is refused, naming it.
int open_lock_file(const std::string& path, const std::string& option, const std::string& dir) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP)
      MOE_BAD_INPUT(option << " " << dir << ": the lock file " << path
                           << " is a symbolic link; a lock is never written through a link (remove it)");
    MOE_BAD_INPUT(option << " " << dir << ": cannot open the lock file " << path << ": " << std::strerror(err)
                         << (err == EISDIR ? " (a directory stands where the lock file goes; remove it)" : ""));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    MOE_BAD_INPUT(option << " " << dir << ": the lock file " << path
                         << " is not a regular file (a FIFO, device or socket stands there; remove it)");
  }
  return fd;
}

std::string random_token() {
  unsigned char bytes[16] = {};
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  urandom.read(reinterpret_cast<char*>(bytes), sizeof bytes);
  if (!urandom) MOE_FAIL("cannot read /dev/urandom for the run lock's token");
  char hex[33];
  for (int i = 0; i < 16; ++i) std::snprintf(hex + 2 * i, 3, "%02x", bytes[i]);
  return hex;
}

std::string own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && text.back() == '\0') text.pop_back();
  for (char& c : text)
    if (c == '\0') c = ' ';
  return text;
}

bool pid_alive(int64_t pid) { return pid > 0 && (::kill(pid_t(pid), 0) == 0 || errno == EPERM); }

// The directories create_directories(dir) would make, deepest first.
std::vector<std::string> missing_dirs(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::path p = fs::absolute(dir, ec).lexically_normal(); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    out.push_back(p.string());
    if (p == p.parent_path()) break;
  }
  return out;
}

void write_holder(int fd, const std::string& path, const std::string& command, const std::string& token) {
  const json holder = {{"host", host_name()},
                       {"pid", int64_t(::getpid())},
                       {"command", command.empty() ? own_command_line() : command},
                       {"started", utc_now()},
                       {"token", token}};
  const std::string text = holder.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != ssize_t(text.size()))
    MOE_RUN_FAILED("cannot write the run lock " << path << " (" << std::strerror(errno) << "; is the disk full?)");
  ::fsync(fd);
}

[[noreturn]] void refuse(const std::string& run_dir, const std::string& path, const RunLockHolder& h,
                         const std::string& option) {
  MOE_BAD_INPUT((option == "--run-dir" ? "run directory " : option + " directory ")
                << run_dir << " is in use by process " << h.pid << " on host " << h.host << " (since " << h.started
                << ": " << h.command << "; lock " << path << "). Wait for that run to end, stop it (kill " << h.pid
                << " on " << h.host << "), or choose another " << option);
}

}  // namespace

std::optional<RunLockHolder> RunLock::read_holder(const std::string& run_dir) {
  // Never through a link and never blocking: a FIFO or directory planted as .lock names no holder.
  const std::string path = (fs::path(run_dir) / ".lock").string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= kMaxHolderBytes) {
    text.resize(size_t(st.st_size));
    const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
    text.resize(n > 0 ? size_t(n) : 0);
  }
  ::close(fd);
  try {
    const json j = json::parse(text);
    RunLockHolder h;
    h.host = j.value("host", ""), h.pid = j.value("pid", int64_t(0)), h.command = j.value("command", "");
    h.started = j.value("started", ""), h.token = j.value("token", "");
    return h;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

RunLock RunLock::acquire(const std::string& run_dir, const std::string& command, const std::string& option) {
  RunLock lock;
  lock.path_ = (fs::path(run_dir) / ".lock").string();
  lock.created_dirs_ = missing_dirs(run_dir);
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) MOE_BAD_INPUT(option << " " << run_dir << ": cannot be created (" << ec.message() << ")");
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    int fd = -1;
    try {
      fd = open_lock_file(lock.path_, option, run_dir);
    } catch (const Error&) {
      lock.release(true);  // nothing left behind by a refusal
      throw;
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      if (err != EWOULDBLOCK) MOE_FAIL("cannot lock " << lock.path_ << ": " << std::strerror(err));
      if (const auto holder = read_holder(run_dir)) refuse(run_dir, lock.path_, *holder, option);
      ::usleep(10000);  // the holder is writing its name, or just released
      continue;
    }
    // The file we locked must still be the one at the path: a holder unlinks it when it releases.
    struct stat ours {
    }, at_path{};
    if (::fstat(fd, &ours) != 0 || ::lstat(lock.path_.c_str(), &at_path) != 0 || ours.st_ino != at_path.st_ino ||
        ours.st_dev != at_path.st_dev) {
      ::close(fd);
      continue;
    }
    lock.fd_ = fd;
    lock.token_ = random_token();
    write_holder(fd, lock.path_, command, lock.token_);  // a stale holder's content is replaced
    return lock;
  }
  MOE_BAD_INPUT(run_dir << " is in use: " << lock.path_
                        << " is locked by a process that does not say who it is; wait for it to end, or choose another "
                        << option);
}

RunLock RunLock::acquire_or_inherit(const std::string& run_dir, const std::string& command) {
  const char* token = std::getenv(kTokenVariable);
  if (token && *token) {
    const auto holder = read_holder(run_dir);
    if (holder && holder->token == token && (holder->host != host_name() || pid_alive(holder->pid))) {
      RunLock lock;
      lock.path_ = (fs::path(run_dir) / ".lock").string();
      lock.token_ = token;
      lock.inherited_ = true;
      return lock;
    }
  }
  return acquire(run_dir, command);
}

RunLock::RunLock(RunLock&& other) noexcept { *this = std::move(other); }

RunLock& RunLock::operator=(RunLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = other.fd_, inherited_ = other.inherited_;
    path_ = std::move(other.path_), token_ = std::move(other.token_), created_dirs_ = std::move(other.created_dirs_);
    other.fd_ = -1, other.inherited_ = false, other.created_dirs_.clear();
  }
  return *this;
}

RunLock::~RunLock() { release(); }

void RunLock::release(bool remove_created_dirs) {
  if (fd_ >= 0) {
    ::unlink(path_.c_str());  // while still locked: a waiter that opened the old file sees it gone and retries
    ::close(fd_);
    fd_ = -1;
  }
  if (remove_created_dirs) {
    std::error_code ec;
    for (const std::string& dir : created_dirs_)
      if (!fs::remove(dir, ec)) break;  // not empty (or gone): keep it and everything above it
  }
  created_dirs_.clear();
}

}  // namespace moe
