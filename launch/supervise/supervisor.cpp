// The supervisor loop of `moe launch`.
#include "launch/supervise/supervisor.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "checkpoint/checkpointer.h"
#include "core/backend/cpu/thread_policy.h"
#include "core/error.h"
#include "core/host.h"
#include "launch/config/config.h"
#include "launch/run/run_dir.h"
#include "launch/run/run_lock.h"
#include "launch/supervise/hang_report.h"
#include "launch/supervise/host_check.h"
#include "launch/supervise/hosts.h"
#include "launch/supervise/job_processes.h"
#include "launch/supervise/slurm_hosts.h"
#include "launch/train/heartbeat.h"
#include "parallel/rank_grid.h"

extern char** environ;

namespace moe {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int kExitGaveUp = 3;
constexpr int kExitBadInput = 2;
constexpr int kMaxDetailedIgnored = 5;  // per reason and attempt; then only counted

// SIGINT/SIGTERM to the supervisor: the first asks the ranks to stop (and decides the exit code,
// 128 + signal); a second ends everything at once.
volatile sig_atomic_t g_signals = 0, g_first_signal = 0;
void on_signal(int sig) {
  if (g_signals == 0) g_first_signal = sig;
  g_signals = g_signals + 1;
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string random_secret() {
  unsigned char bytes[16] = {};
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  urandom.read(reinterpret_cast<char*>(bytes), sizeof bytes);
  if (!urandom) MOE_FAIL("cannot read /dev/urandom for the heartbeat secret");
  char hex[33];
  for (int i = 0; i < 16; ++i) std::snprintf(hex + 2 * i, 3, "%02x", bytes[i]);
  return hex;
}

// events.log: buffered until the job has really started (a first heartbeat) or failed, so a launch
// refused for bad input writes nothing.
class Events {
 public:
  explicit Events(fs::path path, bool echo) : path_(std::move(path)), echo_(echo) {}
  void add(json event) {
    event["time"] = utc_now();
    if (echo_) std::fprintf(stderr, "moe launch: %s\n", event.dump().c_str());
    pending_.push_back(event.dump());
    if (open_) flush();
  }
  void open() {
    open_ = true;
    flush();
  }

 private:
  void flush() {
    std::error_code ec;
    fs::create_directories(path_.parent_path(), ec);
    std::ofstream out(path_, std::ios::app);
    for (const std::string& line : pending_) out << line << "\n";
    pending_.clear();
  }
  fs::path path_;
  bool echo_;
  bool open_ = false;
  std::vector<std::string> pending_;
};

struct RankState {
  double last_seen = 0, progress_since = 0;
  int64_t step = 0, pid = 0;
  Phase phase = Phase::Setup;
  std::string host;
  FlightSummary flight;  // the communication state of its last beat
};

}  // namespace

const std::vector<std::string>& oversubscription_mpirun_args() {
  static const std::vector<std::string> args = {"--oversubscribe", "--bind-to",           "none",
                                                "--mca",           "mpi_yield_when_idle", "1"};
  return args;
}

void check_launch_layout(const Config& config, int64_t np) {
  const RankGrid grid({np, config.parallel.tp, config.parallel.pp, config.parallel.dp, config.parallel.ep, 1},
                      config.moe.num_experts);
  const int64_t dp = grid.sizes().dp;
  if (config.train.global_batch % (dp * config.train.micro_batch) != 0)
    MOE_BAD_INPUT("train.global_batch = " << config.train.global_batch
                                          << " is not a multiple of the data-parallel size "
                                          << "times train.micro_batch = " << dp << " * " << config.train.micro_batch
                                          << " = " << dp * config.train.micro_batch << " for --np " << np
                                          << "; choose --np, parallel.* or the batch sizes so that it is");
}

std::vector<HostSlots> read_hostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) MOE_BAD_INPUT("--hostfile " << path << ": cannot be read");
  std::vector<HostSlots> hosts;
  for (std::string line; std::getline(in, line);) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    HostSlots h;
    if (!(words >> h.name)) continue;
    for (std::string w; words >> w;)
      if (w.rfind("slots=", 0) == 0) h.slots = std::max<int64_t>(1, std::atoll(w.c_str() + 6));
    hosts.push_back(h);
  }
  if (hosts.empty()) MOE_BAD_INPUT("--hostfile " << path << ": lists no host");
  return hosts;
}

