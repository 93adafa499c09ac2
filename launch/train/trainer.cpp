// `moe train`: one rank's run from start to end. Setup (launch/train/train_setup.h), the choice of checkpoint
// (launch/train/resume.h), the step (launch/train/train_step.h) and metrics (launch/train/train_metrics.h) live in
// their own files; this one orders them and owns the loop.
#include "launch/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "checkpoint/checkpointer.h"
#include "checkpoint/root.h"
#include "core/backend/cpu/blas_kernels.h"
#include "core/backend/cpu/thread_policy.h"
#include "core/backend/cuda_backend.h"
#include "core/backend/memory_check.h"
#include "core/error.h"
#include "core/host.h"
#include "launch/config/memory.h"
#include "launch/run/progress.h"
#include "launch/run/run_dir.h"
#include "launch/run/run_lock.h"
#include "launch/run/tensorboard.h"
#include "launch/train/agree.h"
#include "launch/train/config_change.h"
#include "launch/train/faults.h"
#include "launch/train/heartbeat.h"
#include "launch/train/resume.h"
#include "launch/train/routing_health.h"
#include "launch/train/stop_signal.h"
#include "launch/train/train_metrics.h"
#include "launch/train/train_setup.h"
#include "launch/train/train_step.h"
#include "parallel/self_communicator.h"

namespace moe {
namespace fs = std::filesystem;

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return (end && *end == '\0' && x > 0) ? int(x) : fallback;
}

// What a run writes besides checkpoints, and its checkpointer.
struct RunOutputs {
  std::unique_ptr<MetricsWriter> metrics;          // rank 0
  std::unique_ptr<TensorBoardWriter> tensorboard;  // rank 0, with train.tensorboard
  std::unique_ptr<ckpt::Checkpointer> checkpointer;
  std::unique_ptr<RoutingProbe> probe;     // rank 0
  std::unique_ptr<HealthMonitor> monitor;  // rank 0
};

// A metrics line to metrics.jsonl and, with train.tensorboard, to the events file, both flushed.
void write_metrics(RunOutputs& out, const nlohmann::json& line) {
  out.metrics->write(line);
  if (out.tensorboard) out.tensorboard->write(line);
}

// Routing stability's reference and the monitor's state: a resumed run continues them from its kept lines.
void open_routing_health(const Trainer& t, RunOutputs& out, bool fresh, int64_t start_step) {
  const fs::path dir = t.paths.run_dir;
  out.probe = std::make_unique<RoutingProbe>((dir / "routing_probe.jsonl").string(), fresh, start_step);
  out.monitor = std::make_unique<HealthMonitor>(t.config.monitor, t.config.moe.num_experts);
  if (!fresh) out.monitor->replay((dir / "metrics.jsonl").string());
}

// The checkpoint roots this rank commits to (choose_resume found them the run's own): a fresh start deletes
// the checkpoints the program wrote there (--overwrite: they must not be resumed later), and nothing else;
// with checkpoints to write, each root is marked as this run's.
void claim_checkpoint_roots(const Trainer& t, const ResumePoint& point) {
  const CheckpointConfig& c = t.config.checkpoint;
  std::vector<std::string> roots;
  if (t.leader() || (c.node_local && t.paths.node_leader)) roots.push_back(t.paths.ckpt_root.string());
  if (t.leader()) roots.insert(roots.end(), c.replicas.begin(), c.replicas.end());
  const std::string run_dir = fs::absolute(t.paths.run_dir).lexically_normal().string();
  for (const std::string& root : roots) {
    if (point.dir.empty()) ckpt::clear_root(root);
    if (c.every > 0) ckpt::write_owner(root, {point.run_id, run_dir});
  }
}

