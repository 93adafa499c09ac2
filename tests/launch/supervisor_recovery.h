// What the fault-recovery tests of `moe launch` share (test_supervisor.cpp, test_supervisor_heartbeats.cpp):
// the uninterrupted reference run, made once per process, and the comparison of a recovered run with it
// (metrics.jsonl bit for bit, the final parameters byte for byte); the figures of one recovery, printed and
// recorded as gtest properties; and the checks of one failure followed by one restart.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "supervisor_harness.h"

namespace moe::test_support {

// metrics.jsonl without the machine-dependent fields, one dump per line (dumps round-trip doubles, so
// equal text means equal bits).
inline std::vector<std::string> comparable_metrics(const fs::path& run_dir) {
  std::vector<std::string> out;
  for (const json& line : read_json_lines(run_dir / "metrics.jsonl")) out.push_back(without_timing(line).dump());
  return out;
}

// Every "params/..." tensor of the checkpoint, whole, as bytes.
inline std::map<std::string, std::vector<uint8_t>> final_params(const fs::path& checkpoint_dir) {
  std::map<std::string, std::vector<uint8_t>> out;
  std::string why;
  const auto resolved = moe::ckpt::verify_checkpoint(checkpoint_dir.string(), {}, &why);
  if (!resolved) {
    ADD_FAILURE() << checkpoint_dir << " does not verify: " << why;
    return out;
  }
  std::map<std::string, moe::ckpt::Piece> pieces;
  for (const moe::ckpt::FileEntry& f : resolved->chain.back().files)
    for (const moe::ckpt::DatasetEntry& d : f.datasets) {
      if (d.tensor.rfind("params/", 0) != 0 || pieces.count(d.tensor)) continue;
      moe::ckpt::Piece p;
      p.tensor = d.tensor, p.dtype = d.dtype, p.slab = moe::ckpt::Slab::whole(d.global_shape());
      pieces.emplace(d.tensor, p);
    }
  std::vector<moe::ckpt::Piece> list;
  for (auto& [name, p] : pieces) {
    std::vector<uint8_t>& buf = out[name];
    buf.assign(size_t(p.bytes()), 0);
    p.dst = buf.data();
    list.push_back(p);
  }
  try {
    moe::ckpt::load_pieces(*resolved, list);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "loading " << checkpoint_dir << ": " << e.what();
  }
  return out;
}

inline fs::path final_checkpoint(const fs::path& run_dir) { return run_dir / "checkpoints" / "step-00000012"; }

// The uninterrupted run every recovered run must equal; made once per process.
struct Reference {
  fs::path base, run_dir;
  std::vector<std::string> metrics;
  std::map<std::string, std::vector<uint8_t>> params;
  double wall_s = 0;
  bool ok = false;
};

inline fs::path g_reference_base;  // for the clean-up at the end

inline const Reference& reference() {
  static Reference ref = [] {
    Reference r;
    std::string pattern = (fs::temp_directory_path() / "moe-sup-reference-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    r.base = pattern;
    g_reference_base = r.base;
    r.run_dir = r.base / "run";
    const LaunchResult run = run_launch(r.base, r.run_dir, launch_args(r.run_dir, {}));
    r.wall_s = run.wall_s;
    EXPECT_EQ(run.exit_code, 0) << "the uninterrupted reference run failed\n" << describe(run);
    EXPECT_TRUE(events_named(run, "restart").empty()) << describe(run);
    r.metrics = comparable_metrics(r.run_dir);
    r.params = final_params(final_checkpoint(r.run_dir));
    r.ok = run.exit_code == 0 && r.metrics.size() >= 12 && !r.params.empty();
    std::cout << "[ reference ] uninterrupted launch: " << run.wall_s << " s, " << r.metrics.size()
              << " metrics lines, " << r.params.size() << " parameter tensors\n";
    return r;
  }();
  return ref;
}

// The recovered run equals the uninterrupted one: metrics (bit for bit) and final parameters (bytes).
inline void expect_same_as_reference(const fs::path& run_dir) {
  const Reference& ref = reference();
  ASSERT_TRUE(ref.ok) << "no reference run to compare with";
  const std::vector<std::string> metrics = comparable_metrics(run_dir);
  EXPECT_EQ(metrics.size(), ref.metrics.size()) << "metrics.jsonl lines";
  for (size_t i = 0; i < std::min(metrics.size(), ref.metrics.size()); ++i)
    if (metrics[i] != ref.metrics[i]) {
      ADD_FAILURE() << "metrics.jsonl line " << i + 1 << " differs from the uninterrupted run:\n  got      "
                    << metrics[i] << "\n  expected " << ref.metrics[i];
      break;
    }
  const auto params = final_params(final_checkpoint(run_dir));
  EXPECT_EQ(params.size(), ref.params.size()) << "parameter tensors in the final checkpoint";
  for (const auto& [name, bytes] : ref.params) {
    const auto it = params.find(name);
    if (it == params.end()) {
      ADD_FAILURE() << name << " missing from " << final_checkpoint(run_dir);
      continue;
    }
    EXPECT_TRUE(it->second == bytes) << name << " differs from the uninterrupted run's final value";
  }
}

// The figures of one recovery, printed and recorded. The supervisor's own: detect_s of the failure,
// time_to_train_s of the restarted attempt (only when a heartbeat of it arrived in phase "step": these
// steps take ~20 ms against a heartbeat every 0.2 s), backoff_s, steps_lost. The test's view (polled
// every 20 ms): the fault's marker file appearing, the failure line appearing in events.log, the
// resumed run writing metrics.jsonl again.
struct Recovery {
  double detect_s = -1;
  double fault_to_event_s = -1;  // marker -> crash/hang line
  double time_to_train_s = -1;   // the restart attempt's "training" event, -1 when there was none
  double backoff_s = -1;
  double event_to_resumed_s = -1;  // crash/hang line -> the resumed run writing metrics again
  double fault_to_resumed_s = -1;  // marker -> the resumed run writing metrics again
  int64_t steps_lost = -1, resume_step = -1;
};

inline Recovery measure(const LaunchResult& r, const std::string& case_name) {
  Recovery m;
  double fault_t = -1;
  for (const auto& [name, t] : r.observed.markers)
    if (fault_t < 0 || t < fault_t) fault_t = t;
  size_t failure_index = r.events.size(), restart_index = r.events.size();
  for (size_t i = 0; i < r.events.size(); ++i) {
    const std::string e = r.events[i].value("event", "");
    if ((e == "crash" || e == "hang") && failure_index == r.events.size()) failure_index = i;
    if (e == "restart" && restart_index == r.events.size()) restart_index = i;
  }
  const double resumed_t = r.observed.metrics_resumed;
  if (failure_index < r.events.size()) {
    m.detect_s = r.events[failure_index].value("detect_s", -1.0);
    if (failure_index < r.observed.event_seen.size()) {
      const double seen = r.observed.event_seen[failure_index];
      if (fault_t >= 0) m.fault_to_event_s = seen - fault_t;
      if (resumed_t >= 0) m.event_to_resumed_s = resumed_t - seen;
    }
  }
  if (fault_t >= 0 && resumed_t >= 0) m.fault_to_resumed_s = resumed_t - fault_t;
  if (restart_index < r.events.size()) {
    const json& restart = r.events[restart_index];
    m.backoff_s = restart.value("backoff_s", -1.0);
    m.steps_lost = restart.value("steps_lost", int64_t(-1));
    m.resume_step = restart.value("resume_step", int64_t(-1));
    const int64_t attempt = restart.value("restart", int64_t(1));  // attempts count from 0
    for (size_t i = restart_index; i < r.events.size(); ++i)
      if (r.events[i].value("event", "") == "training" && r.events[i].value("attempt", int64_t(-1)) == attempt) {
        m.time_to_train_s = r.events[i].value("time_to_train_s", -1.0);
        break;
      }
  }
  std::cout << "[ figures ] " << case_name << ": detect_s " << m.detect_s << " (fault -> event " << m.fault_to_event_s
            << " s); time to resume: time_to_train_s " << m.time_to_train_s << " + backoff_s " << m.backoff_s
            << " (event -> training again " << m.event_to_resumed_s << " s, fault -> training again "
            << m.fault_to_resumed_s << " s); steps lost " << m.steps_lost << " (resumed at step " << m.resume_step
            << "); whole launch " << r.wall_s << " s\n";
  for (const auto& [key, value] :
       std::vector<std::pair<const char*, double>>{{"detect_s", m.detect_s},
                                                   {"fault_to_event_s", m.fault_to_event_s},
                                                   {"time_to_train_s", m.time_to_train_s},
                                                   {"backoff_s", m.backoff_s},
                                                   {"event_to_resumed_s", m.event_to_resumed_s},
                                                   {"fault_to_resumed_s", m.fault_to_resumed_s},
                                                   {"steps_lost", double(m.steps_lost)},
                                                   {"resume_step", double(m.resume_step)},
                                                   {"launch_wall_s", r.wall_s}})
    ::testing::Test::RecordProperty(key, std::to_string(value));
  return m;
}

inline std::string inject(const std::string& kind, int rank, int step) {
  return "fault.inject=[{\"kind\":\"" + kind + "\",\"rank\":" + std::to_string(rank) +
         ",\"step\":" + std::to_string(step) + "}]";
}

// One restart after one failure (an event named in `kinds`: "crash", "hang"), resumed from `resume_step`.
inline void expect_one_recovery(const LaunchResult& r, const std::vector<std::string>& kinds, int64_t resume_step) {
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  const auto failures = [&] {
    std::vector<json> out = events_named(r, "crash");
    for (const json& h : events_named(r, "hang")) out.push_back(h);
    return out;
  }();
  ASSERT_EQ(failures.size(), 1u) << "one failure expected\n" << describe(r);
  const std::string kind = failures[0].value("event", "");
  EXPECT_NE(std::find(kinds.begin(), kinds.end(), kind), kinds.end()) << "unexpected " << kind << "\n" << describe(r);
  EXPECT_EQ(failures[0].value("processes_left", int64_t(-1)), 0) << describe(r);
  const auto restarts = events_named(r, "restart");
  ASSERT_EQ(restarts.size(), 1u) << describe(r);
  EXPECT_EQ(restarts[0].value("resume_step", int64_t(-1)), resume_step) << describe(r);
  EXPECT_GE(restarts[0].value("steps_lost", int64_t(-1)), 1) << describe(r);
  ASSERT_FALSE(events_named(r, "finished").empty()) << describe(r);
  EXPECT_EQ(last_event(r), "finished") << describe(r);
  // The failure comes before the restart.
  size_t fi = 0, ri = 0;
  for (size_t i = 0; i < r.events.size(); ++i) {
    if (r.events[i] == failures[0]) fi = i;
    if (r.events[i] == restarts[0]) ri = i;
  }
  EXPECT_LT(fi, ri) << describe(r);
  EXPECT_TRUE(r.left_behind.empty()) << r.left_behind.size() << " processes of the job outlived the launch";
  EXPECT_FALSE(r.timed_out);
}

// A rank that died is found either way: mpirun ending (a crash), or, when mpirun takes longer than
// fault.heartbeat_timeout_s to end the job (it took 1.1 s mostly, over 2 s in about one run of four
// here), the dead rank's silence (a hang, reason "silent").
inline const std::vector<std::string> kDeadRank = {"crash", "hang"};

inline void expect_names_dead_rank(const LaunchResult& r, int64_t rank) {
  for (const json& e : r.events) {
    const std::string kind = e.value("event", "");
    if (kind != "crash" && kind != "hang") continue;
    EXPECT_EQ(e.value("rank", int64_t(-1)), rank) << "the failed rank is named\n" << describe(r);
    if (kind == "hang") {
      EXPECT_EQ(e.value("reason", ""), "silent") << describe(r);
    }
    std::cout << "[ detected ] as " << kind << (kind == "hang" ? " (silent)" : "") << "\n";
    return;
  }
}

}  // namespace moe::test_support