std::optional<ShrinkPlan> plan_shrink(const std::vector<HostSlots>& hosts, const std::string& failed_host,
                                      int64_t failures_of_host, int64_t np, const Config& config, std::string* why) {
  if (failures_of_host < 2) {
    *why = failed_host + " has failed " + std::to_string(failures_of_host) + " time(s); shrinking takes 2";
    return std::nullopt;
  }
  auto it = std::find_if(hosts.begin(), hosts.end(), [&](const HostSlots& h) { return h.name == failed_host; });
  if (it == hosts.end() || hosts.size() < 2) {
    *why = failed_host + " is not one of several hosts of the hostfile";
    return std::nullopt;
  }
  ShrinkPlan plan;
  plan.np = np - std::min(np - 1, it->slots);
  try {
    Config shrunk = config;
    shrunk.parallel.dp = 0;  // "auto" for the smaller world
    check_launch_layout(shrunk, plan.np);
  } catch (const Error& e) {
    *why = e.message();
    return std::nullopt;
  }
  for (const HostSlots& h : hosts)
    if (h.name != failed_host) plan.hosts.push_back(h);
  return plan;
}

namespace {

struct Listener {
  int sock = -1;
  std::string addr;  // host:port, handed to the ranks
  ~Listener() {
    if (sock >= 0) ::close(sock);
  }
};

// The heartbeat listener at `address` (fault.listen, or where the hosts reach this machine: launch/supervise/hosts.h),
// an ephemeral port.
void open_listener(const std::string& address, Listener* listener) {
  listener->sock = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (listener->sock < 0) MOE_FAIL("cannot open the heartbeat socket: " << std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1)
    MOE_BAD_INPUT("fault.listen = \"" << address << "\": expected \"auto\" or an IPv4 address such as 127.0.0.1");
  if (::bind(listener->sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    MOE_BAD_INPUT("fault.listen = \"" << address << "\": cannot bind the heartbeat listener there ("
                                      << std::strerror(errno) << ")");
  socklen_t len = sizeof addr;
  ::getsockname(listener->sock, reinterpret_cast<sockaddr*>(&addr), &len);
  listener->addr = address + ":" + std::to_string(ntohs(addr.sin_port));
}

// What every attempt shares.
struct Launch {
  Launch(const LaunchOptions& o, const Config& c, std::string dir)
      : options(o), config(c), run_dir(std::move(dir)), events(fs::path(run_dir) / "events.log", !o.quiet) {}
  const LaunchOptions& options;
  const Config& config;
  std::string run_dir, self, secret = random_secret(), lock_token;
  int lock_fd = -1;  // handed to mpirun (launch/run/run_lock.h)
  Listener listener;
  Events events;
  ProbeSpec probe;            // of the hostfile's hosts before every start
  bool remote_hosts = false;  // the hostfile names hosts other than this machine
  std::string hostfile;       // --hostfile, or RUN_DIR/hostfile.slurm inside a Slurm allocation
  std::string rank_host = host_name();
};

// The state of one attempt, from its heartbeats.
struct Attempt {
  int64_t attempt = 0, np = 0;
  double started = 0;
  std::map<int64_t, RankState> ranks;
  std::map<std::string, int64_t> ignored;
  bool training_seen = false;
  int64_t max_step = 0;
};

// mpirun and the options given to moe launch for it.
std::vector<std::string> mpirun_prefix(const LaunchOptions& o) {
  std::vector<std::string> args = {o.mpirun};
  args.insert(args.end(), o.mpirun_args.begin(), o.mpirun_args.end());
  if (::geteuid() == 0 && std::find(args.begin(), args.end(), "--allow-run-as-root") == args.end())
    args.push_back("--allow-run-as-root");
  return args;
}

// On this machine alone (no hostfile) with more ranks than cores it lets this process use, mpirun refuses to start
// (its slots are the cores) and ranks bound to cores would busy-poll each other: unless the user's mpirun arguments
// say how to place or oversubscribe, the ranks oversubscribe, bind to nothing, and yield when idle (docs/fault.md).
std::vector<std::string> oversubscription_args(const LaunchOptions& o, int64_t np, const std::string& hostfile) {
  if (!hostfile.empty() || np <= cpu::usable_cores()) return {};
  for (const std::string& a : o.mpirun_args) {
    if (a == "-H" || a.rfind("--host", 0) == 0) return {};  // --host, --hostfile: the user names the slots
    for (const char* placement : {"oversubscribe", "bind-to", "map-by", "mpi_yield_when_idle"})
      if (a.find(placement) != std::string::npos) return {};
  }
  return oversubscription_mpirun_args();
}

// The job's hosts not among those `heard` from.
std::vector<std::string> unheard_hosts(const HostPool& pool, const std::set<std::string>& heard) {
  std::vector<std::string> unheard;
  for (const HostSlots& h : pool.active)
    if (!heard.count(h.name)) unheard.push_back(h.name);
  return unheard;
}

// mpirun with an argument vector (no shell ever sees a config value), in a process group of its own.
pid_t spawn_job(Launch& l, int64_t attempt, int64_t np, const std::string& hostfile) {
  const LaunchOptions& o = l.options;
  std::vector<std::string> args = mpirun_prefix(o);
  const std::vector<std::string> oversubscribe = oversubscription_args(o, np, hostfile);
  args.insert(args.end(), oversubscribe.begin(), oversubscribe.end());
  args.insert(args.end(), {"-np", std::to_string(np)});
  // Ranks on other hosts get only what mpirun passes (ssh gives their daemons a login's environment).
  if (!hostfile.empty()) {
    args.insert(args.end(), {"--hostfile", hostfile});
    for (const char* name :
         {"MOE_HEARTBEAT_ADDR", "MOE_HEARTBEAT_SECRET", "MOE_LAUNCH_ATTEMPT", RunLock::kTokenVariable})
      args.insert(args.end(), {"-x", name});
  }
  args.insert(args.end(), {l.self, "train", "--config", o.config_path, "--run-dir", l.run_dir});
  for (const std::string& s : o.overrides) args.insert(args.end(), {"--set", s});
  if (np != o.np) args.insert(args.end(), {"--set", "parallel.dp=auto"});
  // Restarts resume from the newest checkpoint that verifies (the ranks decide: with node-local roots only
  // they can see every host's disk); with none, --overwrite lets them start again from step 0.
  args.insert(args.end(), {"--resume", attempt == 0 ? o.resume : "auto"});
  if (attempt > 0 || o.overwrite) args.push_back("--overwrite");
  for (const std::string& key : o.allow_config_change) args.insert(args.end(), {"--allow-config-change", key});
  if (o.allow_data_change) args.push_back("--allow-data-change");
  if (o.quiet) args.push_back("--quiet");
  std::vector<std::string> env_text;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "MOE_HEARTBEAT_", 14) != 0 && std::strncmp(*e, "MOE_RUN_LOCK_TOKEN=", 19) != 0)
      env_text.emplace_back(*e);
  env_text.push_back("MOE_HEARTBEAT_ADDR=" + l.listener.addr);
  env_text.push_back("MOE_HEARTBEAT_SECRET=" + l.secret);
  env_text.push_back("MOE_LAUNCH_ATTEMPT=" + std::to_string(attempt));
  env_text.push_back(std::string(RunLock::kTokenVariable) + "=" + l.lock_token);  // the ranks run under our lock
  // mpirun dies with us (SIGTERM: it ends its ranks, here and on other hosts) and holds our lock's
  // descriptor, so the run directory stays locked until the job is gone even if we are killed.
  try {
    return spawn_tied(args, env_text, {.death_signal = SIGTERM, .keep_fd = l.lock_fd, .output_fd = -1});
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::BadInput) throw;
    MOE_BAD_INPUT(e.message() << " (is OpenMPI installed?)");
  }
}