// A fresh start clears the run's checkpoint roots and writes the run files; a resume keeps metrics.jsonl up
// to the checkpoint's step.
RunOutputs open_outputs(const TrainOptions& options, Trainer& t, const ResumePoint& point, int64_t start_step,
                        const std::vector<ConfigChange>& changes) {
  RunOutputs out;
  const bool fresh = point.dir.empty();
  const TrainPaths& paths = t.paths;
  if (t.leader()) check_tensorboard_dir(paths.run_dir);  // before anything is deleted or written
  claim_checkpoint_roots(t, point);
  if (t.leader()) {
    // config.json and manifest.json describe this start; config_history.jsonl keeps every start.
    const nlohmann::json start = {{"time", utc_now()},
                                  {"step", start_step},
                                  {"resumed_from", fresh ? nlohmann::json() : nlohmann::json(point.dir)},
                                  {"changes", changes_json(changes)},
                                  {"allowed_changes", options.allow_config_change},
                                  {"command", options.command_line}};
    write_run_files(paths.run_dir, t.config, options.command_line, t.threads, t.grid, start, t.data_provenance,
                    point.run_id);
    nlohmann::json entry = start;
    entry["config"] = t.config.resolved;
    append_config_history(paths.run_dir, entry);
    out.metrics = open_metrics(paths.run_dir, fresh, start_step);
    if (fresh) clear_tensorboard(paths.run_dir);  // a fresh start's curves begin empty, as metrics.jsonl does
    if (t.config.train.tensorboard) out.tensorboard = std::make_unique<TensorBoardWriter>(paths.run_dir, start_step);
    open_routing_health(t, out, fresh, start_step);
  }
  const Config& config = t.config;
  if (config.checkpoint.every <= 0) return out;
  const nlohmann::json info = {{"config", config.resolved},
                               {"layout",
                                {{"world", t.grid.sizes().world},
                                 {"dp", t.grid.sizes().dp},
                                 {"ep", config.parallel.ep},
                                 {"zero", config.optim.zero}}},
                               {"versions", build_versions()},
                               {"data", t.data_provenance},
                               {"run_id", point.run_id}};
  const bool leader = t.leader();
  ckpt::SaveSettings save{paths.ckpt_root.string(), config.checkpoint.keep,      config.checkpoint.full_every,
                          config.checkpoint.async,  config.checkpoint.replicas,  config.checkpoint.peer_copy,
                          paths.ranks_per_node,     config.checkpoint.node_local};
  if (const char* delay = std::getenv("MOE_TEST_SNAPSHOT_DELAY_MS")) save.snapshot_delay_s = std::atof(delay) / 1000;
  if (const char* delay = std::getenv("MOE_TEST_REPLICA_DELAY_MS")) save.replica_delay_s = std::atof(delay) / 1000;
  save.on_non_finite = fail_non_finite_state;
  out.checkpointer =
      std::make_unique<ckpt::Checkpointer>(std::move(save), *t.groups.world, info, [leader](const std::string& text) {
        // Failures and fallbacks are always shown, whatever --quiet says.
        if (leader) std::fprintf(stderr, "moe: checkpoint: %s\n", text.c_str());
      });
  t.state.checkpointer = out.checkpointer.get();
  return out;
}

// What the run records as JSON (manifest.json, config_history.jsonl) must be UTF-8.
void check_command_text(const TrainOptions& options) {
  check_utf8(options.config_path, "--config");
  check_utf8(options.run_dir, "--run-dir");
  check_utf8(options.resume, "--resume");
  for (size_t i = 0; i < options.command_line.size(); ++i)
    check_utf8(options.command_line[i], "command-line argument " + std::to_string(i));
}

