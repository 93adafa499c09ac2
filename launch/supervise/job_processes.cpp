// Finding and ending the processes of one job on this host (/proc, kill, waitpid).
#include "launch/supervise/job_processes.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace moe {
namespace fs = std::filesystem;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// A /proc file's bytes, as many as could be read: none when the process is gone. A process that exits between the
// open and the read fails the read (ESRCH), which a stream's iterator throws as an exception ("basic_filebuf::
// underflow error reading the file: No such process", seen ending `moe launch` while it swept a crashed job's
// processes); read(2) just stops.
std::string read_all(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) text.append(buffer, size_t(n));
  ::close(fd);
  return text;
}

struct Stat {
  pid_t ppid = 0, pgid = 0;
  bool zombie = false;
};

// /proc/PID/stat after the command name (which may hold spaces and parentheses): state ppid pgrp.
std::optional<Stat> read_stat(pid_t pid) {
  const std::string text = read_all("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos || paren + 2 >= text.size()) return std::nullopt;
  std::istringstream rest(text.substr(paren + 2));
  char state = 0;
  long ppid = 0, pgid = 0;
  if (!(rest >> state >> ppid >> pgid)) return std::nullopt;
  return Stat{pid_t(ppid), pid_t(pgid), state == 'Z' || state == 'X'};
}

bool environ_has(const std::string& environ, const std::string& entry, bool prefix) {
  std::istringstream in(environ);
  for (std::string var; std::getline(in, var, '\0');)
    if (prefix ? var.rfind(entry, 0) == 0 : var == entry) return true;
  return false;
}

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

std::vector<char*> pointers(std::vector<std::string>& texts) {
  std::vector<char*> out;
  for (std::string& t : texts) out.push_back(t.data());
  out.push_back(nullptr);
  return out;
}

// Between fork and exec only async-signal-safe calls. Reports exec's errno on `report` (close-on-exec).
[[noreturn]] void exec_child(char* const* argv, char* const* envp, const TiedSpawn& how, pid_t parent, int report) {
  ::setpgid(0, 0);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGINT, &dfl, nullptr);
  ::sigaction(SIGTERM, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::prctl(PR_SET_PDEATHSIG, how.death_signal, 0, 0, 0);
  if (::getppid() != parent) ::_exit(128 + how.death_signal);  // the parent died before the line above
  if (how.output_fd >= 0) ::dup2(how.output_fd, 1), ::dup2(how.output_fd, 2);
  if (how.keep_fd >= 0) ::fcntl(how.keep_fd, F_SETFD, 0);  // this copy of the descriptor survives exec
  ::execvpe(argv[0], argv, envp);
  const int err = errno;
  (void)!::write(report, &err, sizeof err);
  ::_exit(127);
}

}  // namespace

pid_t spawn_tied(const std::vector<std::string>& args, const std::vector<std::string>& env, const TiedSpawn& how) {
  std::vector<std::string> arg_texts = args, env_texts = env;  // every allocation before fork
  const std::vector<char*> argv = pointers(arg_texts), envp = pointers(env_texts);
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) MOE_FAIL("cannot start " << args[0] << ": pipe: " << std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child == 0) exec_child(argv.data(), envp.data(), how, parent, report[1]);
  ::close(report[1]);
  if (child < 0) {
    ::close(report[0]);
    MOE_FAIL("cannot start " << args[0] << ": fork: " << std::strerror(errno));
  }
  int err = 0;
  ssize_t n = 0;
  while ((n = ::read(report[0], &err, sizeof err)) < 0 && errno == EINTR) {
  }
  ::close(report[0]);
  if (n == ssize_t(sizeof err)) {
    ::waitpid(child, nullptr, 0);
    MOE_BAD_INPUT("cannot start " << args[0] << ": " << std::strerror(err));
  }
  return child;
}

void die_with_parent(int sig, pid_t parent_at_start) {
  ::prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0);
  const pid_t now = ::getppid();
  if (now != parent_at_start || now == 1) ::_exit(128 + sig);
}

void JobProcesses::become_subreaper() { ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); }

JobProcesses::JobProcesses(pid_t mpirun, std::string secret, std::string rank_program)
    : mpirun_(mpirun), secret_entry_("MOE_HEARTBEAT_SECRET=" + secret), rank_program_(std::move(rank_program)) {}

std::optional<int> JobProcesses::poll_mpirun() {
  for (;;) {
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done <= 0) break;
    if (done == mpirun_) mpirun_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  return mpirun_code_;
}

void JobProcesses::note_rank(int64_t pid) {
  if (pid > 1 && pid != int64_t(::getpid())) noted_.insert(pid_t(pid));
}