// Reads every datagram waiting on the listener.
void drain_heartbeats(Launch& l, Attempt& a, JobProcesses& job) {
  const double t = now_s();
  for (;;) {
    char buf[2048];
    // MSG_TRUNC: the datagram's real length, even when it is longer than the buffer.
    const ssize_t n = ::recv(l.listener.sock, buf, sizeof buf, MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0) break;
    std::string why;
    const auto beat = size_t(n) > kMaxHeartbeatBytes
                          ? (why = "oversized", std::optional<Heartbeat>())
                          : decode_heartbeat(std::string_view(buf, size_t(n)), l.secret, &why);
    if (!beat || beat->rank >= a.np || beat->attempt != a.attempt) {
      if (beat) why = beat->attempt != a.attempt ? "stale (an ended job's)" : "rank out of range";
      // Stale beats of the job just ended are expected; only the suspicious ones are logged one by one.
      if (++a.ignored[why] <= kMaxDetailedIgnored && why.rfind("stale", 0) != 0)
        l.events.add({{"event", "ignored_heartbeat"}, {"reason", why}, {"bytes", n}, {"attempt", a.attempt}});
      continue;
    }
    l.events.open();  // the job has started: from now on events are written as they come
    RankState& r = a.ranks[beat->rank];
    if (r.last_seen == 0 || r.step != beat->step || r.phase != beat->phase) r.progress_since = t;
    r.last_seen = t, r.step = beat->step, r.phase = beat->phase, r.host = beat->host, r.pid = beat->pid;
    r.flight = beat->flight;
    if (beat->host == l.rank_host) job.note_rank(beat->pid);
    a.max_step = std::max(a.max_step, beat->step);
    if (!a.training_seen && beat->phase == Phase::Step) {
      a.training_seen = true;
      l.events.add(
          {{"event", "training"}, {"attempt", a.attempt}, {"step", beat->step}, {"time_to_train_s", t - a.started}});
    }
  }
}