std::string layout_text(const Trainer& t) {
  const int64_t world = t.grid.sizes().world;
  std::string layout = std::to_string(world) + (world == 1 ? " rank" : " ranks");
  if (world == 1) return layout;
  const GridSizes& g = t.grid.sizes();
  const auto dim = [](const char* name, int64_t size) { return std::string(name) + " " + std::to_string(size) + ", "; };
  layout += " (" + (g.tp > 1 ? dim("tp", g.tp) : "") + (g.pp > 1 ? dim("pp", g.pp) : "") + dim("dp", g.dp);
  layout += "ep " + std::to_string(g.ep) + (g.etp > 1 ? ", expert_tp " + std::to_string(g.etp) : "");
  return layout + (t.config.optim.zero ? ", ZeRO-1" : "") + ")";
}

// The loop's clock: throughput over the interval since the last logged step, evaluation excluded.
struct Clock {
  using Steady = std::chrono::steady_clock;
  Steady::time_point start = Steady::now(), interval_start = start;
  int64_t interval_tokens = 0;
  static double since(Steady::time_point t) { return std::chrono::duration<double>(Steady::now() - t).count(); }
};

// Everything the loop touches besides the trainer.
struct Loop {
  const TrainOptions& options;
  Trainer& t;
  RunOutputs& out;
  Progress& progress;
  HeartbeatSender& heartbeat;
  FaultInjector faults;
  int64_t resumed_step = 0;
  Clock clock;
  int64_t last_save_step = -1;        // the newest step a save was started for
  double a2a_wait_s = 0;              // the last step's exposed expert all-to-all (this rank's)
  double ckpt_stall_s = 0;            // checkpoint stalls since the last metrics line
  Backend::HostTraffic host_traffic;  // the last step's waits for the backend and bytes read back (this rank's)
  // train.adapt_threads on the CPU backend: the thread count follows the cores other processes leave free.
  std::optional<cpu::ThreadGovernor> governor;
  cpu::CoreUseMeter core_use;
};

// After a step: the thread count the governor decides from the cores used and idle during it.
void adapt_threads(Loop& loop) {
  if (!loop.governor) return;
  Trainer& t = loop.t;
  const cpu::CoreUse use = loop.core_use.sample();
  const int next = loop.governor->decide(t.threads, use);
  if (next == t.threads) return;
  char why[160];
  std::snprintf(why, sizeof why, "threads %d -> %d (over the last step this process used %.2f cores, %.2f were idle)",
                t.threads, next, use.ours, use.idle);
  loop.progress.note(why);
  t.backend.set_threads(next);
  t.threads = next;
}

// The routing-health fields of a logged step's MoE layers and the monitor's alerts (printed once each).
void add_routing_health(Loop& loop, nlohmann::json& line, const std::vector<std::vector<int32_t>>& top1) {
  Trainer& t = loop.t;
  const std::vector<nlohmann::json> stability = loop.out.probe->observe(line["step"].get<int64_t>(), top1);
  for (size_t l = 0; l < t.model_stats.size(); ++l) {
    add_load_health(line["moe"][l], t.model_stats[l], t.config.moe.top_k);
    if (l < stability.size()) line["moe"][l]["stability"] = stability[l];
  }
  const nlohmann::json alerts = loop.out.monitor->observe(line);
  if (alerts.empty()) return;
  line["alerts"] = alerts;
  for (const nlohmann::json& alert : alerts) loop.progress.note(HealthMonitor::describe(alert));
}

