// The supervisor loop of `moe launch`.
#include "launch/supervisor.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
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
#include <sstream>
#include <thread>

#include "checkpoint/checkpointer.h"
#include "core/error.h"
#include "core/host.h"
#include "launch/config.h"
#include "launch/heartbeat.h"
#include "parallel/rank_grid.h"

extern char** environ;

namespace moe {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int kExitGaveUp = 3;
constexpr int kExitBadInput = 2;
constexpr int kMaxDetailedIgnored = 5;  // per reason and attempt; then only counted

volatile sig_atomic_t g_interrupted = 0;
void on_interrupt(int) { g_interrupted = 1; }

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
};

}  // namespace

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
    RankGrid({plan.np, config.parallel.tp, config.parallel.pp, 0, config.parallel.ep, 1}, config.moe.num_experts);
    const int64_t dp = plan.np / (config.parallel.tp * config.parallel.pp);
    if (config.train.global_batch % (dp * config.train.micro_batch) != 0)
      MOE_BAD_INPUT("train.global_batch = " << config.train.global_batch << " does not split over dp = " << dp
                                            << " ranks of train.micro_batch = " << config.train.micro_batch);
  } catch (const Error& e) {
    *why = e.message();
    return std::nullopt;
  }
  for (const HostSlots& h : hosts)
    if (h.name != failed_host) plan.hosts.push_back(h);
  return plan;
}

namespace {

bool alive(pid_t pid) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] != 'Z';
}

}  // namespace