// mpirun has ended with `code`: success only when a rank reported the last step; else the crash.
json judge_exit(const Launch& l, Attempt& a, int code) {
  const int64_t last = l.config.train.steps;
  if (code == 0 && a.max_step >= last) return {{"event", "finished"}, {"attempt", a.attempt}};
  json failure = {{"event", "crash"}, {"exit_code", code}, {"attempt", a.attempt}};
  if (code == 0)
    failure["reason"] =
        "mpirun exited 0 but no rank reported finishing the last step (train.steps = " + std::to_string(last) +
        "); the most steps done reported: " + std::to_string(a.max_step) + " by " + std::to_string(a.ranks.size()) +
        " rank(s) heard";
  // The rank that fell silent first is the one that failed.
  int64_t rank = -1;
  for (const auto& [k, r] : a.ranks)
    if (r.phase != Phase::Done && (rank < 0 || r.last_seen < a.ranks[rank].last_seen)) rank = k;
  if (rank >= 0) {
    const RankState& r = a.ranks[rank];
    failure.update({{"rank", rank},
                    {"host", r.host},
                    {"phase", phase_name(r.phase)},
                    {"step", r.step},
                    {"detect_s", now_s() - r.last_seen}});
  }
  return failure;
}

// A hang: a rank silent, or making no progress, past its limit; or ranks that never reported.
json find_hang(const FaultConfig& fault, const Attempt& a) {
  const double t = now_s();
  for (const auto& [k, r] : a.ranks) {
    const double silent = t - r.last_seen, stuck = t - r.progress_since;
    const double limit = phase_timeout(fault, r.phase) + fault.heartbeat_timeout_s;
    if (r.phase == Phase::Done) continue;
    if (silent > fault.heartbeat_timeout_s || stuck > limit)
      return {{"event", "hang"},
              {"reason", silent > fault.heartbeat_timeout_s ? "silent" : "no progress"},
              {"rank", k},
              {"host", r.host},
              {"phase", phase_name(r.phase)},
              {"step", r.step},
              {"detect_s", silent > fault.heartbeat_timeout_s ? silent : stuck},
              {"attempt", a.attempt}};
  }
  if (int64_t(a.ranks.size()) < a.np && t - a.started > fault.setup_timeout_s)
    return {{"event", "hang"},
            {"reason", "ranks never reported"},
            {"heard", a.ranks.size()},
            {"np", a.np},
            {"detect_s", t - a.started - fault.setup_timeout_s},
            {"attempt", a.attempt}};
  return {};
}

// Watches one attempt until it finishes, fails, or a signal arrives: the outcome as an event.
json watch(Launch& l, Attempt& a, JobProcesses& job) {
  for (;;) {
    pollfd pfd{l.listener.sock, POLLIN, 0};
    ::poll(&pfd, 1, 100);
    drain_heartbeats(l, a, job);
    if (const auto code = job.poll_mpirun()) {
      drain_heartbeats(l, a, job);  // the last beats may have come between the drain and mpirun's end
      json outcome = judge_exit(l, a, *code);
      if (*code == kExitBadInput && !a.training_seen && a.attempt == 0) outcome["event"] = "refused";
      return outcome;
    }
    if (g_signals) return {{"event", "interrupted"}, {"attempt", a.attempt}};
    json hang = find_hang(l.config.fault, a);
    if (!hang.empty()) return hang;
  }
}