void log_step(Loop& loop, int64_t done, const StepResult& r, double ckpt_stall) {
  Trainer& t = loop.t;
  const TrainConfig& tc = t.config.train;
  if (!(done % tc.log_every == 0 || done == 1 || done == tc.steps)) return;
  loop.ckpt_stall_s = 0;  // counted in this line
  const double interval_s = Clock::since(loop.clock.interval_start);
  const double elapsed_s = Clock::since(loop.clock.start);
  std::vector<std::vector<int32_t>> top1;
  {
    const auto span = t.tracer.span("routing probe", "evaluation");
    top1 = probe_top1(t);  // every rank: a forward in lockstep
  }
  if (!t.leader()) return;
  StepTiming timing;
  timing.tokens_per_s = interval_s > 0 ? double(loop.clock.interval_tokens) / interval_s : 0.0;
  timing.elapsed_s = elapsed_s;
  timing.comm_wait_s = t.buckets->last_wait_seconds();
  timing.ckpt_stall_s = ckpt_stall;
  timing.a2a_wait_s = loop.a2a_wait_s;
  timing.host_syncs = loop.host_traffic.syncs;
  timing.d2h_bytes = loop.host_traffic.d2h_bytes;
  timing.threads = t.threads;
  nlohmann::json line = step_line(done, r, timing, done * t.tokens_per_step(), t.model_stats, t.config.moe.top_k);
  line["data"] = data_metrics(*t.loader, done - 1, tc.global_batch);
  add_routing_health(loop, line, top1);
  write_metrics(loop.out, line);
  const double eta = elapsed_s / double(done - loop.resumed_step) * double(tc.steps - done);
  loop.progress.step(done, tc.steps, r.loss, r.lr, timing.tokens_per_s, eta,
                     t.model_stats.empty() ? -1 : r.dead_experts);
  loop.clock.interval_start = Clock::Steady::now();
  loop.clock.interval_tokens = 0;
}

void maybe_evaluate(Loop& loop, int64_t done) {
  const TrainConfig& tc = loop.t.config.train;
  if (!((tc.eval_every > 0 && done % tc.eval_every == 0) || done == tc.steps)) return;
  loop.heartbeat.set(Phase::Eval, done, "evaluation");
  const auto span = loop.t.tracer.span("evaluation", "evaluation");
  const EvalResult ev = evaluate(loop.t);
  if (loop.t.leader()) {
    write_metrics(loop.out, eval_line(done, ev));
    loop.progress.note(eval_text(done, ev));
  }
  loop.clock.interval_start = Clock::Steady::now();  // evaluation time does not count against throughput
}

// Returns false when the run stops early (--stop-after-step).
bool run_step(Loop& loop, int64_t step) {
  Trainer& t = loop.t;
  const Config& config = t.config;
  t.exchange->reset_blocked_seconds();
  const Backend::HostTraffic before = t.model->backend().host_traffic();
  const StepResult r = train_step(t, step);
  const Backend::HostTraffic after = t.model->backend().host_traffic();
  loop.host_traffic = {after.syncs - before.syncs, after.d2h_bytes - before.d2h_bytes};
  loop.a2a_wait_s = t.exchange->blocked_seconds();
  loop.clock.interval_tokens += t.tokens_per_step();
  const int64_t done = step + 1;
  // The step's lines, its evaluation's too, are written before its checkpoint is saved: a checkpoint a resumed run
  // starts from never lies past the last line of metrics.jsonl, and a resumed run does not evaluate its first step
  // again (a run killed during an evaluation after its step's save lost that evaluation's line for good). The
  // save's own stall is counted in the next line.
  loop.ckpt_stall_s += r.ckpt_wait_s;  // the step's update waited for the last save's snapshot
  log_step(loop, done, r, loop.ckpt_stall_s);
  maybe_evaluate(loop, done);
  if (ckpt::Checkpointer* ck = loop.out.checkpointer.get()) {
    // An asynchronous save's commit (the manifest, the peer and replica copies) is checkpoint I/O: timed against
    // fault.checkpoint_timeout_s, not against the step's timeout, on every rank (they wait for it together).
    if (ck->in_flight()) loop.heartbeat.set(Phase::CheckpointSave, done, "checkpoint commit");
    ck->poll();
    if (done % config.checkpoint.every == 0 || done == config.train.steps) {
      loop.heartbeat.set(Phase::CheckpointSave, done, "checkpoint save");
      const auto span = t.tracer.span("checkpoint save (stall)", "checkpoint");
      const auto t0 = Clock::Steady::now();
      ck->save(done, checkpoint_pieces(t.state, true));
      loop.ckpt_stall_s +=
          Clock::since(t0);  // the staging and the save (sync: its snapshot, finiteness check and write)
      loop.last_save_step = done;
    }
  }
  adapt_threads(loop);
  for (const FaultInjection& f : config.fault.inject)  // the newest checkpoint must exist before it is corrupted
    if (f.kind == FaultKind::CorruptCheckpoint && f.step == done && loop.out.checkpointer)
      loop.out.checkpointer->finish();
  loop.faults.after_step(done);
  if (loop.options.stop_after_step > 0 && done == loop.options.stop_after_step) {
    if (loop.out.checkpointer) loop.out.checkpointer->finish();
    loop.progress.note("stopping after step " + std::to_string(done) + " (--stop-after-step)");
    return false;
  }
  return true;
}