int run_launch(const LaunchOptions& o) {
  // Everything checkable is checked before anything starts or is written.
  Config config = load_config(o.config_path, o.overrides);
  if (o.np < 1) MOE_BAD_INPUT("--np " << o.np << ": expected at least 1 rank");
  std::vector<HostSlots> hosts;
  if (!o.hostfile.empty()) hosts = read_hostfile(o.hostfile);
  RankGrid({o.np, config.parallel.tp, config.parallel.pp, config.parallel.dp, config.parallel.ep, 1},
           config.moe.num_experts);
  const std::string run_dir = o.run_dir.empty() ? "runs/" + fs::path(o.config_path).stem().string() : o.run_dir;
  const FaultConfig& fault = config.fault;

  // The listener: loopback (or fault.listen), an ephemeral port, the job's secret.
  const int sock = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (sock < 0) MOE_FAIL("cannot open the heartbeat socket: " << std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (inet_pton(AF_INET, fault.listen.c_str(), &addr.sin_addr) != 1)
    MOE_BAD_INPUT("fault.listen = \"" << fault.listen << "\": expected an IPv4 address such as 127.0.0.1");
  if (::bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    MOE_BAD_INPUT("fault.listen = \"" << fault.listen << "\": cannot bind the heartbeat listener there ("
                                      << std::strerror(errno) << ")");
  socklen_t len = sizeof addr;
  ::getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string listen_addr = fault.listen + ":" + std::to_string(ntohs(addr.sin_port));
  const std::string secret = random_secret();  // handed to the ranks in their environment, never logged

  char self[4096] = {};
  if (::readlink("/proc/self/exe", self, sizeof self - 1) <= 0) MOE_FAIL("cannot find this program's path");
  Events events(fs::path(run_dir) / "events.log", !o.quiet);
  ::signal(SIGINT, on_interrupt);
  ::signal(SIGTERM, on_interrupt);

  int64_t np = o.np;
  std::string hostfile = o.hostfile;
  std::map<std::string, int64_t> failures_by_host;
  int64_t restarts = 0;
  for (int64_t attempt = 0;; ++attempt) {
    // argv for mpirun: no shell ever sees a config value.
    std::vector<std::string> args = {o.mpirun, "-np", std::to_string(np)};
    if (!hostfile.empty()) args.insert(args.end(), {"--hostfile", hostfile});
    args.insert(args.end(), o.mpirun_args.begin(), o.mpirun_args.end());
    if (::geteuid() == 0 && std::find(args.begin(), args.end(), "--allow-run-as-root") == args.end())
      args.push_back("--allow-run-as-root");
    args.insert(args.end(), {self, "train", "--config", o.config_path, "--run-dir", run_dir});
    for (const std::string& s : o.overrides) args.insert(args.end(), {"--set", s});
    if (np != o.np) args.insert(args.end(), {"--set", "parallel.dp=auto"});
    // Restarts resume from the newest checkpoint that verifies (the ranks decide: with node-local roots only
    // they can see every host's disk); with none, --overwrite lets them start again from step 0.
    args.insert(args.end(), {"--resume", attempt == 0 ? o.resume : "auto"});
    if (attempt > 0 || o.overwrite) args.push_back("--overwrite");
    if (o.quiet) args.push_back("--quiet");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_text;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "MOE_HEARTBEAT_", 14) != 0) env_text.emplace_back(*e);
    env_text.push_back("MOE_HEARTBEAT_ADDR=" + listen_addr);
    env_text.push_back("MOE_HEARTBEAT_SECRET=" + secret);
    env_text.push_back("MOE_LAUNCH_ATTEMPT=" + std::to_string(attempt));
    std::vector<char*> envp;
    for (std::string& e : env_text) envp.push_back(e.data());
    envp.push_back(nullptr);

    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);  // its own process group: ending the job is one kill()
    pid_t child = 0;
    const int rc = posix_spawnp(&child, args[0].c_str(), nullptr, &attr, argv.data(), envp.data());
    posix_spawnattr_destroy(&attr);
    if (rc != 0) MOE_BAD_INPUT("cannot start " << args[0] << ": " << std::strerror(rc) << " (is OpenMPI installed?)");
    const double started = now_s();
    events.add({{"event", "start"},
                {"attempt", attempt},
                {"np", np},
                {"pid", child},
                {"listen", listen_addr},
                {"hostfile", hostfile.empty() ? json(nullptr) : json(hostfile)}});

    std::map<int64_t, RankState> ranks;
    std::map<std::string, int64_t> ignored;
    bool training_seen = false;
    int64_t max_step = 0;
    json failure;  // empty while all is well
    int status = 0;
    for (;;) {
      pollfd pfd{sock, POLLIN, 0};
      ::poll(&pfd, 1, 100);
      const double t = now_s();
      while (pfd.revents & POLLIN) {
        char buf[2048];
        // MSG_TRUNC: the datagram's real length, even when it is longer than the buffer.
        const ssize_t n = ::recv(sock, buf, sizeof buf, MSG_DONTWAIT | MSG_TRUNC);
        if (n < 0) break;
        std::string why;
        const auto beat = size_t(n) > kMaxHeartbeatBytes
                              ? (why = "oversized", std::optional<Heartbeat>())
                              : decode_heartbeat(std::string_view(buf, size_t(n)), secret, &why);
        if (!beat || beat->rank >= np || beat->attempt != attempt) {
          if (beat) why = beat->attempt != attempt ? "stale (an ended job's)" : "rank out of range";
          // Stale beats of the job just ended are expected; only the suspicious ones are logged one by one.
          if (++ignored[why] <= kMaxDetailedIgnored && why.rfind("stale", 0) != 0)
            events.add({{"event", "ignored_heartbeat"}, {"reason", why}, {"bytes", n}, {"attempt", attempt}});
          continue;
        }
        events.open();  // the job has started: from now on events are written as they come
        RankState& r = ranks[beat->rank];
        if (r.last_seen == 0 || r.step != beat->step || r.phase != beat->phase) r.progress_since = t;
        r.last_seen = t, r.step = beat->step, r.phase = beat->phase, r.host = beat->host, r.pid = beat->pid;
        max_step = std::max(max_step, beat->step);
        if (!training_seen && beat->phase == Phase::Step) {
          training_seen = true;
          events.add(
              {{"event", "training"}, {"attempt", attempt}, {"step", beat->step}, {"time_to_train_s", t - started}});
        }
      }
      // A crash: mpirun ended.
      const pid_t done = ::waitpid(child, &status, WNOHANG);
      if (done == child) {
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (code == 0) {
          events.open();
          events.add({{"event", "finished"}, {"attempt", attempt}, {"restarts", restarts}});
          for (const auto& [reason, count] : ignored)
            events.add({{"event", "ignored_heartbeats_total"}, {"reason", reason}, {"count", count}});
          ::close(sock);
          return 0;
        }
        if (code == kExitBadInput && !training_seen && attempt == 0) {
          ::close(sock);
          return kExitBadInput;  // the ranks said why; restarting would say it again
        }
        // The rank that fell silent first is the one that failed.
        int64_t rank = -1;
        for (const auto& [k, r] : ranks)
          if (r.phase != Phase::Done && (rank < 0 || r.last_seen < ranks[rank].last_seen)) rank = k;
        failure = {{"event", "crash"}, {"exit_code", code}, {"attempt", attempt}};
        if (rank >= 0) {
          const RankState& r = ranks[rank];
          failure.update({{"rank", rank},
                          {"host", r.host},
                          {"phase", phase_name(r.phase)},
                          {"step", r.step},
                          {"detect_s", t - r.last_seen}});
        }
        child = 0;
        break;
      }
      // A hang: a rank silent, or making no progress, past its limit.
      for (const auto& [k, r] : ranks) {
        const double silent = t - r.last_seen, stuck = t - r.progress_since;
        const double limit = phase_timeout(fault, r.phase) + fault.heartbeat_timeout_s;
        if (r.phase == Phase::Done) continue;
        if (silent > fault.heartbeat_timeout_s || stuck > limit) {
          failure = {{"event", "hang"},
                     {"reason", silent > fault.heartbeat_timeout_s ? "silent" : "no progress"},
                     {"rank", k},
                     {"host", r.host},
                     {"phase", phase_name(r.phase)},
                     {"step", r.step},
                     {"detect_s", silent > fault.heartbeat_timeout_s ? silent : stuck},
                     {"attempt", attempt}};
          break;
        }
      }
      if (failure.empty() && int64_t(ranks.size()) < np && t - started > fault.setup_timeout_s)
        failure = {{"event", "hang"},
                   {"reason", "ranks never reported"},
                   {"heard", ranks.size()},
                   {"np", np},
                   {"detect_s", t - started - fault.setup_timeout_s},
                   {"attempt", attempt}};
      if (g_interrupted) failure = {{"event", "interrupted"}, {"attempt", attempt}};
      if (!failure.empty()) break;
    }

    // End the whole job. The ranks first, at once: OpenMPI gives each rank a process group of its own, and
    // a rank left running (or woken up) would go on training and committing checkpoints after the failure
    // was declared. SIGKILL also ends a stopped process. Then mpirun's group.
    int64_t leftover = 0;
    for (const auto& [k, r] : ranks)
      if (alive(pid_t(r.pid))) {
        const pid_t group = ::getpgid(pid_t(r.pid));
        ::kill(pid_t(r.pid), SIGKILL), ++leftover;
        if (group > 1 && group != ::getpgrp()) ::kill(-group, SIGKILL);
      }
    if (child > 0) {
      ::kill(-child, SIGTERM);
      for (int i = 0; i < 30 && ::waitpid(child, &status, WNOHANG) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ::kill(-child, SIGKILL);
      ::waitpid(child, &status, 0);
    }
    int64_t still = 0;
    for (int i = 0; i < 20; ++i) {  // up to 2 s for the kernel to take them
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      still = 0;
      for (const auto& [k, r] : ranks) still += alive(pid_t(r.pid));
      if (still == 0) break;
    }
    failure["killed_stragglers"] = leftover;
    failure["processes_left"] = still;
    events.open();
    events.add(failure);
    for (const auto& [reason, count] : ignored)
      events.add({{"event", "ignored_heartbeats_total"}, {"reason", reason}, {"count", count}, {"attempt", attempt}});
    if (failure["event"] == "interrupted") {
      ::close(sock);
      return 1;
    }

    if (failure.contains("host")) ++failures_by_host[failure["host"].get<std::string>()];
    if (++restarts > fault.max_restarts) {
      events.add({{"event", "gave_up"}, {"restarts", restarts - 1}, {"max_restarts", fault.max_restarts}});
      std::fprintf(stderr,
                   "moe launch: giving up after %lld restarts (fault.max_restarts = %lld); the newest committed "
                   "checkpoint is kept under %s\n",
                   static_cast<long long>(restarts - 1), static_cast<long long>(fault.max_restarts),
                   (fs::path(run_dir) / config.checkpoint.dir).c_str());
      ::close(sock);
      return kExitGaveUp;
    }

    // Shrink: a host that failed twice is left out, when the config still fits the smaller world.
    if (fault.shrink && !hosts.empty() && failure.contains("host")) {
      const std::string bad = failure["host"];
      std::string why;
      if (auto plan = plan_shrink(hosts, bad, failures_by_host[bad], np, config, &why)) {
        hosts = plan->hosts;
        hostfile = (fs::path(run_dir) / "hostfile.shrunk").string();
        std::ofstream out(hostfile, std::ios::trunc);
        for (const HostSlots& h : hosts) out << h.name << " slots=" << h.slots << "\n";
        events.add({{"event", "shrink"}, {"host", bad}, {"np", plan->np}, {"was", np}, {"hostfile", hostfile}});
        np = plan->np;
      } else if (failures_by_host[bad] >= 2) {
        events.add({{"event", "cannot_shrink"}, {"host", bad}, {"reason", why}});
      }
    }

    std::vector<std::string> notes;
    // What the restart will most likely resume from, for the log (with node-local roots: host 0's view).
    std::string ckpt_dir = config.checkpoint.dir;
    for (size_t at; (at = ckpt_dir.find("{node}")) != std::string::npos;) ckpt_dir.replace(at, 6, "0");
    const auto newest = ckpt::find_newest((fs::path(run_dir) / ckpt_dir).string(), config.checkpoint.replicas, &notes);
    const int64_t resume_step = newest ? newest->chain.back().step : 0;
    const double backoff = std::min(60.0, fault.restart_backoff_s * std::pow(2.0, double(restarts - 1)));
    events.add({{"event", "restart"},
                {"restart", restarts},
                {"of", fault.max_restarts},
                {"resume_from", newest ? json(newest->dir) : json(nullptr)},
                {"resume_step", resume_step},
                {"steps_lost", std::max<int64_t>(0, max_step - resume_step)},
                {"backoff_s", backoff},
                {"checkpoint_notes", notes}});
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
  }
}

}  // namespace moe