std::string signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : std::to_string(sig); }

// A signal to the supervisor: SIGUSR1 (a clean stop) to the ranks, up to --term-grace-s for them to stop (a second
// signal cuts it short), then everything still there is killed. Returns the exit code, 128 + the first signal.
int stop_on_signal(Launch& l, JobProcesses* job, const json& where) {
  const int sig = int(g_first_signal);
  json event = {{"event", "interrupted"}, {"signal", signal_name(sig)}, {"term_grace_s", l.options.term_grace_s}};
  event.update(where);
  if (job) {
    const double since = now_s();
    int64_t termed = 0;
    bool stopped = false;
    while (g_signals < 2 && now_s() - since < l.options.term_grace_s) {
      termed += job->forward_stop();  // again and again: ranks still starting appear meanwhile
      if ((stopped = job->all_gone())) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const auto end = job->end_all(g_signals < 2 ? 3.0 : 0.0, 10.0, [] { return g_signals >= 2; });
    event.update({{"ranks_sent_stop", termed},
                  {"stopped_within_grace", stopped},
                  {"waited_s", now_s() - since},
                  {"second_signal", g_signals >= 2},
                  {"killed", end.killed},
                  {"processes_left", end.left}});
  }
  event["exit_code"] = 128 + sig;
  l.events.open();
  l.events.add(event);
  std::fprintf(stderr, "moe launch: stopped by %s; %s; no restart (exit code %d)\n", signal_name(sig).c_str(),
               event.value("processes_left", int64_t(0)) == 0 ? "no process of the job is left"
                                                              : "some processes of the job could not be ended",
               128 + sig);
  return 128 + sig;
}

}  // namespace