const char* signal_name(int sig) {
  return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : sig == SIGUSR1 ? "SIGUSR1" : "a signal";
}

// After a stop signal, at the end of step `done` on every rank: a checkpoint of this step when the last
// save's time fits in fault.term_grace_s (or none was measured yet), then the run ends.
void stop_on_signal(Loop& loop, int sig, int64_t done) {
  Trainer& t = loop.t;
  std::string saved;
  if (ckpt::Checkpointer* ck = loop.out.checkpointer.get()) {
    const double grace = t.config.fault.term_grace_s;
    const auto& last = ck->last_report();
    const double estimate = last.step >= 0 ? last.write_s + last.stall_s : 0.0;
    if (loop.last_save_step == done) {
      saved = "; its checkpoint is being committed";
    } else if (done == loop.resumed_step) {
      saved = done > 0 ? "; the checkpoint it resumed from holds it" : "";
    } else if (grace > 0 && estimate <= grace) {
      loop.heartbeat.set(Phase::CheckpointSave, done, "checkpoint save after a stop signal");
      ck->save(done, checkpoint_pieces(t.state, true));  // refused when not finite (fail_non_finite_state)
      loop.last_save_step = done;
      saved = "; writing a checkpoint of it";
    } else {
      saved =
          "; no checkpoint of it (the last save took " + std::to_string(estimate) + " s, more than fault.term_grace_s)";
    }
  }
  // Said whatever --quiet says: the user (or the scheduler's log) must learn why the run ended.
  loop.progress.finish();
  if (t.leader())
    std::fprintf(stderr, "moe train: %s received: stopping after step %lld%s; continue with --resume auto\n",
                 signal_name(sig), static_cast<long long>(done), saved.c_str());
}

void finish_run(Loop& loop) {
  loop.heartbeat.set(Phase::CheckpointSave, loop.t.config.train.steps, "final checkpoint");
  if (ckpt::Checkpointer* ck = loop.out.checkpointer.get()) {
    ck->finish();
    const auto& r = ck->last_report();
    if (ck->last_failed_step() > r.step)
      MOE_RUN_FAILED("the checkpoint of step "
                     << ck->last_failed_step() << " could not be written (" << ck->last_failure() << "); "
                     << (r.step >= 0 ? "the newest committed checkpoint is step " + std::to_string(r.step)
                                     : std::string("none was committed since this start"))
                     << ". Make room in (or fix) " << loop.t.paths.ckpt_root.string()
                     << " and run again with --resume auto");
    if (r.step >= 0)
      loop.progress.note("checkpoint: newest is step " + std::to_string(r.step) + " (" + r.kind + ", " +
                         std::to_string(r.bytes) + " bytes, written in " + std::to_string(r.write_s) + " s, stall " +
                         std::to_string(r.stall_s) + " s)");
  }
  loop.progress.finish();
  loop.progress.note("done in " + format_duration(Clock::since(loop.clock.start)) + "; metrics in " +
                     (fs::path(loop.t.paths.run_dir) / "metrics.jsonl").string());
}

