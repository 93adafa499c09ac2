// The run-directory lock (launch/run/run_lock.h): a second holder is refused with the first one's host and
// pid, whether in another process (fork) or in the same one; a file left by a dead process is taken
// over; a process carrying the holder's token (a supervisor's rank) inherits the lock; a refused or
// released lock leaves no directory it created; a .lock that is a symbolic link, a FIFO or a directory is
// refused naming it (never followed, never waited on); the lock lives on in a child that inherited its
// descriptor (spawn_tied), and a tied child dies with its parent even when the parent is killed with SIGKILL.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/host.h"
#include "launch/run/run_lock.h"
#include "launch/supervise/job_processes.h"
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

namespace {

// The BadInput message of acquiring `run`, or "" when it was taken.
std::string refusal(const std::string& run) {
  try {
    RunLock::acquire(run);
    return "";
  } catch (const moe::Error& e) {
    return e.kind() == moe::ErrorKind::BadInput ? e.message() : "not BadInput: " + e.message();
  }
}

bool alive(pid_t pid) {
  const std::string stat = moe::test_support::read_text_if_any("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

// True once `pid` is gone (or a zombie), polling up to `seconds`.
bool gone_within(pid_t pid, double seconds) {
  for (int i = 0; i < int(seconds * 50); ++i) {
    if (!alive(pid)) return true;
    ::usleep(20000);
  }
  return !alive(pid);
}

}  // namespace

TEST(RunLock, ALockThatIsALinkAFifoOrADirectoryIsRefusedNamingIt) {
  TempDir dir("lock-planted");
  const std::string victim = (dir.path() / "victim.txt").string();
  { std::ofstream(victim) << "precious\n"; }
  for (const std::string kind : {"symlink", "dangling", "fifo", "directory"}) {
    const std::string run = (dir.path() / kind).string();
    fs::create_directories(run);
    const std::string lock = run + "/.lock";
    if (kind == "symlink") fs::create_symlink(victim, lock);
    if (kind == "dangling") fs::create_symlink(dir.path() / "nowhere", lock);
    if (kind == "fifo") {
      ASSERT_EQ(::mkfifo(lock.c_str(), 0644), 0);
    }
    if (kind == "directory") fs::create_directories(lock);
    const std::string message = refusal(run);  // a FIFO opened without O_NONBLOCK would hang here
    EXPECT_NE(message.find(lock), std::string::npos) << kind << ": " << message;
    EXPECT_EQ(message.find("not BadInput"), std::string::npos) << kind << ": " << message;
    EXPECT_FALSE(RunLock::read_holder(run).has_value()) << kind;
  }
  EXPECT_EQ(moe::test_support::read_text_if_any(victim), "precious\n") << "nothing written through the link";
  EXPECT_FALSE(fs::exists(dir.path() / "nowhere"));
}

namespace {

// A supervisor in a child process: takes the lock of `run`, starts `sleep 30` tied to it with
// `death_signal` and the lock's descriptor, and waits to be killed. Returns {supervisor, job}.
std::pair<pid_t, pid_t> start_supervisor(const std::string& run, int death_signal) {
  int pid_pipe[2];
  if (::pipe(pid_pipe) != 0) return {0, 0};
  const pid_t supervisor = ::fork();
  if (supervisor == 0) {
    RunLock lock = RunLock::acquire(run, "supervisor");
    const pid_t job = moe::spawn_tied({"sleep", "30"}, {"PATH=/usr/bin:/bin"},
                                      {.death_signal = death_signal, .keep_fd = lock.descriptor(), .output_fd = -1});
    (void)!::write(pid_pipe[1], &job, sizeof job);
    for (;;) ::pause();
  }
  pid_t job = 0;
  if (::read(pid_pipe[0], &job, sizeof job) != ssize_t(sizeof job)) job = 0;
  ::close(pid_pipe[0]), ::close(pid_pipe[1]);
  return {supervisor, job};
}

}  // namespace

// A supervisor killed with SIGKILL: its lock lives on in the job that inherited the descriptor (here a job
// whose parent-death signal is harmless), and is free once the job is gone.
TEST(RunLock, TheLockOutlivesASupervisorKilledOutrightWhileItsJobRuns) {
  TempDir dir("lock-outlives");
  const std::string run = (dir.path() / "run").string();
  const auto [supervisor, job] = start_supervisor(run, SIGCONT);
  ASSERT_GT(job, 0);
  ::kill(supervisor, SIGKILL);
  ::waitpid(supervisor, nullptr, 0);
  ASSERT_TRUE(alive(job));
  const std::string message = refusal(run);
  EXPECT_NE(message.find("in use by process " + std::to_string(supervisor)), std::string::npos) << message;
  ::kill(job, SIGKILL);
  EXPECT_TRUE(gone_within(job, 10));
  EXPECT_EQ(refusal(run), "") << "the lock is free once the job is gone";
}

// The parent-death signal: a job tied with SIGTERM ends when its supervisor is killed with SIGKILL.
TEST(RunLock, ATiedJobDiesWithItsSupervisor) {
  TempDir dir("lock-tied");
  const std::string run = (dir.path() / "run").string();
  const auto [supervisor, job] = start_supervisor(run, SIGTERM);
  ASSERT_GT(job, 0);
  ASSERT_TRUE(alive(job));
  ::kill(supervisor, SIGKILL);
  ::waitpid(supervisor, nullptr, 0);
  EXPECT_TRUE(gone_within(job, 10)) << "the tied child outlived its parent";
  EXPECT_EQ(refusal(run), "");
}

TEST(RunLock, ATiedChildThatCannotStartIsBadInputNamingTheProgram) {
  try {
    moe::spawn_tied({"/nonexistent/mpirun", "-np", "1"}, {}, {});
    ADD_FAILURE() << "started";
  } catch (const moe::Error& e) {
    EXPECT_EQ(e.kind(), moe::ErrorKind::BadInput);
    EXPECT_NE(e.message().find("/nonexistent/mpirun"), std::string::npos) << e.message();
  }
}