namespace {

// The backoff before a restart, cut short by a signal; true (the restart goes ahead).
bool sleep_backoff(double backoff) {
  for (const double until = now_s() + backoff; now_s() < until && !g_signals;)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return true;
}

// Between attempts: counts the restart, gives up past fault.max_restarts (false), shrinks the job when a
// host failed twice, logs what the restart resumes from and sleeps the backoff (cut short by a signal).
bool prepare_restart(Launch& l, const json& failure, int64_t* restarts, int64_t* np, std::string* hostfile,
                     std::vector<HostSlots>* hosts, std::map<std::string, int64_t>* failures_by_host) {
  const FaultConfig& fault = l.config.fault;
  if (failure.contains("host")) ++(*failures_by_host)[failure["host"].get<std::string>()];
  if (++*restarts > fault.max_restarts) {
    l.events.add({{"event", "gave_up"}, {"restarts", *restarts - 1}, {"max_restarts", fault.max_restarts}});
    std::fprintf(stderr,
                 "moe launch: giving up after %lld restarts (fault.max_restarts = %lld); the newest committed "
                 "checkpoint is kept under %s\n",
                 static_cast<long long>(*restarts - 1), static_cast<long long>(fault.max_restarts),
                 (fs::path(l.run_dir) / l.config.checkpoint.dir).c_str());
    return false;
  }
  // Shrink: a host that failed twice is left out, when the config still fits the smaller world.
  if (fault.shrink && !hosts->empty() && failure.contains("host")) {
    const std::string bad = failure["host"];
    std::string why;
    if (auto plan = plan_shrink(*hosts, bad, (*failures_by_host)[bad], *np, l.config, &why)) {
      *hosts = plan->hosts;
      *hostfile = (fs::path(l.run_dir) / "hostfile.shrunk").string();
      std::ofstream out(*hostfile, std::ios::trunc);
      for (const HostSlots& h : *hosts) out << h.name << " slots=" << h.slots << "\n";
      l.events.add({{"event", "shrink"}, {"host", bad}, {"np", plan->np}, {"was", *np}, {"hostfile", *hostfile}});
      *np = plan->np;
    } else if ((*failures_by_host)[bad] >= 2) {
      l.events.add({{"event", "cannot_shrink"}, {"host", bad}, {"reason", why}});
    }
  }
  std::vector<std::string> notes;
  const double backoff = std::min(60.0, fault.restart_backoff_s * std::pow(2.0, double(*restarts - 1)));
  json restart = {{"event", "restart"}, {"restart", *restarts}, {"of", fault.max_restarts}, {"backoff_s", backoff}};
  if (l.config.checkpoint.node_local && l.remote_hosts) {
    // The hosts' own disks cannot be seen from here: the ranks choose (the first training event has the step).
    restart.update(
        {{"resume_from", nullptr},
         {"resume_step", nullptr},
         {"steps_lost", nullptr},
         {"resume_note", "checkpoint.node_local on other hosts: the ranks choose from what their disks hold"}});
    l.events.add(restart);
    return sleep_backoff(backoff);
  }
  // What the restart will most likely resume from, for the log (with node-local roots: host 0's view).
  std::string ckpt_dir = l.config.checkpoint.dir;
  for (size_t at; (at = ckpt_dir.find("{node}")) != std::string::npos;) ckpt_dir.replace(at, 6, "0");
  const auto newest = ckpt::find_newest((fs::path(l.run_dir) / ckpt_dir).string(), l.config.checkpoint.replicas, &notes,
                                        nullptr, recorded_run_id(l.run_dir));
  const int64_t resume_step = newest ? newest->chain.back().step : 0;
  restart.update({{"resume_from", newest ? json(newest->dir) : json(nullptr)},
                  {"resume_step", resume_step},
                  {"steps_lost", std::max<int64_t>(0, failure.value("max_step", int64_t(0)) - resume_step)},
                  {"checkpoint_notes", notes}});
  l.events.add(restart);
  return sleep_backoff(backoff);
}

// With --hostfile, before every start: the hosts probed, the lost ones left out and replaced
// (launch/supervise/host_check.h), and a new hostfile when the job's hosts changed. False when a lost host cannot be
// replaced (the job gives up).
// With `daemons`, each host also starts a process through mpirun (ProbeSpec::daemon_check): after a start that failed
// before some host's ranks reported.
bool start_on_healthy_hosts(Launch& l, HostPool* pool, int64_t* np, std::string* hostfile, int64_t attempt,
                            bool daemons) {
  ProbeSpec probe = l.probe;
  if (daemons) probe.daemon_check = mpirun_prefix(l.options);
  const PoolCheck check = check_pool(pool, np, probe, l.config, attempt);
  for (const json& e : check.events) l.events.add(e);
  if (!check.give_up.empty()) {
    l.events.open();
    l.events.add({{"event", "gave_up"}, {"reason", check.give_up}});
    std::fprintf(stderr, "moe launch: giving up: %s\n", check.give_up.c_str());
    return false;
  }
  if (!check.changed) return true;
  *hostfile = (fs::path(l.run_dir) / "hostfile.active").string();
  std::ofstream out(*hostfile, std::ios::trunc);
  std::vector<std::string> names;
  for (const HostSlots& h : pool->active) {
    out << h.name << " slots=" << h.slots << "\n";
    names.push_back(h.name);
  }
  l.events.add({{"event", "hosts"}, {"hosts", names}, {"np", *np}, {"hostfile", *hostfile}, {"attempt", attempt}});
  return true;
}

// A hang or crash during training: where the ranks were in their communication (launch/supervise/hang_report.h), added
// to the event as "collectives" and said on the console.
void name_collectives(const Launch& l, const Attempt& a, json* outcome) {
  std::optional<RankGrid> grid;
  try {
    const ParallelConfig& p = l.config.parallel;
    grid.emplace(GridSizes{a.np, p.tp, p.pp, a.np == l.options.np ? p.dp : 0, p.ep, p.expert_tp},
                 l.config.moe.num_experts);
  } catch (const Error&) {
    return;  // the ranks refused this layout themselves
  }
  const double t = now_s();
  std::map<int64_t, RankFlight> ranks;
  for (const auto& [k, r] : a.ranks) ranks[k] = {r.host, r.flight, t - r.last_seen};
  const std::vector<json> findings = hang_findings(*grid, ranks);
  if (findings.empty()) return;
  (*outcome)["collectives"] = findings;
  const std::vector<int64_t> suspects = hang_suspects(findings);
  (*outcome)["suspects"] = suspects;
  const std::string kind = (*outcome)["event"];
  for (const json& f : findings)
    std::fprintf(stderr, "moe launch: %s: %s\n", kind.c_str(), f["summary"].get<std::string>().c_str());
  if (!suspects.empty())
    std::fprintf(stderr, "moe launch: %s: %s in none of the collectives the others wait in\n", kind.c_str(),
                 rank_list_text(suspects).c_str());
}

// Attempts until one finishes (0), the ranks refuse the input (2), restarts run out (3) or a signal (128+).
int supervise(Launch& l, RunLock& lock) {
  const LaunchOptions& o = l.options;
  int64_t np = o.np, restarts = 0;
  std::string hostfile = l.hostfile;
  HostPool pool;  // the job's hosts and the spares
  if (!hostfile.empty()) pool = split_hosts(read_hostfile(hostfile), np);
  std::map<std::string, int64_t> failures_by_host;
  bool check_daemons = false;  // the last attempt failed before some host's ranks reported
  for (int64_t attempt = 0;; ++attempt) {
    if (g_signals) return stop_on_signal(l, nullptr, {{"attempt", attempt}, {"while", "between attempts"}});
    if (!pool.active.empty() && !start_on_healthy_hosts(l, &pool, &np, &hostfile, attempt, check_daemons))
      return kExitGaveUp;
    Attempt a;
    a.attempt = attempt, a.np = np;
    const pid_t mpirun = spawn_job(l, attempt, np, hostfile);
    JobProcesses job(mpirun, l.secret, l.self);
    a.started = now_s();
    l.events.add({{"event", "start"},
                  {"attempt", attempt},
                  {"np", np},
                  {"oversubscribed", !oversubscription_args(o, np, hostfile).empty()},
                  {"pid", mpirun},
                  {"listen", l.listener.addr},
                  {"hostfile", hostfile.empty() ? json(nullptr) : json(hostfile)}});
    json outcome = watch(l, a, job);
    const std::string kind = outcome["event"];
    if (kind == "hang" || kind == "crash") name_collectives(l, a, &outcome);  // before the ranks are ended
    if (kind == "interrupted")
      return stop_on_signal(l, &job, {{"attempt", attempt}, {"while", a.training_seen ? "training" : "start-up"}});
    // Whatever the outcome, nothing of the job outlives it: the ranks are killed at once (a rank left
    // running would go on committing checkpoints after the failure was declared), mpirun after 3 s.
    const auto end = job.end_all(3.0, 10.0, [] { return g_signals >= 2; });
    if (kind == "refused") {
      lock.release(true);  // the ranks said why, and wrote nothing; restarting would say it again
      return kExitBadInput;
    }
    l.events.open();
    std::set<std::string> hosts_heard;
    for (const auto& [rank, r] : a.ranks) hosts_heard.insert(r.host);
    outcome["hosts_heard"] = hosts_heard;
    if (kind == "finished") {
      outcome.update({{"restarts", restarts}, {"step", a.max_step}, {"processes_left", end.left}});
      l.events.add(outcome);
    } else {
      outcome.update({{"killed_stragglers", end.killed}, {"processes_left", end.left}});
      const std::vector<std::string> unheard = unheard_hosts(pool, hosts_heard);
      check_daemons = !unheard.empty();
      if (check_daemons) outcome["hosts_unheard"] = unheard;
      l.events.add(outcome);
    }
    for (const auto& [reason, count] : a.ignored)
      l.events.add({{"event", "ignored_heartbeats_total"}, {"reason", reason}, {"count", count}, {"attempt", attempt}});
    if (kind == "finished") return 0;
    if (g_signals) return stop_on_signal(l, nullptr, {{"attempt", attempt}, {"while", "ending a failed attempt"}});
    outcome["max_step"] = a.max_step;
    if (!prepare_restart(l, outcome, &restarts, &np, &hostfile, &pool.active, &failures_by_host)) return kExitGaveUp;
  }
}

// Probing a host: mpirun's remote shell, this program, and room where the run writes (checkpoint.dir when it is an
// absolute path, as a node-local disk is, else the run directory).
ProbeSpec probe_spec(const LaunchOptions& o, const Config& config, const std::string& run_dir,
                     const std::string& self) {
  constexpr int64_t kMinFreeBytes = int64_t(64) << 20;
  const std::string ckpt = config.checkpoint.dir.substr(0, config.checkpoint.dir.find("{node}"));
  const fs::path disk = fs::path(ckpt).is_absolute() ? fs::path(ckpt) : fs::absolute(run_dir);
  const double timeout = config.fault.probe_timeout_s;
  return {
      rsh_agent_command(o.mpirun_args, timeout), self, disk.string(), kMinFreeBytes, timeout, config.fault.probe_peers};
}

std::map<std::string, std::string> environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return env;
}