// Every parameter in global coordinates (blocks gathered over the group each is split across), for tests.
// The communicator of the group a tensor is split over (nullptr: none the trainer builds).
Communicator* communicator_of(const ProcessGroups& groups, ParamGroup group) {
  switch (group) {
    case ParamGroup::ExpertParallel:
      return groups.ep.get();
    case ParamGroup::TensorParallel:
      return groups.tp.get();
    case ParamGroup::ExpertTensorParallel:
      return groups.etp.get();
    default:
      return nullptr;
  }
}

// Gathers `data`, the block `block` describes, over the group of `split` (one of block's splits): after it
// they are the block whole on that axis, and `split` is none. Block r of the group starts at r * its size.
void gather_split(const ProcessGroups& groups, ParamSpec& block, Split& split, std::vector<float>& data) {
  Communicator* group = communicator_of(groups, split.group);
  if (split.axis < 0 || !group || group->size() == 1) return;
  const size_t axis = size_t(split.axis);
  std::vector<float> blocks(data.size() * size_t(group->size()));
  group->allgather(data.data(), blocks.data(), block.numel);
  ParamSpec part{block.name, block.shape};  // block r inside the gathered one, split on this axis only
  part.numel = block.numel;
  part.split = {split.axis, split.global_size, 0, split.group};
  data.resize(blocks.size());
  for (int r = 0; r < group->size(); ++r) {
    part.split.offset = r * block.shape[axis];
    for (int64_t i = 0; i < block.numel; ++i) data[size_t(part.global_index(i))] = blocks[size_t(r * block.numel + i)];
  }
  block.shape[axis] = split.global_size;
  block.numel = int64_t(data.size());
  split = Split{};
}

// Every stage's tensors to every stage: each stage in turn broadcasts its count, then per tensor its name's
// length and characters, its size and its values.
void share_over_stages(Communicator& pp, std::map<std::string, std::vector<float>>& parameters) {
  const std::map<std::string, std::vector<float>> mine = parameters;
  for (int root = 0; root < pp.size(); ++root) {
    auto it = mine.begin();
    int64_t count = int64_t(mine.size());
    pp.broadcast(&count, 1, root);
    for (int64_t i = 0; i < count; ++i) {
      std::string name = pp.rank() == root ? it->first : std::string();
      int64_t sizes[2] = {int64_t(name.size()), pp.rank() == root ? int64_t(it->second.size()) : 0};
      pp.broadcast(sizes, 2, root);
      std::vector<int32_t> chars(name.begin(), name.end());
      chars.resize(size_t(sizes[0]));
      pp.broadcast(chars.data(), sizes[0], root);
      std::vector<float> values = pp.rank() == root ? it->second : std::vector<float>(size_t(sizes[1]));
      pp.broadcast(values.data(), sizes[1], root);
      parameters[std::string(chars.begin(), chars.end())] = std::move(values);
      if (pp.rank() == root) ++it;
    }
  }
}

TrainResult collect_parameters(Trainer& t) {
  TrainResult result;
  for (const ParamSpec& spec : t.model->table().specs()) {
    std::vector<float>& full = result.parameters[spec.name];
    full = t.model->backend().download(t.model->params() + spec.offset, spec.numel);
    ParamSpec block = spec;  // the second split's group first, then the first's
    gather_split(t.groups, block, block.split2, full);
    gather_split(t.groups, block, block.split, full);
  }
  if (t.pipeline) share_over_stages(*t.groups.pp, result.parameters);
  return result;
}

}  // namespace

int launcher_world_size() { return env_int("OMPI_COMM_WORLD_SIZE", env_int("PMI_SIZE", env_int("PMIX_SIZE", 1))); }
// MOE_RANKS_PER_NODE overrides it, to simulate several hosts on one machine (tests, demonstrations).
int launcher_local_size() {
  return env_int("MOE_RANKS_PER_NODE", env_int("OMPI_COMM_WORLD_LOCAL_SIZE", env_int("MPI_LOCALNRANKS", 1)));
}