std::vector<JobProcesses::Proc> JobProcesses::scan() const {
  std::map<pid_t, Stat> all;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (const auto st = read_stat(pid_t(std::atol(name.c_str())))) all[pid_t(std::atol(name.c_str()))] = *st;
  }
  std::multimap<pid_t, pid_t> children;
  for (const auto& [pid, st] : all) children.emplace(st.ppid, pid);
  std::set<pid_t> descendants;
  std::vector<pid_t> todo = {::getpid()};
  while (!todo.empty()) {
    const pid_t parent = todo.back();
    todo.pop_back();
    for (auto [it, end] = children.equal_range(parent); it != end; ++it)
      if (descendants.insert(it->second).second) todo.push_back(it->second);
  }
  std::vector<Proc> out;
  std::error_code ns_ec;
  const fs::path own_network = fs::read_symlink("/proc/self/ns/net", ns_ec);
  for (const auto& [pid, st] : all) {
    if (st.zombie || pid == ::getpid()) continue;
    // A process in another network namespace is on another host (tests/cluster makes hosts so): mpirun's to end,
    // as on a real cluster, where it would not even be visible here.
    std::error_code its_ec;
    const fs::path network = fs::read_symlink("/proc/" + std::to_string(pid) + "/ns/net", its_ec);
    if (!ns_ec && !its_ec && network != own_network) continue;
    const std::string environ = read_all("/proc/" + std::to_string(pid) + "/environ");
    if (!descendants.count(pid) && !environ_has(environ, secret_entry_, false)) continue;
    std::error_code exe_ec;
    const std::string exe = fs::read_symlink("/proc/" + std::to_string(pid) + "/exe", exe_ec).string();
    const bool rank = pid != mpirun_ && (noted_.count(pid) || environ_has(environ, "OMPI_COMM_WORLD_RANK=", true) ||
                                         (!rank_program_.empty() && exe.rfind(rank_program_, 0) == 0));
    out.push_back({pid, st.pgid, rank});
  }
  return out;
}

// A pid heard by heartbeat is gone when no such process exists, it is a zombie, or the pid now names
// a process outside the job (reused).
bool JobProcesses::gone_for_good(pid_t pid) const {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  const auto st = read_stat(pid);
  if (!st || st->zombie) return true;
  for (const Proc& p : scan())
    if (p.pid == pid) return false;
  return true;
}

int64_t JobProcesses::forward_stop() {
  int64_t sent = 0;
  for (const Proc& p : scan())
    if (p.rank && termed_.insert(p.pid).second) {
      ::kill(p.pid, SIGUSR1);  // the ranks' request for a clean stop (launch/train/stop_signal.h)
      ::kill(p.pid, SIGCONT);  // a stopped rank must run to see it
      ++sent;
    }
  return sent;
}

bool JobProcesses::all_gone() {
  poll_mpirun();
  if (!scan().empty()) return false;
  for (pid_t pid : noted_)
    if (!gone_for_good(pid)) return false;
  return !(::kill(-mpirun_, 0) == 0 || errno != ESRCH);
}

JobProcesses::EndReport JobProcesses::end_all(double mpirun_grace_s, double verify_s,
                                              const std::function<bool()>& hurry) {
  EndReport report;
  // mpirun's own group is spared until it has had its chance to end the ranks on other hosts.
  auto kill_round = [&](bool mpirun_too) {
    for (const Proc& p : scan()) {
      if (p.pid == mpirun_ && !mpirun_too) continue;
      ::kill(p.pid, SIGKILL);
      if (seen_.insert(p.pid).second) ++report.killed;
      if (p.pgid > 1 && p.pgid != ::getpgrp() && (mpirun_too || p.pgid != mpirun_)) ::kill(-p.pgid, SIGKILL);
    }
  };
  kill_round(false);
  if (!poll_mpirun()) {
    ::kill(-mpirun_, SIGCONT);
    ::kill(-mpirun_, SIGTERM);
    for (const double until = now_s() + mpirun_grace_s; !poll_mpirun() && now_s() < until && !hurry();) sleep_s(0.05);
  }
  ::kill(-mpirun_, SIGKILL);
  for (const double until = now_s() + verify_s;;) {
    kill_round(true);
    sleep_s(0.05);
    if (all_gone() || now_s() > until) break;
  }
  report.left = int64_t(scan().size());  // a pid heard by heartbeat is gone unless it is one of these
  if (report.left == 0 && !(::kill(-mpirun_, 0) != 0 && errno == ESRCH)) report.left = 1;  // the group is not empty
  return report;
}

}  // namespace moe
