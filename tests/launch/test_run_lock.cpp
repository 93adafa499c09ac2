// The run-directory lock (launch/run_lock.h): a second holder is refused with the first one's host and
// pid, whether in another process (fork) or in the same one; a file left by a dead process is taken
// over; a process carrying the holder's token (a supervisor's rank) inherits the lock; a refused or
// released lock leaves no directory it created.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/host.h"
#include "launch/run_lock.h"
#include "run_compare.h"

namespace {
using moe::RunLock;
using moe::test_support::TempDir;
namespace fs = std::filesystem;

// Runs `body` in a forked child; its exit code (the child never returns into gtest).
int in_child(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 99;
    try {
      code = body();
    } catch (...) {
      code = 98;
    }
    std::_Exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// 0 when `acquire` is refused with BadInput naming `holder_pid`, this host and the run directory.
int refused_naming(const std::function<void()>& acquire, pid_t holder_pid, const std::string& run_dir) {
  try {
    acquire();
    return 1;  // taken: wrong
  } catch (const moe::Error& e) {
    if (e.kind() != moe::ErrorKind::BadInput) return 2;
    const std::string m = e.message();
    const bool named = m.find("process " + std::to_string(holder_pid)) != std::string::npos &&
                       m.find(moe::host_name()) != std::string::npos && m.find(run_dir) != std::string::npos &&
                       m.find("another --run-dir") != std::string::npos;
    return named ? 0 : 3;
  }
}

TEST(RunLock, SecondHolderInAnotherProcessIsRefusedNamingTheFirst) {
  TempDir dir("lock-fork");
  const std::string run = (dir.path() / "run").string();
  const pid_t parent = ::getpid();  // evaluated here: in the child getpid() is the child's
  RunLock lock = RunLock::acquire(run, "moe launch --test");
  ASSERT_TRUE(lock.held());
  EXPECT_TRUE(fs::exists(run + "/.lock"));
  const auto holder = RunLock::read_holder(run);
  ASSERT_TRUE(holder.has_value());
  EXPECT_EQ(holder->pid, int64_t(::getpid()));
  EXPECT_EQ(holder->host, moe::host_name());
  EXPECT_EQ(holder->command, "moe launch --test");
  EXPECT_EQ(holder->token, lock.token());
  EXPECT_EQ(lock.token().size(), 32u);
  // The child inherits our descriptor, but its own open of the file is a lock of its own: refused.
  EXPECT_EQ(in_child([&] { return refused_naming([&] { RunLock::acquire(run); }, parent, run); }), 0);
  // Without the token in its environment, acquire_or_inherit refuses too.
  ::unsetenv(RunLock::kTokenVariable);
  EXPECT_EQ(in_child([&] { return refused_naming([&] { RunLock::acquire_or_inherit(run); }, parent, run); }), 0);
  // Released: the next one takes it.
  lock.release();
  EXPECT_FALSE(lock.held());
  EXPECT_FALSE(fs::exists(run + "/.lock"));
  EXPECT_EQ(in_child([&] { return RunLock::acquire(run).held() ? 0 : 1; }), 0);
}

TEST(RunLock, SecondHolderInTheSameProcessIsRefused) {
  TempDir dir("lock-same");
  const std::string run = (dir.path() / "run").string();
  RunLock first = RunLock::acquire(run);
  EXPECT_EQ(refused_naming([&] { RunLock::acquire(run); }, ::getpid(), run), 0);
  RunLock moved = std::move(first);  // the lock travels with the object
  EXPECT_TRUE(moved.held());
  EXPECT_FALSE(first.held());
  EXPECT_EQ(refused_naming([&] { RunLock::acquire(run); }, ::getpid(), run), 0);
}

TEST(RunLock, StaleFileOfADeadProcessIsTakenOver) {
  TempDir dir("lock-stale");
  const std::string run = (dir.path() / "run").string();
  fs::create_directories(run);
  const pid_t dead = ::fork();
  if (dead == 0) std::_Exit(0);
  ::waitpid(dead, nullptr, 0);  // a pid no process has any more
  {
    std::ofstream out(run + "/.lock");
    out << nlohmann::json{{"host", moe::host_name()},
                          {"pid", dead},
                          {"command", "moe launch (crashed)"},
                          {"started", "2020-01-01T00:00:00Z"},
                          {"token", "0123"}}
               .dump();
  }
  RunLock lock = RunLock::acquire(run);
  EXPECT_TRUE(lock.held());
  const auto holder = RunLock::read_holder(run);
  ASSERT_TRUE(holder.has_value());
  EXPECT_EQ(holder->pid, int64_t(::getpid())) << "the stale content is rewritten";
  EXPECT_EQ(holder->token, lock.token());
  EXPECT_NE(holder->started, "2020-01-01T00:00:00Z");
}

TEST(RunLock, RankWithTheSupervisorsTokenInheritsTheLock) {
  TempDir dir("lock-inherit");
  const std::string run = (dir.path() / "run").string();
  const pid_t parent = ::getpid();
  RunLock supervisor = RunLock::acquire(run);
  const std::string before = moe::test_support::read_text_if_any(run + "/.lock");
  ::setenv(RunLock::kTokenVariable, supervisor.token().c_str(), 1);
  EXPECT_EQ(in_child([&] {
              RunLock rank = RunLock::acquire_or_inherit(run);
              return rank.inherited() && !rank.held() && rank.token() == supervisor.token() ? 0 : 1;
            }),
            0);
  // The rank's lock ends without touching the supervisor's file.
  EXPECT_EQ(moe::test_support::read_text_if_any(run + "/.lock"), before);
  // A wrong token is not inheritance: refused, naming the holder.
  ::setenv(RunLock::kTokenVariable, "not-the-token", 1);
  EXPECT_EQ(in_child([&] { return refused_naming([&] { RunLock::acquire_or_inherit(run); }, parent, run); }), 0);
  // The right token in a file whose holder is dead is not inheritance either: the lock is taken.
  ::setenv(RunLock::kTokenVariable, supervisor.token().c_str(), 1);
  supervisor.release();
  EXPECT_EQ(in_child([&] {
              RunLock rank = RunLock::acquire_or_inherit(run);
              return !rank.inherited() && rank.held() ? 0 : 1;
            }),
            0);
  ::unsetenv(RunLock::kTokenVariable);
}

TEST(RunLock, ReleaseCanRemoveTheDirectoriesItCreated) {
  TempDir dir("lock-dirs");
  const fs::path run = dir.path() / "a" / "b" / "run";
  RunLock lock = RunLock::acquire(run.string());
  EXPECT_TRUE(fs::is_directory(run));
  lock.release(true);
  EXPECT_FALSE(fs::exists(dir.path() / "a")) << "every directory the lock created is gone";
  EXPECT_TRUE(fs::exists(dir.path()));
  // A directory that held something before is kept.
  fs::create_directories(run);
  RunLock again = RunLock::acquire(run.string());
  again.release(true);
  EXPECT_TRUE(fs::is_directory(run));
}

}  // namespace