int launcher_local_rank() { return env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("MPI_LOCALRANKID", 0)); }

namespace {
// The backend train.device names: the CPU's, or the CUDA backend on the device local_rank mod the devices
// this process sees (one rank per GPU of the node). The config is read here and again by run_train: any
// refusal is the same.
// MOE_CHECK_DEVICE_MEMORY=1 makes the CPU backend the memory-checking one (core/backend/memory_check.h).
std::unique_ptr<Backend> make_backend(const TrainOptions& options) {
  const Config config = load_config(options.config_path, options.overrides);
  if (config.train.device != Device::Cuda)
    return device_memory_check_requested() ? make_memory_check_backend(0) : make_cpu_backend(0);
  return make_cuda_backend(launcher_local_rank() % std::max(1, cuda_device_count()),
                           CudaOptions{config.train.fused_attention});
}
}  // namespace

TrainResult run_train(const TrainOptions& options, std::unique_ptr<Communicator> world) {
  const std::unique_ptr<Backend> backend = make_backend(options);
  return run_train(options, *backend, std::move(world));
}

namespace {
// The trace as the backend's timeline while the trainer lives (the backend may outlive it), with the device
// track where the backend's stream is not the host's.
struct TraceListening {
  TraceListening(Backend& backend, Tracer& tracer) : backend(backend) {
    if (!tracer.enabled()) return;
    backend.set_timeline(&tracer);
    if (!backend.memory_is_host()) tracer.set_device(&backend.stream());
  }
  ~TraceListening() { backend.set_timeline(nullptr); }
  Backend& backend;
};

// The trace moves on to `step` (0: none); the device times of the steps it traced are read first, after a wait
// for the stream (counted in host_syncs: only after traced steps).
void trace_step(Trainer& t, int64_t step) {
  if (t.tracer.device_pending()) {
    t.backend.synchronize();
    t.tracer.flush_device();
  }
  t.tracer.set_step(step);
}
}  // namespace

