// What a run must never do, attacked through the real program (build/bin/moe) as a scheduler, a careless
// user or a full disk would: commit non-finite state, share a run directory with another live run,
// resume silently with settings that change what the checkpoint means, end "done" when its last
// checkpoint could not be written, or die without a word on SIGTERM. Wherever training continues, the
// result must equal the uninterrupted run bit for bit.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "tests/launch/run_compare.h"

namespace moe {
namespace {

using namespace moe::test_support;

const std::string kConfig = std::string(MOE_SOURCE_DIR) + "/configs/tiny_moe.json";

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// A small, fast run: 1 thread, short sequences, a metrics line every step.
std::vector<std::string> train_args(const fs::path& run_dir, std::vector<std::string> sets) {
  std::vector<std::string> args = {"train", "--config", kConfig, "--run-dir", run_dir.string(), "--quiet"};
  for (const char* s : {"train.threads=1", "train.seq_len=64", "train.global_batch=8", "train.log_every=1",
                        "train.eval_every=0", "train.eval_sequences=4"})
    args.insert(args.end(), {"--set", s});
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  return args;
}

struct Proc {
  pid_t pid = -1;
  fs::path output;  // stdout and stderr
};

Proc spawn(const std::vector<std::string>& args, const fs::path& output) {
  Proc p{::fork(), output};
  if (p.pid == 0) {
    const int fd = ::open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1), ::dup2(fd, 2);
    std::vector<std::string> all = {MOE_BINARY};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(MOE_BINARY, argv.data());
    ::_exit(127);
  }
  return p;
}

// The exit code (128 + signal when killed); `during` runs every 10 ms while the process lives. A process
// still alive after timeout_s is killed and the check fails.
int wait_exit(const Proc& p, double timeout_s, const std::function<void()>& during = nullptr) {
  const double start = now_s();
  for (;;) {
    int status = 0;
    if (::waitpid(p.pid, &status, WNOHANG) == p.pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (now_s() - start > timeout_s) {
      ::kill(p.pid, SIGKILL);
      ::waitpid(p.pid, &status, 0);
      ADD_FAILURE() << "still running after " << timeout_s << " s; output:\n" << read_text_if_any(p.output);
      return -1;
    }
    if (during) during();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int run(const std::vector<std::string>& args, const fs::path& output, double timeout_s = 120) {
  return wait_exit(spawn(args, output), timeout_s);
}

std::vector<json> metrics(const fs::path& run_dir) {
  std::vector<json> lines;
  std::istringstream in(read_text_if_any(run_dir / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(without_timing(json::parse(line)));
  return lines;
}

int64_t training_lines(const fs::path& run_dir) {
  int64_t n = 0;
  for (const json& j : metrics(run_dir)) n += j.contains("loss");
  return n;
}

void expect_same_metrics(const fs::path& a, const fs::path& b) {
  const std::vector<json> x = metrics(a), y = metrics(b);
  ASSERT_EQ(x.size(), y.size()) << a << " vs " << b;
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(first_difference(x[i], y[i], "line " + std::to_string(i)), "");
}

std::string latest(const fs::path& run_dir) { return read_text_if_any(run_dir / "checkpoints" / "latest"); }

// The uninterrupted run every interrupted one is compared with, made once per (steps, checkpoint.every).
fs::path reference_run(int64_t steps, const std::string& every) {
  static std::map<std::string, std::unique_ptr<TempDir>> made;
  const std::string key = std::to_string(steps) + "/" + every;
  if (!made.count(key)) {
    made[key] = std::make_unique<TempDir>("integrity-reference");
    EXPECT_EQ(run(train_args(made[key]->path() / "run",
                             {"train.steps=" + std::to_string(steps), "checkpoint.every=" + every}),
                  made[key]->path() / "out.txt"),
              0);
  }
  return made[key]->path() / "run";
}

// SIGTERM at several moments (start-up, mid-run, mid-save with a checkpoint every step): exit 143 with a
// word, a committed checkpoint of the step it stopped after, and the resumed run equals the uninterrupted one.
TEST(RunIntegrity, SigtermStopsCleanlyAndTheResumedRunEqualsTheUninterrupted) {
  struct Case {
    const char* name;
    std::string every;
    int64_t after_lines;  // send SIGTERM once this many training lines exist (0: at once)
  };
  for (const Case& c : {Case{"start-up", "4", 0}, Case{"mid-run", "4", 5}, Case{"mid-save", "1", 3}}) {
    SCOPED_TRACE(c.name);
    const fs::path reference = reference_run(12, c.every);
    TempDir dir(std::string("sigterm-") + c.name);
    const fs::path run_dir = dir.path() / "run";
    const std::vector<std::string> args = train_args(run_dir, {"train.steps=12", "checkpoint.every=" + c.every});
    const Proc p = spawn(args, dir.path() / "first.txt");
    bool sent = false;
    const int code = wait_exit(p, 120, [&] {
      if (!sent && training_lines(run_dir) >= c.after_lines) sent = ::kill(p.pid, SIGTERM) == 0;
    });
    EXPECT_EQ(code, 143) << read_text_if_any(dir.path() / "first.txt");
    const std::string said = read_text_if_any(dir.path() / "first.txt");
    const int64_t stopped_after = training_lines(run_dir);
    if (stopped_after > 0) {  // the handler was in place: it said so, and the step it stopped after is saved
      EXPECT_NE(said.find("SIGTERM received: stopping after step " + std::to_string(stopped_after)), std::string::npos)
          << said;
      EXPECT_NE(latest(run_dir).find(std::to_string(stopped_after)), std::string::npos) << latest(run_dir);
      EXPECT_LT(stopped_after, 12);
    }
    std::vector<std::string> again = args;
    again.insert(again.end(), {"--resume", "auto", "--overwrite"});
    EXPECT_EQ(run(again, dir.path() / "second.txt"), 0) << read_text_if_any(dir.path() / "second.txt");
    expect_same_metrics(reference, run_dir);
  }
}

// A second signal ends the process at once, whatever the step is doing.
TEST(RunIntegrity, SecondSignalExitsAtOnce) {
  TempDir dir("second-signal");
  const fs::path run_dir = dir.path() / "run";
  // Long steps (64 sequences of 128 tokens), so the second signal lands inside one.
  const Proc p = spawn(
      train_args(run_dir, {"train.steps=1000", "train.seq_len=128", "train.global_batch=64", "checkpoint.every=0"}),
      dir.path() / "out.txt");
  double first_at = 0, second_at = 0;
  const int code = wait_exit(p, 120, [&] {
    if (first_at == 0 && training_lines(run_dir) >= 1 && ::kill(p.pid, SIGTERM) == 0) first_at = now_s();
    if (first_at > 0 && second_at == 0 && now_s() - first_at > 0.02 && ::kill(p.pid, SIGINT) == 0) second_at = now_s();
  });
  EXPECT_EQ(code, 143);
  EXPECT_NE(read_text_if_any(dir.path() / "out.txt").find("second signal"), std::string::npos)
      << read_text_if_any(dir.path() / "out.txt");
}

// Two trainers, one run directory: the second refuses (exit 2) naming the first's host and pid, and
// the first goes on untouched.
TEST(RunIntegrity, SecondTrainerInALiveRunDirectoryIsRefused) {
  TempDir dir("two-trainers");
  const fs::path run_dir = dir.path() / "run";
  const Proc first = spawn(train_args(run_dir, {"train.steps=100000", "checkpoint.every=0"}), dir.path() / "a.txt");
  int second_code = -1;
  const int first_code = wait_exit(first, 120, [&] {
    if (second_code != -1 || training_lines(run_dir) < 2) return;
    const int64_t before = training_lines(run_dir);
    std::vector<std::string> second = train_args(run_dir, {"train.steps=5"});
    second.insert(second.end(), {"--overwrite", "--resume", "none"});
    second_code = run(second, dir.path() / "b.txt");
    const std::string said = read_text_if_any(dir.path() / "b.txt");
    EXPECT_NE(said.find("in use by process " + std::to_string(first.pid)), std::string::npos) << said;
    EXPECT_GE(training_lines(run_dir), before) << "the second trainer rewrote the first one's metrics";
    ::kill(first.pid, SIGTERM);
  });
  EXPECT_EQ(second_code, 2);
  EXPECT_EQ(first_code, 143) << read_text_if_any(dir.path() / "a.txt");
}

// A learning rate that turns the weights to infinity: the snapshot of the save is found not finite (by the
// writer as it copies it, agreed before the next step's update), so the run stops (exit 1, saying why)
// without committing it, and the newest good checkpoint survives retention and resumes.
TEST(RunIntegrity, NonFiniteStateIsNeverCommitted) {
  TempDir dir("non-finite");
  const fs::path run_dir = dir.path() / "run";
  const std::vector<std::string> good = {"train.steps=8", "checkpoint.every=1", "checkpoint.keep=1"};
  std::vector<std::string> args = train_args(run_dir, good);
  args.insert(args.end(), {"--stop-after-step", "4"});
  ASSERT_EQ(run(args, dir.path() / "first.txt"), 0) << read_text_if_any(dir.path() / "first.txt");
  ASSERT_NE(latest(run_dir).find("step-00000004"), std::string::npos);
  args = train_args(run_dir, good);
  args.insert(args.end(),
              {"--set", "optim.lr=3e38", "--set", "optim.weight_decay=10"});  // lr * decay: infinite in float
  EXPECT_EQ(run(args, dir.path() / "diverged.txt"), 1);
  const std::string said = read_text_if_any(dir.path() / "diverged.txt");
  EXPECT_NE(said.find("not finite"), std::string::npos) << said;
  EXPECT_EQ(said.find("internal error"), std::string::npos) << said;
  EXPECT_NE(latest(run_dir).find("step-00000004"), std::string::npos) << latest(run_dir);
  EXPECT_TRUE(fs::exists(run_dir / "checkpoints" / "step-00000004" / "manifest.json"));
  EXPECT_FALSE(fs::exists(run_dir / "checkpoints" / "step-00000005"));
  EXPECT_EQ(run({"ckpt", "verify", (run_dir / "checkpoints" / "step-00000004").string()}, dir.path() / "v.txt"), 0)
      << read_text_if_any(dir.path() / "v.txt");
  // Resumed with the learning rate it was trained with, it ends as the uninterrupted run.
  EXPECT_EQ(run(train_args(run_dir, good), dir.path() / "resumed.txt"), 0)
      << read_text_if_any(dir.path() / "resumed.txt");
  expect_same_metrics(reference_run(8, "1"), run_dir);
}

// A checkpoint root on a small file system that fills up: the save that does not fit fails, the one
// before stays the newest, and a run whose last checkpoint could not be written ends with exit 1 saying
// so, never "done". Needs permission to mount a tmpfs (skipped otherwise).
TEST(RunIntegrity, FullDiskFailsTheRunInsteadOfEndingDone) {
  TempDir dir("full-disk");
  const fs::path disk = dir.path() / "disk";
  fs::create_directories(disk);
  // One checkpoint of this model (parameters and two moments) is about 32 MB: room for one, not two.
  if (::mount("tmpfs", disk.c_str(), "tmpfs", 0, "size=48m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << ")";
  const fs::path run_dir = dir.path() / "run";
  const std::vector<std::string> args =
      train_args(run_dir, {"train.steps=4", "checkpoint.every=2", "checkpoint.keep=1", "checkpoint.async=false",
                           "checkpoint.dir=" + (disk / "ckpt").string()});
  const int code = run(args, dir.path() / "out.txt");
  const std::string said = read_text_if_any(dir.path() / "out.txt");
  const std::string newest = read_text_if_any(disk / "ckpt" / "latest");
  const int verified = run({"ckpt", "verify", (disk / "ckpt" / "step-00000002").string()}, dir.path() / "v.txt");
  ::umount2(disk.c_str(), MNT_DETACH);
  EXPECT_EQ(code, 1) << said;
  EXPECT_NE(said.find("could not be written"), std::string::npos) << said;
  EXPECT_NE(newest.find("step-00000002"), std::string::npos) << newest;
  EXPECT_EQ(verified, 0) << read_text_if_any(dir.path() / "v.txt");
}

// The run directory's own files on a full disk: a run that cannot write config.json, manifest.json or
// metrics.jsonl stops with exit 1 naming the file and the disk ("moe: stopped"), never an internal error,
// and leaves no temporary file. Needs permission to mount a tmpfs (skipped otherwise).
TEST(RunIntegrity, FullDiskUnderTheRunDirectoryIsNamed) {
  for (const int64_t free_kib : {0, 24}) {
    SCOPED_TRACE(std::to_string(free_kib) + " KiB free");
    TempDir dir("full-run-dir");
    const fs::path disk = dir.path() / "disk";
    fs::create_directories(disk);
    if (::mount("tmpfs", disk.c_str(), "tmpfs", 0, "size=1m") != 0)
      GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << ")";
    {  // fill it, then free `free_kib`: the run's first files fit, its metrics lines soon do not
      std::ofstream filler(disk / "filler", std::ios::binary);
      const std::string block(4096, 'x');
      while (filler.write(block.data(), block.size())) {
      }
    }
    fs::resize_file(disk / "filler", fs::file_size(disk / "filler") - uint64_t(free_kib) * 1024);
    const fs::path run_dir = disk / "run";
    const int code = run(train_args(run_dir, {"train.steps=400", "checkpoint.every=0"}), dir.path() / "out.txt");
    const std::string said = read_text_if_any(dir.path() / "out.txt");
    std::vector<std::string> left;
    for (const auto& e : fs::recursive_directory_iterator(disk))
      if (e.path().extension() == ".tmp") left.push_back(e.path().string());
    ::umount2(disk.c_str(), MNT_DETACH);
    EXPECT_EQ(code, 1) << said;
    EXPECT_NE(said.find("moe: stopped"), std::string::npos) << said;
    EXPECT_EQ(said.find("internal error"), std::string::npos) << said;
    EXPECT_NE(said.find(run_dir.string()), std::string::npos) << said;
    EXPECT_NE(said.find("No space left on device"), std::string::npos) << said;
    EXPECT_TRUE(left.empty()) << left.front();
  }
}

// Resuming with other settings: a key that fixes what the checkpoint means is refused (exit 2, nothing
// written) unless named in --allow-config-change; every start is recorded with what changed.
TEST(RunIntegrity, ConfigChangesOnResumeAreRefusedOrRecorded) {
  TempDir dir("config-change");
  const fs::path run_dir = dir.path() / "run";
  ASSERT_EQ(run(train_args(run_dir, {"train.steps=3", "checkpoint.every=3"}), dir.path() / "a.txt"), 0);
  const std::string config_before = read_text(run_dir / "config.json");
  const std::string history_before = read_text(run_dir / "config_history.jsonl");
  EXPECT_EQ(run(train_args(run_dir, {"train.steps=6", "checkpoint.every=3", "train.seed=7"}), dir.path() / "b.txt"), 2);
  const std::string said = read_text_if_any(dir.path() / "b.txt");
  EXPECT_NE(said.find("train.seed 1234 -> 7"), std::string::npos) << said;
  EXPECT_NE(said.find("--allow-config-change train.seed"), std::string::npos) << said;
  EXPECT_EQ(read_text(run_dir / "config.json"), config_before);
  EXPECT_EQ(read_text(run_dir / "config_history.jsonl"), history_before);

  std::vector<std::string> allowed = train_args(run_dir, {"train.steps=6", "checkpoint.every=3", "optim.lr=0.001"});
  ASSERT_EQ(run(allowed, dir.path() / "c.txt"), 0) << read_text_if_any(dir.path() / "c.txt");
  const json config = json::parse(read_text(run_dir / "config.json"));
  EXPECT_EQ(config["optim"]["lr"], 0.001);
  const json start = json::parse(read_text(run_dir / "manifest.json"))["start"];
  EXPECT_EQ(start["step"], 3);
  ASSERT_EQ(start["changes"].size(), 2u) << start.dump();  // optim.lr and train.steps
  EXPECT_EQ(start["changes"][0]["key"], "optim.lr");
  std::istringstream history(read_text(run_dir / "config_history.jsonl"));
  int64_t starts = 0;
  for (std::string line; std::getline(history, line);) starts += !line.empty();
  EXPECT_EQ(starts, 2);

  allowed = train_args(run_dir, {"train.steps=9", "checkpoint.every=3", "optim.lr=0.001", "train.seed=7"});
  allowed.insert(allowed.end(), {"--allow-config-change", "train.seed"});
  EXPECT_EQ(run(allowed, dir.path() / "d.txt"), 0) << read_text_if_any(dir.path() / "d.txt");
}

// train.trace: RUN_DIR/trace.json in the Chrome Trace Event format, with every micro-batch's forward and
// backward and the step's other phases for the chosen steps only.
TEST(RunIntegrity, TraceRecordsTheChosenSteps) {
  TempDir dir("trace");
  const fs::path run_dir = dir.path() / "run";
  ASSERT_EQ(run(train_args(run_dir, {"train.steps=5", "checkpoint.every=2", "train.trace=true", "train.trace_from=2",
                                     "train.trace_steps=3"}),
                dir.path() / "out.txt"),
            0)
      << read_text_if_any(dir.path() / "out.txt");
  const json trace = json::parse(read_text(run_dir / "trace.json"));
  std::map<std::string, int64_t> count;
  std::set<int64_t> steps;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    EXPECT_GE(e.at("dur").get<double>(), 0.0);
    EXPECT_EQ(e.at("pid"), 0);
    steps.insert(e.at("args").at("step").get<int64_t>());
    ++count[e.at("name").get<std::string>()];
  }
  EXPECT_EQ(steps, (std::set<int64_t>{2, 3, 4}));
  for (const char* name :
       {"forward 0", "forward 1", "backward 0", "backward 1", "gradient reduction wait", "optimizer", "clipping"})
    EXPECT_EQ(count[name], 3) << name;
  EXPECT_EQ(count["checkpoint save (stall)"], 2);  // steps 2 and 4 save
  // The MoE layers' parts (the backend's timeline): 4 layers x (2 micro-batches x forward and backward, and the
  // routing probe's forward of each logged step), 3 steps; the host's memory: no device track.
  EXPECT_EQ(count["routing probe"], 3);
  for (const char* name : {"moe router", "moe dispatch", "moe experts", "moe combine"})
    EXPECT_EQ(count[name], 3 * 4 * (2 * 2 + 1)) << name;
  for (const json& e : trace.at("traceEvents"))
    if (e.at("ph") == "X") EXPECT_EQ(e.at("tid"), 0);
}

// On a device (the memory-checking backend, whose stream runs at the host's synchronisations as a GPU's runs
// behind it), every span is recorded twice: on the host track when the host queued the work, and on the device
// track (tid 1) when the stream ran it. The device's spans nest as the work does: each MoE part inside a forward
// or backward of its step (or the routing probe's or the evaluation's forward), each micro-batch's forward
// before its backward.
TEST(RunIntegrity, TraceOnADeviceShowsWhenTheStreamRanTheWork) {
  TempDir dir("trace_device");
  const fs::path run_dir = dir.path() / "run";
  ::setenv("MOE_CHECK_DEVICE_MEMORY", "1", 1);
  const int code = run(train_args(run_dir, {"train.steps=3", "checkpoint.every=0", "train.trace=true",
                                            "train.trace_from=2", "train.trace_steps=2"}),
                       dir.path() / "out.txt");
  ::unsetenv("MOE_CHECK_DEVICE_MEMORY");
  ASSERT_EQ(code, 0) << read_text_if_any(dir.path() / "out.txt");
  const json trace = json::parse(read_text(run_dir / "trace.json"));
  std::map<int, std::map<std::string, int64_t>> count;                          // by track
  std::map<std::pair<int64_t, std::string>, std::pair<double, double>> device;  // (step, name) -> [start, end]
  std::vector<std::tuple<int64_t, double, double>> moe_parts;                   // step, start, end
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    const int tid = e.at("tid").get<int>();
    const std::string name = e.at("name");
    const double start = e.at("ts"), end = start + e.at("dur").get<double>();
    EXPECT_GE(e.at("dur").get<double>(), 0.0) << name;
    ++count[tid][name];
    if (tid != 1) continue;
    const int64_t step = e.at("args").at("step");
    if (name.rfind("moe ", 0) == 0)
      moe_parts.emplace_back(step, start, end);
    else
      device[{step, name}] = {start, end};
  }
  EXPECT_EQ(count[0], count[1]);  // every span twinned
  for (const char* name : {"forward 0", "backward 1", "optimizer", "clipping"}) EXPECT_EQ(count[1][name], 2) << name;
  EXPECT_GE(count[1]["moe experts"], 2 * 4 * (2 * 2 + 1));  // and the evaluation's after the last step
  for (int64_t step : {2, 3})
    for (const std::string mb : {"0", "1"}) {
      const double forward_end = device[{step, "forward " + mb}].second;
      const double backward_start = device[{step, "backward " + mb}].first;
      EXPECT_LE(forward_end, backward_start + 1e-3);  // ts + dur: within rounding
    }
  for (const auto& [step, start, end] : moe_parts) {
    bool inside = false;
    for (const char* phase : {"forward 0", "forward 1", "backward 0", "backward 1", "routing probe", "evaluation"}) {
      const auto [s, e] = device[{step, phase}];
      inside |= s <= start + 1e-3 && end <= e + 1e-3;
    }
    EXPECT_TRUE(inside) << "an MoE span of step " << step << " outside every forward and backward";
  }
}

}  // namespace
}  // namespace moe