std::string write_hostfile(const fs::path& path, const std::vector<HostSlots>& hosts) {
  std::ofstream out(path, std::ios::trunc);
  for (const HostSlots& h : hosts) out << h.name << " slots=" << h.slots << "\n";
  if (!out) MOE_FAIL("cannot write " << path.string());
  return path.string();
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

// Inside a Slurm allocation OpenMPI starts its daemons with srun, one job step per attempt. A step that spanned a
// lost host stays "completing" until Slurm declares that host down (SlurmdTimeout, minutes), and holds its
// resources meanwhile, so the restart's srun would wait for it: the steps are allowed to overlap (srun --overlap,
// passed by OpenMPI's plm_slurm_args, kept if the user set it).
void allow_overlapping_steps() {
  const char* args = std::getenv("OMPI_MCA_plm_slurm_args");
  std::string value = args ? args : "";
  if (value.find("--overlap") != std::string::npos) return;
  value += std::string(value.empty() ? "" : " ") + "--overlap";
  ::setenv("OMPI_MCA_plm_slurm_args", value.c_str(), 1);
}

}  // namespace

int run_launch(const LaunchOptions& o) {
  // Everything checkable is checked before anything starts or is written.
  check_utf8(o.config_path, "--config");
  check_utf8(o.run_dir, "--run-dir");
  Config config = load_config(o.config_path, o.overrides);
  if (o.np < 1) MOE_BAD_INPUT("--np: expected a whole number of ranks >= 1, got " << o.np);
  if (!(o.term_grace_s >= 0) || !std::isfinite(o.term_grace_s))
    MOE_BAD_INPUT("--term-grace-s: expected seconds >= 0, got " << o.term_grace_s);
  std::vector<HostSlots> hosts;
  if (!o.hostfile.empty()) hosts = read_hostfile(o.hostfile);
  // Inside a Slurm allocation without --hostfile: the allocation's hosts (launch/supervise/slurm_hosts.h).
  const auto slurm = o.hostfile.empty() ? slurm_hosts(environment()) : std::nullopt;
  if (slurm) hosts = *slurm;
  std::vector<std::string> host_names;
  for (const HostSlots& h : hosts) host_names.push_back(h.name);
  check_launch_layout(config, o.np);
  const std::string listen =
      choose_listen_address(config.fault.listen, host_names, slurm ? "(Slurm's SLURM_JOB_NODELIST)" : o.hostfile);
  const std::string run_dir = o.run_dir.empty() ? "runs/" + fs::path(o.config_path).stem().string() : o.run_dir;
  Launch l(o, config, run_dir);
  open_listener(listen, &l.listener);
  char self[4096] = {};
  if (::readlink("/proc/self/exe", self, sizeof self - 1) <= 0) MOE_FAIL("cannot find this program's path");
  l.self = self;
  l.probe = probe_spec(o, config, run_dir, l.self);
  l.remote_hosts =
      std::any_of(host_names.begin(), host_names.end(), [](const std::string& h) { return !host_is_local(h); });

  ::signal(SIGINT, on_signal);
  ::signal(SIGTERM, on_signal);
  JobProcesses::become_subreaper();  // ranks orphaned by mpirun stay ours to find and end
  // The lock comes last, just before the first write: a launch refused above leaves nothing behind.
  RunLock lock = RunLock::acquire(run_dir, o.command_line.empty() ? "" : joined(o.command_line));
  l.lock_token = lock.token();
  l.hostfile = o.hostfile;
  if (slurm) {
    l.hostfile = write_hostfile(fs::path(run_dir) / "hostfile.slurm", *slurm);
    allow_overlapping_steps();
  }
  l.lock_fd = lock.descriptor();
  try {
    return supervise(l, lock);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::BadInput) lock.release(true);  // e.g. no mpirun to start: nothing written
    throw;
  }
}

}  // namespace moe
