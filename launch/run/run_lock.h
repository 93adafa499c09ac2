// The run-directory lock: one launch (or one plain `moe train`) writes into a run directory at a time. An
// advisory flock(2) on RUN_DIR/.lock, held through an open descriptor for the life of the object, so the
// kernel drops it when the holder dies however it dies. The file names the holder as JSON (host, pid,
// command, started, token). A file left by a dead holder is taken over. The supervisor hands its random
// token to the ranks it starts (MOE_RUN_LOCK_TOKEN in their environment), and a rank that finds that
// token in the file of a live holder runs under its supervisor's lock instead of refusing. A flock belongs
// to the open file, not the process: the supervisor's mpirun inherits the descriptor, so the lock outlives
// a supervisor killed with SIGKILL for as long as its job runs (launch/supervise/job_processes.h).
// Not here: what a run directory holds, or whether it may be overwritten (launch/run/run_dir.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moe {

struct RunLockHolder {
  std::string host;
  int64_t pid = 0;
  std::string command;
  std::string started;  // UTC, ISO 8601
  std::string token;
};

class RunLock {
 public:
  // The environment variable that carries a supervisor's token to the ranks it starts.
  static constexpr const char* kTokenVariable = "MOE_RUN_LOCK_TOKEN";

  // Takes RUN_DIR/.lock (creating RUN_DIR and its missing parents). When a live process holds it:
  // moe::Error(BadInput) naming the holder's host and pid, the run directory and what to do. `command`
  // is recorded in the file; empty: this process's command line. `option` names the directory in messages
  // (--run-dir, or moe sweep's --out). A .lock that is a symbolic link, a directory, a FIFO or anything but
  // a regular file is refused (BadInput naming it): it is opened without following links or blocking.
  static RunLock acquire(const std::string& run_dir, const std::string& command = "",
                         const std::string& option = "--run-dir");
  // As acquire, except that when kTokenVariable is set and equals the token of the file, whose holder is
  // alive (or on another host, where its pid cannot be checked), the lock is its supervisor's and is
  // accepted without taking it: inherited() is true and nothing is written.
  static RunLock acquire_or_inherit(const std::string& run_dir, const std::string& command = "");
  // What RUN_DIR/.lock says, if it exists and parses (it may be stale).
  static std::optional<RunLockHolder> read_holder(const std::string& run_dir);

  RunLock(RunLock&& other) noexcept;
  RunLock& operator=(RunLock&& other) noexcept;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  ~RunLock();  // release()

  bool held() const { return fd_ >= 0; }  // taken by this object and not released
  // The locked descriptor (-1 when not held). A child that inherits a duplicate of it (the supervisor's
  // mpirun) keeps the lock taken for as long as it lives, even past this process's death.
  int descriptor() const { return fd_; }
  bool inherited() const { return inherited_; }
  const std::string& token() const { return token_; }  // this lock's (or, inherited, the supervisor's)
  const std::string& path() const { return path_; }    // RUN_DIR/.lock

  // Removes the lock file and closes the descriptor (nothing for an inherited lock). With
  // remove_created_dirs, the directories acquire() created are removed again when they are empty, so a
  // refused launch leaves nothing behind.
  void release(bool remove_created_dirs = false);

 private:
  RunLock() = default;
  int fd_ = -1;
  bool inherited_ = false;
  std::string path_, token_;
  std::vector<std::string> created_dirs_;  // deepest first
};

}  // namespace moe