TrainResult run_train(const TrainOptions& options, Backend& backend, std::unique_ptr<Communicator> world) {
  const StopSignals signals;  // from here on SIGTERM and SIGINT ask for a clean stop
  if (!world) world = std::make_unique<SelfCommunicator>("world");
  // Everything that can be refused is checked before anything is written, identically on every rank.
  check_command_text(options);
  CheckedConfig checked = load_checked_config(options, world->size());
  TrainPaths paths = train_paths(options, checked.config, world->rank());
  const data::Corpus corpus = load_training_corpus(checked.config);
  Trainer t(std::move(checked), std::move(paths), corpus, std::move(world), backend);
  t.tracer.start(*t.groups.world);
  const TraceListening listening(backend, t.tracer);
  HeartbeatSender heartbeat(t.groups.rank, host_name(), t.config.fault, t.flight, t.paths.run_dir + "/flight");
  heartbeat.set(Phase::Setup, 0, "start-up");
  const ResumePoint point = choose_resume(options, t);
  // The last refusals, then the run directory is this process's (and its supervisor's) until the end.
  std::optional<RunLock> lock;
  std::vector<ConfigChange> changes;      // since the checkpoint (rank 0)
  std::vector<std::string> data_changes;  // allowed by --allow-data-change (rank 0)
  on_rank0_agree(*t.groups.world, [&] {
    if (!point.dir.empty()) {
      const ckpt::Manifest m = point.distributed ? point.distributed->chain.back() : ckpt::read_manifest(point.dir);
      changes = config_changes(m.config, t.config.resolved);
      check_config_changes(changes, options.allow_config_change, point.dir);
      data_changes = check_data_change(m.data, t.data_provenance, options.allow_data_change, point.dir);
    }
    // A fresh start checked the run directory in choose_resume; a resume rewrites metrics.jsonl there.
    if (!point.dir.empty()) check_dir_writable(t.paths.run_dir, "--run-dir " + t.paths.run_dir);
    check_checkpoint_roots_writable(t.paths.ckpt_root.string(), t.config.checkpoint);
    lock.emplace(RunLock::acquire_or_inherit(t.paths.run_dir));
  });
  int64_t start_step = 0;
  if (!point.dir.empty()) {
    heartbeat.set(Phase::CheckpointLoad, 0, "loading the checkpoint");
    start_step = load_resume(point, t);
  }

  RunOutputs out = open_outputs(options, t, point, start_step, changes);
  Progress progress(t.leader() && !options.quiet, launcher_world_size() == 1 && !std::getenv("OMPI_COMM_WORLD_RANK"));
  // Checkpoints passed over (damaged, another run's) are said whatever --quiet says, as save failures are.
  if (t.leader())
    for (const std::string& note : point.notes) std::fprintf(stderr, "moe: checkpoint: %s\n", note.c_str());
  if (!point.dir.empty()) progress.note("resuming from " + point.dir + " at step " + std::to_string(start_step));
  if (!changes.empty()) progress.note("settings changed since the checkpoint: " + describe_changes(changes));
  for (const std::string& line : data_changes) progress.note("data changed since the checkpoint: " + line);
  const TrainConfig& tc = t.config.train;
  const std::string held = t.grid.sizes().pp > 1 ? " parameters on pipeline stage 0, " : " parameters per rank, ";
  progress.note("moe train: " + std::to_string(t.model->num_params()) + held + std::to_string(tc.steps) + " steps of " +
                std::to_string(t.tokens_per_step()) + " tokens on " + layout_text(t) + ", " + to_string(tc.precision) +
                " GEMMs, " + std::to_string(t.threads) + " threads per rank (waiting: " +
                cpu::wait_policy_description() + "); run directory " + t.paths.run_dir);
  if (tc.device == Device::Cpu) {
    progress.note("CPU GEMMs: " + cpu::cpu_gemm_kernels_description());
    const std::string mixed = blas_kernels_disagreement(*t.groups.world);  // said whatever --quiet says
    if (t.leader() && !mixed.empty()) std::fprintf(stderr, "moe: warning: %s\n", mixed.c_str());
  }
  const GridSizes& sizes = t.grid.sizes();
  const StageEstimate memory = largest_stage_estimate(t.config, sizes.tp, sizes.dp, sizes.ep);
  progress.note("memory per rank" +
                (sizes.pp > 1 ? " (pipeline stage " + std::to_string(memory.stage) + ", the largest)" : std::string()) +
                ": " + memory_text(memory.memory));

  Loop loop{
      options,    t,
      out,        progress,
      heartbeat,  FaultInjector(t.config.fault.inject, t.groups.rank, t.paths.run_dir, t.paths.ckpt_root.string()),
      start_step, Clock{}};
  loop.faults.set_flight_recorder(t.flight);  // the all-to-all faults act through it
  if (tc.adapt_threads && tc.device == Device::Cpu) loop.governor.emplace(t.threads);
  int stop_signal = 0;
  for (int64_t step = start_step; step < tc.steps; ++step) {
    heartbeat.set(Phase::Step, step, "training step (forward, backward, gradient reduction, update)");
    trace_step(t, step + 1);
    // Before the step's first collective: every rank stops after the same step when any was asked to.
    if ((stop_signal = StopSignals::agreed(*t.groups.world)) != 0) {
      stop_on_signal(loop, stop_signal, step);
      break;
    }
    if (!run_step(loop, step)) break;
  }
  trace_step(t, 0);
  t.tracer.write(*t.groups.world, (fs::path(t.paths.run_dir) / "trace.json").string());
  finish_run(loop);
  TrainResult result = options.collect_parameters ? collect_parameters(t) : TrainResult{};
  result.stop_signal = stop_signal;
  return result;
}

}  // namespace moe
