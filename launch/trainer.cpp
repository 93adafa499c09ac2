// The training loop of one rank.
#include "launch/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <regex>
#include <thread>

#include "checkpoint/checkpointer.h"
#include "core/backend/ops.h"
#include "core/error.h"
#include "core/host.h"
#include "core/model.h"
#include "core/moe_layer.h"
#include "data/corpus.h"
#include "data/loader.h"
#include "launch/config.h"
#include "launch/faults.h"
#include "launch/heartbeat.h"
#include "launch/progress.h"
#include "launch/run_dir.h"
#include "launch/train_state.h"
#include "optim/adamw.h"
#include "optim/per_expert_clip.h"
#include "parallel/process_groups.h"
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

// A rough upper bound of the memory training needs (parameters with gradients and two moments,
// activations of one micro-batch), so an impossible size is refused by name instead of failing to allocate.
void check_memory(const Config& config) {
  const double V = double(config.model.vocab), D = double(config.model.d_model), L = double(config.model.layers),
               H = double(config.model.heads), F = double(config.model.ffn_hidden), T = double(config.train.seq_len),
               B = double(config.train.micro_batch);
  const MoeConfig& m = config.moe;
  const double E = double(m.num_experts), K = double(m.top_k), Fe = double(m.expert_hidden);
  const double ffn_params =
      m.num_experts > 0 ? 3 * D * Fe * (E + double(m.shared_experts)) + D * E + 3 * D * F : 3 * D * F;
  const double ffn_acts = m.num_experts > 0 ? K * (2 * D + 3 * Fe) + 2 * E + 3 * F : 3 * F;
  const double params = 2 * V * D + L * (4 * D * D + ffn_params);
  const double acts = B * T * (L * (10 * D + ffn_acts) + 3 * V + 8 * D) + L * B * H * T * T;
  const double bytes = 4.0 * (4 * params + 2 * acts);
  const double available = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (bytes > available)
    MOE_BAD_INPUT("the model and one micro-batch's activations need about "
                  << bytes / (1 << 30) << " GiB (model.vocab=" << config.model.vocab
                  << ", model.d_model=" << config.model.d_model << ", model.layers=" << config.model.layers
                  << ", train.micro_batch=" << config.train.micro_batch << ", train.seq_len=" << config.train.seq_len
                  << "), more than this machine's " << available / (1 << 30)
                  << " GiB; make the model or train.micro_batch smaller");
}

data::Corpus load_training_corpus(const Config& config) {
  data::Corpus corpus;
  if (config.data.sources.empty()) {
    corpus = data::embedded_corpus(config.data.heldout_fraction);
  } else {
    std::vector<data::SourceSpec> specs;
    for (const DataSourceConfig& s : config.data.sources) specs.push_back({s.name, s.path, s.weight});
    corpus = data::load_corpus(specs, config.data.heldout_fraction);
  }
  data::validate_corpus(corpus, config.train.seq_len, config.model.vocab);
  return corpus;
}

// A string of rank 0's, on every rank.
std::string broadcast_string(Communicator& world, const std::string& text) {
  int64_t n = int64_t(text.size());
  world.broadcast(&n, 1, 0);
  std::vector<int64_t> bytes(text.begin(), text.end());
  bytes.resize(size_t(n));
  world.broadcast(bytes.data(), n, 0);
  return std::string(bytes.begin(), bytes.end());
}

// The keys that fix the model's parameters: a checkpoint taken with other values cannot be loaded.
void check_checkpoint_fits(const ckpt::Manifest& m, const Config& config, const std::string& dir) {
  const nlohmann::json& then = m.config;
  const nlohmann::json& now = config.resolved;
  std::string diffs;
  for (const char* key : {"model.vocab", "model.d_model", "model.layers", "model.heads", "model.ffn_hidden",
                          "moe.num_experts", "moe.every", "moe.expert_hidden", "moe.shared_experts"}) {
    const nlohmann::json::json_pointer ptr("/" + std::regex_replace(std::string(key), std::regex("\\."), "/"));
    const nlohmann::json a = then.contains(ptr) ? then.at(ptr) : nlohmann::json(), b = now.at(ptr);
    if (a != b)
      diffs += std::string(diffs.empty() ? "" : ", ") + key + " = " + a.dump() + " there, " + b.dump() + " here";
  }
  if (!diffs.empty())
    MOE_BAD_INPUT("checkpoint " << dir << " does not fit this config: " << diffs
                                << "; resume with the model it was trained with, or start a new run (--resume none)");
}

