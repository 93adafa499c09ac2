// Probing hosts through mpirun's remote shell, all at once, within a bounded time.
#include "launch/supervise/host_probe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "launch/supervise/hosts.h"
#include "launch/supervise/job_processes.h"

extern char** environ;

namespace moe {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<std::string> words_of(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::string shell_quoted(const std::string& text) {
  std::string out = "'";
  for (const char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// What runs on the host: the program's check, then the free space (df's available 1K blocks) of the nearest
// existing directory of `disk`. The markers keep the answer apart from anything a login prints.
// Then, with bash (its /dev/tcp), a connection to each peer at once: connected or refused is reached; a timeout or
// no route is not, twice in a row (a single failure right after a link came up is not a partition). The last
// error comes back with the peer's name.
std::string peers_command(const ProbeSpec& spec, const std::vector<std::string>& peers) {
  if (!spec.check_peers || peers.empty()) return "";
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.2f", std::max(0.01, spec.timeout_s / 6));
  std::string list;
  for (const std::string& p : peers) list += " " + shell_quoted(p);
  return " if command -v bash >/dev/null; then for h in" + list + "; do ( for try in 1 2; do r=$(timeout " +
         std::string(seconds) +
         " bash -c \"exec 3<>/dev/tcp/$h/22\" 2>&1); c=$?; case \"$c $r\" in 0\\ *|*refused*) exit 0;; esac; done; "
         "echo MOE_PROBE_UNREACHABLE \"$h\" \"(exit $c: $(echo $r | tail -c 120))\" ) & done; wait; fi;";
}

std::string probe_command(const ProbeSpec& spec, const std::vector<std::string>& peers) {
  return "p=" + shell_quoted(spec.program) + "; d=" + shell_quoted(spec.disk) +
         "; if [ ! -x \"$p\" ] || [ -d \"$p\" ]; then echo MOE_PROBE_NO_PROGRAM; exit 3; fi; "
         "while [ ! -d \"$d\" ]; do d=$(dirname \"$d\"); done; "
         "echo MOE_PROBE_FREE_KB $(df -Pk \"$d\" | tail -n 1 | awk '{print $4}') \"$d\";" +
         peers_command(spec, peers);
}

struct Running {
  pid_t pid = -1;
  int out = -1;
  std::string text;
  bool done = false;
  int status = 0;
};

std::string last_line(const std::string& text) {
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

// The verdict from what the probe printed and how it ended.
void judge(const ProbeSpec& spec, const Running& r, HostProbe* probe) {
  if (!r.done) {
    probe->reason = "no answer within " + std::to_string(int64_t(std::ceil(spec.timeout_s))) +
                    " s (fault.probe_timeout_s): unreachable, or too slow to start a process";
    return;
  }
  if (r.text.find("MOE_PROBE_NO_PROGRAM") != std::string::npos) {
    probe->reason = "the program " + spec.program + " is missing there or not executable";
    return;
  }
  const size_t at = r.text.find("MOE_PROBE_FREE_KB ");
  const int code = WIFEXITED(r.status) ? WEXITSTATUS(r.status) : 128 + WTERMSIG(r.status);
  if (code != 0 || at == std::string::npos) {
    probe->reason = "cannot start a process there (exit code " + std::to_string(code) + ": " + last_line(r.text) + ")";
    return;
  }
  std::istringstream in(r.text.substr(at + 18));
  int64_t free_kb = -1;
  std::string dir;
  in >> free_kb >> dir;
  if (free_kb < 0) {
    probe->reason = "cannot read the free disk space there (" + last_line(r.text) + ")";
  } else if (free_kb * 1024 < spec.min_free_bytes) {
    probe->reason = "only " + std::to_string(free_kb / 1024) + " MiB free on " + dir + ", needs " +
                    std::to_string(spec.min_free_bytes / (1024 * 1024)) + " MiB";
  } else {
    probe->ok = true;
  }
  std::istringstream lines(r.text);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("MOE_PROBE_UNREACHABLE ", 0) == 0) {
      const std::string rest = line.substr(22);
      probe->unreachable_peers.push_back(rest.substr(0, rest.find(' ')));
      probe->peer_errors += (probe->peer_errors.empty() ? "" : "; ") + rest;
    }
}

// Starts `args` with its output (stdout and stderr) on a pipe that advance() reads.
Running start_reading(const std::string& host, const std::vector<std::string>& args) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) MOE_FAIL("cannot probe " << host << ": pipe: " << std::strerror(errno));
  Running r;
  r.out = pipe_fds[0];
  try {
    r.pid = spawn_tied(args, env, {.death_signal = SIGKILL, .keep_fd = -1, .output_fd = pipe_fds[1]});
  } catch (const Error& e) {
    ::close(pipe_fds[1]);
    r.done = true, r.status = 127 << 8, r.text = e.message();
    return r;
  }
  ::close(pipe_fds[1]);
  ::fcntl(r.out, F_SETFL, O_NONBLOCK);
  return r;
}

Running start_probe(const std::string& host, const std::vector<std::string>& peers, const ProbeSpec& spec) {
  if (host_is_local(host)) return start_reading(host, {"sh", "-c", probe_command(spec, peers)});
  std::vector<std::string> args = spec.agent;
  args.push_back(host);
  args.push_back(probe_command(spec, peers));
  return start_reading(host, args);
}

Running start_daemon_check(const std::string& host, const ProbeSpec& spec) {
  std::vector<std::string> args = spec.daemon_check;
  args.insert(args.end(), {"--host", host + ":1", "-np", "1", "true"});
  return start_reading(host, args);
}

// Reads what is there; reaps the probe once its output has ended.
void advance(Running& r) {
  char buf[4096];
  for (ssize_t n; (n = ::read(r.out, buf, sizeof buf)) > 0;)
    if (r.text.size() < 65536) r.text.append(buf, size_t(n));
  if (!r.done && r.pid > 0 && ::waitpid(r.pid, &r.status, WNOHANG) == r.pid) r.done = true;
}

}  // namespace

std::vector<std::string> rsh_agent_command(const std::vector<std::string>& mpirun_args, double timeout_s) {
  std::string agent;
  for (size_t i = 0; i + 2 < mpirun_args.size(); ++i)
    if ((mpirun_args[i] == "--mca" || mpirun_args[i] == "-mca") &&
        (mpirun_args[i + 1] == "plm_rsh_agent" || mpirun_args[i + 1] == "orte_rsh_agent"))
      agent = mpirun_args[i + 2];
  if (agent.empty())
    if (const char* env = std::getenv("OMPI_MCA_plm_rsh_agent")) agent = env;
  if (agent.empty()) agent = "ssh";
  agent = agent.substr(0, agent.find(':'));
  std::vector<std::string> command = words_of(agent);
  if (command.empty()) command = {"ssh"};
  if (command[0] == "ssh" || command[0].size() > 4 && command[0].substr(command[0].size() - 4) == "/ssh")
    command.insert(command.begin() + 1, {"-o", "BatchMode=yes", "-o",
                                         "ConnectTimeout=" + std::to_string(std::max<int64_t>(1, int64_t(timeout_s)))});
  return command;
}

namespace {

// Waits for every one of `running` (started at `started`) until timeout_s has passed since then; what is still
// running then is killed. Each one's seconds go to `seconds`.
void wait_all(std::vector<Running>& running, double started, double timeout_s, std::vector<double>* seconds) {
  for (;;) {
    bool all_done = true;
    for (size_t i = 0; i < running.size(); ++i) {
      if (running[i].done) continue;
      advance(running[i]);
      if (running[i].done) (*seconds)[i] = now_s() - started;
      all_done = all_done && running[i].done;
    }
    if (all_done || now_s() - started > timeout_s) break;
    ::usleep(20000);
  }
  for (size_t i = 0; i < running.size(); ++i) {
    Running& r = running[i];
    if (!r.done && r.pid > 0) {
      ::kill(-r.pid, SIGKILL);  // its process group: the remote shell and what it started here
      ::waitpid(r.pid, nullptr, 0);
      (*seconds)[i] = now_s() - started;
    }
    advance(r);
    if (r.out >= 0) ::close(r.out);
  }
}

// The daemon check of the hosts that passed the probe (ProbeSpec::daemon_check).
void check_daemons(const ProbeSpec& spec, std::vector<HostProbe>* probes) {
  std::vector<HostProbe*> checked;
  std::vector<Running> running;
  for (HostProbe& p : *probes)
    if (p.ok) checked.push_back(&p), running.push_back(start_daemon_check(p.host, spec));
  std::vector<double> seconds(running.size());
  wait_all(running, now_s(), spec.timeout_s, &seconds);
  for (size_t i = 0; i < running.size(); ++i) {
    HostProbe& p = *checked[i];
    p.seconds += seconds[i];
    const Running& r = running[i];
    const int code = !r.done ? -1 : WIFEXITED(r.status) ? WEXITSTATUS(r.status) : 128 + WTERMSIG(r.status);
    if (code == 0) continue;
    p.ok = false;
    p.reason = code < 0 ? "mpirun could not start a process there within " +
                              std::to_string(int64_t(std::ceil(spec.timeout_s))) + " s (fault.probe_timeout_s)"
                        : "mpirun cannot start its daemon or a process there (exit code " + std::to_string(code) +
                              ": " + last_line(r.text) + ")";
  }
}

}  // namespace

std::vector<HostProbe> probe_hosts(const std::vector<std::string>& hosts, const ProbeSpec& spec) {
  const double started = now_s();
  std::vector<Running> running;
  std::vector<HostProbe> probes(hosts.size());
  for (size_t i = 0; i < hosts.size(); ++i) {
    probes[i].host = hosts[i];
    std::vector<std::string> peers;
    for (const std::string& h : hosts)
      if (h != hosts[i]) peers.push_back(h);
    running.push_back(start_probe(hosts[i], peers, spec));
  }
  std::vector<double> seconds(hosts.size());
  wait_all(running, started, spec.timeout_s, &seconds);
  for (size_t i = 0; i < running.size(); ++i) {
    probes[i].seconds = seconds[i];
    judge(spec, running[i], &probes[i]);
  }
  if (!spec.daemon_check.empty()) check_daemons(spec, &probes);
  return probes;
}

}  // namespace moe