MoeSettings moe_settings(const Config& config, int64_t layer) {
  const MoeConfig& m = config.moe;
  MoeSettings s;
  s.d_model = config.model.d_model;
  s.num_experts = m.num_experts, s.top_k = m.top_k, s.expert_hidden = m.expert_hidden;
  s.shared_experts = m.shared_experts, s.fallback_hidden = m.fallback_hidden;
  s.layers_total = config.model.layers, s.layer = layer;
  s.tau = m.router.tau;
  s.noise = m.router.noise == "gumbel" ? RouterNoise::Gumbel : RouterNoise::None;
  s.score = m.router.score == "sigmoid" ? RouterScore::Sigmoid : RouterScore::Softmax;
  s.normalize = m.router.normalize;
  s.capacity_factor = m.capacity_factor;
  s.drop_policy = m.drop_policy == "position" ? DropPolicy::Position : DropPolicy::Probs;
  s.overflow = m.overflow == "reroute" ? Overflow::Reroute : m.overflow == "dense" ? Overflow::Dense : Overflow::Drop;
  s.expert_dropout = m.expert_dropout;
  s.coef_aux = m.loss.aux, s.coef_z = m.loss.z, s.coef_entropy = m.loss.entropy, s.coef_death = m.loss.death;
  s.death_floor = m.loss.death_floor;
  return s;
}

// Runs check on rank 0 only (for example a look at the file system that rank 0 then changes) and makes
// every rank throw the same error, so no rank goes on alone into a collective.
void on_rank0_agree(Communicator& world, const std::function<void()>& check) {
  std::string message;
  int64_t kind = -1;
  if (world.rank() == 0) {
    try {
      check();
    } catch (const Error& e) {
      message = e.message();
      kind = int64_t(e.kind());
    }
  }
  int64_t header[2] = {kind, int64_t(message.size())};
  world.broadcast(header, 2, 0);
  if (header[0] < 0) return;
  std::vector<int64_t> bytes(message.begin(), message.end());
  bytes.resize(size_t(header[1]));
  world.broadcast(bytes.data(), header[1], 0);
  throw Error(ErrorKind(header[0]), __FILE__, __LINE__, std::string(bytes.begin(), bytes.end()));
}

// Layer l is an MoE layer when l % moe.every == moe.every - 1 (MODEL.md), else a dense SwiGLU MLP.
Model<float>::FfnFactory ffn_factory(const Config& config, int64_t ep_size, int64_t ep_rank) {
  return [config, ep_size, ep_rank](int64_t layer) -> std::unique_ptr<FeedForward<float>> {
    const MoeConfig& m = config.moe;
    if (m.num_experts > 0 && layer % m.every == m.every - 1) {
      MoeSettings s = moe_settings(config, layer);
      s.ep_size = ep_size, s.ep_rank = ep_rank;
      return std::make_unique<MoeLayer<float>>(cpu_ops<float>(), s);
    }
    return std::make_unique<DenseMlp<float>>(cpu_ops<float>(), config.model.d_model, config.model.ffn_hidden,
                                             config.model.layers);
  };
}

// One MoE layer's entry of the metrics line (CONTRACT.md).
nlohmann::json moe_metrics(const RouterStepStats& st) {
  double mean = 0, var = 0;
  for (int64_t c : st.tokens_per_expert) mean += double(c);
  mean /= double(st.tokens_per_expert.size());
  for (int64_t c : st.tokens_per_expert) var += (double(c) - mean) * (double(c) - mean);
  var /= double(st.tokens_per_expert.size());
  return {{"tokens_per_expert", st.tokens_per_expert},
          {"dropped", st.dropped},
          {"rerouted", st.rerouted},
          {"fallback", st.fallback},
          {"entropy", st.tokens > 0 ? st.entropy_sum / double(st.tokens) : 0.0},
          {"cv", mean > 0 ? std::sqrt(var) / mean : 0.0}};
}

struct EvalResult {
  double loss = 0;
  std::vector<std::pair<std::string, double>> by_source;
};

// Mean token loss over the first eval_sequences held-out windows of every source.
EvalResult evaluate(Model<float>& model, const data::Loader& loader, int64_t eval_sequences, int64_t micro_batch,
                    int64_t T) {
  EvalResult r;
  std::vector<int32_t> tokens(size_t(micro_batch * (T + 1)));
  double total = 0, total_tokens = 0;
  for (int32_t s = 0; s < loader.num_sources(); ++s) {
    const int64_t n = std::min(eval_sequences, loader.heldout_count(s));
    double source_loss = 0;
    for (int64_t start = 0; start < n; start += micro_batch) {
      const int64_t B = std::min(micro_batch, n - start);
      for (int64_t b = 0; b < B; ++b) loader.heldout_sequence(s, start + b, tokens.data() + b * (T + 1));
      model.set_context(false, 0, 0, 0.0, 0);
      source_loss += model.forward(tokens.data(), B);
    }
    r.by_source.emplace_back(loader.source_name(s), source_loss / double(n * T));
    total += source_loss;
    total_tokens += double(n * T);
  }
  r.loss = total / total_tokens;
  return r;
}

}  // namespace

int launcher_world_size() { return env_int("OMPI_COMM_WORLD_SIZE", env_int("PMI_SIZE", env_int("PMIX_SIZE", 1))); }
// MOE_RANKS_PER_NODE overrides it, to simulate several hosts on one machine (tests, demonstrations).
int launcher_local_size() {
  return env_int("MOE_RANKS_PER_NODE", env_int("OMPI_COMM_WORLD_LOCAL_SIZE", env_int("MPI_LOCALNRANKS", 1)));
}

namespace {

// Step statistics every rank contributes to: the LM loss sum, then per MoE layer the router losses and
// entropy (doubles) and the counts (integers). Summed over the data-parallel group.
struct StepTotals {
  std::vector<double> real;
  std::vector<int64_t> counts;
};

StepTotals gather_totals(double loss_sum, const std::vector<MoeLayer<float>*>& moe_layers) {
  StepTotals t;
  t.real.push_back(loss_sum);
  for (MoeLayer<float>* m : moe_layers) {
    const RouterStepStats& st = *m->router_stats();
    t.real.insert(t.real.end(), {st.aux, st.z, st.entropy_loss, st.death, st.entropy_sum});
    t.counts.insert(t.counts.end(), {st.dropped, st.rerouted, st.fallback, st.tokens, st.groups});
    t.counts.insert(t.counts.end(), st.tokens_per_expert.begin(), st.tokens_per_expert.end());
  }
  return t;
}

void scatter_totals(const StepTotals& t, const std::vector<MoeLayer<float>*>& moe_layers) {
  size_t r = 1, c = 0;
  for (MoeLayer<float>* m : moe_layers) {
    RouterStepStats& st = *m->router_stats();
    st.aux = t.real[r++], st.z = t.real[r++], st.entropy_loss = t.real[r++], st.death = t.real[r++];
    st.entropy_sum = t.real[r++];
    st.dropped = t.counts[c++], st.rerouted = t.counts[c++], st.fallback = t.counts[c++];
    st.tokens = t.counts[c++], st.groups = t.counts[c++];
    for (int64_t& n : st.tokens_per_expert) n = t.counts[c++];
  }
}

}  // namespace

TrainResult run_train(const TrainOptions& options, std::unique_ptr<Communicator> world) {
  if (!world) world = std::make_unique<SelfCommunicator>("world");
  // Everything that can be refused is checked before anything is written, identically on every rank.
  Config config = load_config(options.config_path, options.overrides);
  const RankGrid grid(
      {world->size(), config.parallel.tp, config.parallel.pp, config.parallel.dp, config.parallel.ep, 1},
      config.moe.num_experts);
  config.parallel.dp = grid.sizes().dp;
  const int64_t dp = grid.sizes().dp;
  const TrainConfig& tc = config.train;
  if (tc.global_batch % (dp * tc.micro_batch) != 0)
    MOE_BAD_INPUT("train.global_batch = " << tc.global_batch << " is not a multiple of the data-parallel size times "
                                          << "train.micro_batch = " << dp << " * " << tc.micro_batch << " = "
                                          << dp * tc.micro_batch
                                          << "; every data-parallel rank takes the same number of whole micro-batches");
  check_memory(config);
  const std::string run_dir =
      options.run_dir.empty() ? "runs/" + fs::path(options.config_path).stem().string() : options.run_dir;
  // An absolute checkpoint.dir replaces run_dir; with node-local roots "{node}" names this host.
  std::string ckpt_dir_text = config.checkpoint.dir;
  const int64_t ranks_per_node = std::max(1, launcher_local_size());
  const int64_t node = world->rank() / ranks_per_node;
  const bool node_leader = world->rank() % ranks_per_node == 0;
  for (size_t at; (at = ckpt_dir_text.find("{node}")) != std::string::npos;)
    ckpt_dir_text.replace(at, 6, std::to_string(node));
  const fs::path ckpt_root = fs::path(run_dir) / ckpt_dir_text;
  const bool node_local = config.checkpoint.node_local;
  if (node_local && options.resume != "auto" && options.resume != "none")
    MOE_BAD_INPUT("--resume " << options.resume
                              << " with checkpoint.node_local: a checkpoint is spread over the "
                                 "hosts' own disks; use --resume auto (or none)");
  std::optional<ckpt::DistributedChoice> distributed;
  std::vector<std::string> distributed_notes;
  if (node_local && options.resume == "auto")  // collective: every host says what its disk holds
    distributed = ckpt::find_newest_distributed(*world, ckpt_root.string(), node_leader, &distributed_notes);
  // Which checkpoint to continue from: rank 0 looks and verifies, every rank gets the same answer.
  std::string resume_dir;
  std::vector<std::string> resume_notes;
  on_rank0_agree(*world, [&] {
    if (node_local) {
      resume_notes = distributed_notes;
      if (distributed) resume_dir = (ckpt_root / distributed->dir_name).string();
      if (distributed) check_checkpoint_fits(distributed->chain.back(), config, resume_dir);
    } else if (options.resume == "auto") {
      if (auto found = ckpt::find_newest(ckpt_root.string(), config.checkpoint.replicas, &resume_notes))
        resume_dir = found->dir;
    } else if (options.resume != "none") {
      std::string why;
      if (!ckpt::verify_checkpoint(options.resume, config.checkpoint.replicas, &why))
        MOE_BAD_INPUT("--resume " << options.resume << ": " << why);
      resume_dir = options.resume;
    }
    if (resume_dir.empty()) {
      try {
        check_run_dir_usable(run_dir, options.overwrite);
      } catch (const Error& e) {
        std::string why;
        for (const std::string& note : resume_notes) why += "; " + note;
        if (why.empty()) throw;
        MOE_BAD_INPUT(e.message() << " (no checkpoint verifies" << why << ")");
      }
    } else if (!node_local) {
      check_checkpoint_fits(ckpt::read_manifest(resume_dir), config, resume_dir);
    }
  });
  resume_dir = broadcast_string(*world, resume_dir);
  const data::Corpus corpus = load_training_corpus(config);

  const int threads =
      tc.threads > 0 ? int(tc.threads) : std::max(1, int(std::thread::hardware_concurrency()) / launcher_local_size());
  set_compute_threads(threads);
  ProcessGroups groups = make_process_groups(std::move(world), grid);
  HeartbeatSender heartbeat(groups.rank, host_name(), config.fault);
  heartbeat.set(Phase::Setup, 0, "start-up");
  const bool leader = groups.rank == 0;
  const int64_t ep = config.parallel.ep;

  const ModelShape shape{config.model.vocab, config.model.d_model, config.model.layers, config.model.heads,
                         config.model.ffn_hidden};
  const int64_t T = tc.seq_len, micro = tc.micro_batch;
  const int64_t micro_batches = tc.global_batch / (dp * micro);  // per data-parallel rank
  const int64_t groups_per_step = tc.global_batch / micro;       // routing groups in the whole step
  Model<float> model(cpu_ops<float>(), shape, T, micro, tc.recompute == "full" ? Recompute::Full : Recompute::None,
                     ffn_factory(config, ep, groups.coords.ep));
  CommunicatorExchange exchange(*groups.ep);
  std::vector<MoeLayer<float>*> moe_layers;
  for (int64_t l = 0; l < model.num_layers(); ++l)
    if (auto* m = dynamic_cast<MoeLayer<float>*>(&model.ffn(l))) {
      m->set_exchange(&exchange);
      moe_layers.push_back(m);
    }
  model.init_params(tc.seed);
  // 256k floats (1 MB) per bucket: several buckets even for small models, so reduction overlaps backward.
  constexpr int64_t kBucketElements = 1 << 18;
  GradBuckets buckets(model.table(), *groups.dp, *groups.edp, kBucketElements, config.optim.zero);
  std::vector<Segment> owned = buckets.owned_dense();
  owned.insert(owned.end(), buckets.owned_expert().begin(), buckets.owned_expert().end());
  AdamW optimizer(
      model.table(),
      {config.optim.lr, config.optim.beta1, config.optim.beta2, config.optim.eps, config.optim.weight_decay}, owned);
  PerExpertClip per_expert_clip(model.table(), config.optim.per_expert_clip);
  const LrSchedule schedule{config.optim.lr, config.optim.min_lr, config.optim.warmup, tc.steps};
  const data::Loader loader(corpus, tc.seed, T);
  // Last step at which each expert of each MoE layer received a token, for the dead-expert count.
  std::vector<std::vector<int64_t>> last_used(moe_layers.size(),
                                              std::vector<int64_t>(size_t(config.moe.num_experts), -1));
  constexpr int64_t kDeadAfterSteps = 100;

  TrainState state;
  state.model = &model, state.optimizer = &optimizer, state.clip = &per_expert_clip, state.moe_layers = moe_layers;
  state.last_used = &last_used, state.groups = &groups, state.zero = config.optim.zero;
  int64_t start_step = 0;
  if (!resume_dir.empty()) {
    heartbeat.set(Phase::CheckpointLoad, 0, "loading the checkpoint");
    if (node_local) {
      ckpt::load_pieces_distributed(*groups.world, *distributed, checkpoint_pieces(state, false));
      start_step = distributed->chain.back().step;
    } else {
      std::string why;
      const auto resolved = ckpt::verify_checkpoint(resume_dir, config.checkpoint.replicas, &why);
      if (!resolved) MOE_FAIL("checkpoint " << resume_dir << " verified on rank 0 but not here: " << why);
      ckpt::load_pieces(*resolved, checkpoint_pieces(state, false));
      start_step = resolved->chain.back().step;
    }
    finish_load(state);
  }
  const int64_t resumed_step = start_step;

  std::unique_ptr<MetricsWriter> metrics;
  Progress progress(leader && !options.quiet, launcher_world_size() == 1 && !std::getenv("OMPI_COMM_WORLD_RANK"));
  const fs::path metrics_path = fs::path(run_dir) / "metrics.jsonl";
  if (node_local && node_leader && !leader && resume_dir.empty()) {
    std::error_code ec;
    fs::remove_all(ckpt_root, ec);  // this host's old checkpoints, as rank 0 does below for its own
  }
  if (leader) {
    if (resume_dir.empty()) {
      std::error_code ec;
      fs::remove_all(ckpt_root, ec);  // a fresh start (--overwrite): old checkpoints must not be resumed later
      write_run_files(run_dir, config, options.command_line, threads, grid);
      metrics = std::make_unique<MetricsWriter>(metrics_path.string());
    } else {
      // A checkpoint outside the run directory may be resumed into a new one: give it its run files.
      if (!fs::exists(fs::path(run_dir) / "config.json"))
        write_run_files(run_dir, config, options.command_line, threads, grid);
      // The lines after the checkpoint's step are rewritten by this run.
      std::vector<std::string> kept;
      std::ifstream in(metrics_path);
      for (std::string line; std::getline(in, line);) {
        try {
          if (nlohmann::json::parse(line).at("step").get<int64_t>() <= start_step) kept.push_back(line);
        } catch (const std::exception&) {
          // A line cut by a crash: dropped.
        }
      }
      in.close();
      metrics = std::make_unique<MetricsWriter>(metrics_path.string());
      for (const std::string& line : kept) metrics->write(nlohmann::json::parse(line));
    }
  }
  for (const std::string& note : resume_notes) progress.note("checkpoint: " + note);
  if (!resume_dir.empty()) progress.note("resuming from " + resume_dir + " at step " + std::to_string(start_step));

  std::unique_ptr<ckpt::Checkpointer> checkpointer;
  if (config.checkpoint.every > 0) {
    nlohmann::json info = {
        {"config", config.resolved},
        {"layout", {{"world", grid.sizes().world}, {"dp", dp}, {"ep", ep}, {"zero", config.optim.zero}}},
        {"versions", build_versions()}};
    checkpointer = std::make_unique<ckpt::Checkpointer>(
        ckpt::SaveSettings{ckpt_root.string(), config.checkpoint.keep, config.checkpoint.full_every,
                           config.checkpoint.async, config.checkpoint.replicas, config.checkpoint.peer_copy,
                           ranks_per_node, node_local},
        *groups.world, info, [leader](const std::string& text) {
          // Failures and fallbacks are always shown, whatever --quiet says.
          if (leader) std::fprintf(stderr, "moe: checkpoint: %s\n", text.c_str());
        });
  }
  std::string layout = std::to_string(grid.sizes().world) + (grid.sizes().world == 1 ? " rank" : " ranks");
  if (grid.sizes().world > 1)
    layout += " (dp " + std::to_string(dp) + ", ep " + std::to_string(ep) + (config.optim.zero ? ", ZeRO-1" : "") + ")";
  progress.note("moe train: " + std::to_string(model.num_params()) + " parameters per rank, " +
                std::to_string(tc.steps) + " steps of " + std::to_string(tc.global_batch * T) + " tokens on " + layout +
                ", " + std::to_string(threads) + " threads per rank; run directory " + run_dir);

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto interval_start = start;
  int64_t interval_tokens = 0;
  const double tokens_per_step = double(tc.global_batch * T);
  const double loss_scale = 1.0 / tokens_per_step;  // mean over all tokens of the global batch
  std::vector<int32_t> tokens(size_t(micro * (T + 1)));
  const int64_t first_sequence = groups.coords.dp * micro_batches * micro;  // this rank's slice of the batch

  FaultInjector faults(config.fault.inject, groups.rank, run_dir, ckpt_root.string());
  for (int64_t step = start_step; step < tc.steps; ++step) {
    heartbeat.set(Phase::Step, step, "training step (forward, backward, gradient reduction, update)");
    model.zero_grads();
    for (MoeLayer<float>* m : moe_layers) m->reset_stats();
    buckets.start(model.grads());
    double loss_sum = 0;
    for (int64_t mb = 0; mb < micro_batches; ++mb) {
      const int64_t seq0 = first_sequence + mb * micro;
      for (int64_t b = 0; b < micro; ++b) loader.train_sequence(step, seq0 + b, tokens.data() + b * (T + 1));
      // Router losses are averaged over the step's routing groups (micro-batches) on all ranks.
      model.set_context(true, step, seq0, 1.0 / double(groups_per_step), tc.seed);
      // Gradients are final during the last micro-batch's backward: reduce buckets as they complete.
      if (mb == micro_batches - 1)
        model.set_grad_ready_hook([&](int64_t first, int64_t end) { buckets.mark_ready(first, end); });
      loss_sum += model.forward(tokens.data(), micro);
      model.backward(loss_scale);
      model.set_grad_ready_hook(nullptr);
    }
    buckets.finish();

    StepTotals totals = gather_totals(loss_sum, moe_layers);
    groups.dp->allreduce_sum(totals.real.data(), int64_t(totals.real.size()));
    groups.dp->allreduce_sum(totals.counts.data(), int64_t(totals.counts.size()));
    scatter_totals(totals, moe_layers);
    const double lm_loss = totals.real[0] * loss_scale;
    double aux = 0, zl = 0, ent = 0, death = 0;
    for (MoeLayer<float>* m : moe_layers) {
      const RouterStepStats& st = *m->router_stats();
      aux += st.aux / double(st.groups), zl += st.z / double(st.groups);
      ent += st.entropy_loss / double(st.groups), death += st.death / double(st.groups);
    }
    const double loss = lm_loss + aux + zl + ent + death;
    if (!std::isfinite(loss))
      MOE_FAIL("the loss became " << loss << " at step " << step + 1 << "; lower optim.lr or raise optim.warmup");

    // Per-expert clipping: an expert's gradient lives on one expert-parallel rank, sliced over the
    // expert-data-parallel group under ZeRO.
    int64_t experts_clipped = 0;
    if (config.optim.per_expert_clip > 0) {
      const std::vector<Segment>* mine = config.optim.zero ? &buckets.owned_expert() : nullptr;
      std::vector<double> ss = per_expert_clip.sum_squares(model.grads(), mine);
      if (config.optim.zero) groups.edp->allreduce_sum(ss.data(), int64_t(ss.size()));
      experts_clipped = per_expert_clip.clip(model.grads(), ss, mine);
      groups.ep->allreduce_sum(&experts_clipped, 1);
    }
    // Global norm: dense gradients are replicated over dp (or sliced under ZeRO), expert gradients are
    // spread over ep (and sliced over edp under ZeRO).
    double dense_ss = sum_squares(model.grads(), buckets.owned_dense());
    double expert_ss = sum_squares(model.grads(), buckets.owned_expert());
    if (config.optim.zero) {
      groups.dp->allreduce_sum(&dense_ss, 1);
      groups.edp->allreduce_sum(&expert_ss, 1);
    }
    groups.ep->allreduce_sum(&expert_ss, 1);
    const double grad_norm = std::sqrt(dense_ss + expert_ss);
    if (config.optim.clip > 0 && grad_norm > config.optim.clip)
      scale_segments(model.grads(), owned, float(config.optim.clip / grad_norm));
    const double lr = schedule.at(step);
    optimizer.step(model.params(), model.grads(), lr);
    buckets.allgather_params(model.params());

    int64_t dead = 0;
    for (size_t i = 0; i < moe_layers.size(); ++i) {
      const RouterStepStats& st = *moe_layers[i]->router_stats();
      moe_layers[i]->update_balancing_bias(st.tokens_per_expert, config.moe.router.bias_balance_rate);
      for (size_t e = 0; e < st.tokens_per_expert.size(); ++e) {
        if (st.tokens_per_expert[e] > 0) last_used[i][e] = step;
        dead += step - last_used[i][e] >= kDeadAfterSteps;
      }
    }
    interval_tokens += int64_t(tokens_per_step);

    const int64_t done = step + 1;
    double ckpt_stall = 0;
    if (checkpointer) {
      checkpointer->poll();
      if (done % config.checkpoint.every == 0 || done == tc.steps) {
        heartbeat.set(Phase::CheckpointSave, done, "checkpoint save");
        ckpt_stall = checkpointer->save(done, checkpoint_pieces(state, true));
      }
    }
    if (leader && (done % tc.log_every == 0 || done == 1 || done == tc.steps)) {
      const auto now = Clock::now();
      const double interval_s = std::chrono::duration<double>(now - interval_start).count();
      const double elapsed_s = std::chrono::duration<double>(now - start).count();
      const double tokens_per_s = interval_s > 0 ? double(interval_tokens) / interval_s : 0.0;
      nlohmann::json moe = nlohmann::json::array();
      for (MoeLayer<float>* m : moe_layers) moe.push_back(moe_metrics(*m->router_stats()));
      nlohmann::json line = {{"step", done},
                             {"loss", loss},
                             {"lm_loss", lm_loss},
                             {"aux_loss", aux},
                             {"z_loss", zl},
                             {"entropy_loss", ent},
                             {"death_loss", death},
                             {"lr", lr},
                             {"grad_norm", grad_norm},
                             {"experts_clipped", experts_clipped},
                             {"dead_experts", dead},
                             {"tokens", int64_t(done * tokens_per_step)},
                             {"tokens_per_s", tokens_per_s},
                             {"elapsed_s", elapsed_s},
                             {"comm_wait_s", buckets.last_wait_seconds()},
                             {"ckpt_stall_s", ckpt_stall},
                             {"moe", moe}};
      metrics->write(line);
      const double eta = elapsed_s / double(done - resumed_step) * double(tc.steps - done);
      progress.step(done, tc.steps, loss, lr, tokens_per_s, eta, moe_layers.empty() ? -1 : dead);
      interval_start = now;
      interval_tokens = 0;
    }
    const bool last = done == tc.steps;
    if ((tc.eval_every > 0 && done % tc.eval_every == 0) || last) {
      // Every rank evaluates the same windows: expert-parallel forwards must run in lockstep.
      heartbeat.set(Phase::Eval, done, "evaluation");
      const EvalResult ev = evaluate(model, loader, tc.eval_sequences, micro, T);
      if (leader) {
        nlohmann::json by_source = nlohmann::json::object();
        std::string text = "eval step " + std::to_string(done) + ": loss " + std::to_string(ev.loss) + " (";
        for (size_t i = 0; i < ev.by_source.size(); ++i) {
          by_source[ev.by_source[i].first] = ev.by_source[i].second;
          text += (i ? ", " : "") + ev.by_source[i].first + " " + std::to_string(ev.by_source[i].second);
        }
        metrics->write({{"step", done}, {"eval_loss", ev.loss}, {"eval_loss_by_source", by_source}});
        progress.note(text + ")");
      }
      interval_start = Clock::now();  // evaluation time does not count against training throughput
    }
    for (const FaultInjection& f : config.fault.inject)  // the newest checkpoint must exist before it is corrupted
      if (f.kind == "corrupt_checkpoint" && f.step == done && checkpointer) checkpointer->finish();
    faults.after_step(done);
    if (options.stop_after_step > 0 && done == options.stop_after_step) {
      if (checkpointer) checkpointer->finish();
      progress.note("stopping after step " + std::to_string(done) + " (--stop-after-step)");
      break;
    }
  }
  heartbeat.set(Phase::CheckpointSave, tc.steps, "final checkpoint");
  if (checkpointer) {
    checkpointer->finish();
    const auto& r = checkpointer->last_report();
    if (r.step >= 0)
      progress.note("checkpoint: newest is step " + std::to_string(r.step) + " (" + r.kind + ", " +
                    std::to_string(r.bytes) + " bytes, written in " + std::to_string(r.write_s) + " s, stall " +
                    std::to_string(r.stall_s) + " s)");
  }
  progress.finish();
  const double total_s = std::chrono::duration<double>(Clock::now() - start).count();
  progress.note("done in " + format_duration(total_s) + "; metrics in " +
                (fs::path(run_dir) / "metrics.jsonl").string());

  TrainResult result;
  if (options.collect_parameters)
    for (const ParamSpec& spec : model.table().specs()) {
      std::vector<float>& full = result.parameters[spec.name];
      const float* mine = model.params() + spec.offset;
      if (spec.global_rows > 0 && groups.ep->size() > 1) {  // expert shards, in ep-rank order
        full.resize(size_t(spec.numel * groups.ep->size()));
        groups.ep->allgather(mine, full.data(), spec.numel);
      } else {
        full.assign(mine, mine + spec.numel);
      }
    }
  return result;
}

}  // namespace moe
