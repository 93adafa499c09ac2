// Setting up one rank of training: checks first, then the model and what trains it.
#include "launch/train/train_setup.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/backend/backend.h"
#include "core/backend/cpu/thread_policy.h"
#include "core/backend/cuda_backend.h"
#include "core/backend/memory_check.h"
#include "core/error.h"
#include "core/mla_attention.h"
#include "launch/config/memory.h"
#include "launch/train/trainer.h"
#include "parallel/nccl_communicator.h"
#include "parallel/plane_check.h"
#include "parallel/self_communicator.h"
#include "parallel/tp_layers.h"

namespace moe {
namespace fs = std::filesystem;

namespace {

// The memory this host's ranks need (launch/config/memory.h) against the machine's, so an impossible size is
// refused by name before anything is allocated instead of failing to allocate halfway.
// What one rank may use: this host's memory shared by its ranks, or its GPU's (shared by the ranks on it).
struct MemoryPlace {
  double bytes = 0;
  int64_t ranks = 1;  // ranks sharing it
  std::string name;
};
MemoryPlace memory_of_this_rank(const Config& config, const RankGrid& grid) {
  const int64_t ranks_here = std::min<int64_t>(std::max(1, launcher_local_size()), grid.sizes().world);
  if (config.train.device == Device::Cuda) {
    const int devices = std::max(1, cuda_device_count()), device = launcher_local_rank() % devices;
    return {double(cuda_device_memory_bytes(device)), (ranks_here + devices - 1) / devices,
            "GPU " + std::to_string(device) + "'s"};
  }
  return {double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)), ranks_here, "this machine's"};
}

void check_memory(const Config& config, const RankGrid& grid) {
  const GridSizes& sizes = grid.sizes();
  const MemoryEstimate need = largest_stage_estimate(config, sizes.tp, sizes.dp, sizes.ep).memory;
  const MemoryPlace place = memory_of_this_rank(config, grid);
  // bf16 GEMMs keep the parameters rounded beside them: in fp32 on the CPU, counted here; in bf16 on a GPU, in the
  // estimate's device_workspace (docs/gpu.md).
  const double rounded_copy = host_rounded_parameter_bytes(config, need);
  const double total = double(need.total()) + rounded_copy;
  if (place.bytes <= 0 || total * double(place.ranks) <= place.bytes) return;
  const ModelConfig& m = config.model;
  const TrainConfig& tc = config.train;
  const std::string shared = place.ranks > 1 ? " on each of its " + std::to_string(place.ranks) + " ranks" : "";
  MOE_BAD_INPUT("training needs about "
                << format_bytes(total) << " per rank (" << memory_text(need)
                << (rounded_copy > 0
                        ? "; and " + format_bytes(rounded_copy) + " of the parameters rounded for bf16 GEMMs"
                        : std::string())
                << ")" << shared << ", more than " << place.name << " " << format_bytes(place.bytes)
                << " (model.vocab=" << m.vocab << ", model.d_model=" << m.d_model << ", model.layers=" << m.layers
                << ", model.ffn_hidden=" << m.ffn_hidden << ", moe.num_experts=" << config.moe.num_experts
                << ", moe.expert_hidden=" << config.moe.expert_hidden << ", train.micro_batch=" << tc.micro_batch
                << ", train.seq_len=" << tc.seq_len << ", train.recompute=" << to_string(tc.recompute)
                << "); make the model or train.micro_batch smaller"
                << (tc.recompute == Recompute::Full ? "" : ", set train.recompute=full")
                << ", or spread the model over more ranks (parallel.tp, parallel.ep, optim.zero)");
}

}  // namespace

MoeSettings moe_settings(const Config& config, int64_t layer) {
  const MoeConfig& m = config.moe;
  MoeSettings s;
  s.d_model = config.model.d_model;
  s.num_experts = m.num_experts, s.top_k = m.top_k, s.expert_hidden = m.expert_hidden;
  s.shared_experts = m.shared_experts, s.fallback_hidden = m.fallback_hidden;
  s.layers_total = config.model.layers, s.layer = layer;
  s.tau = m.router.tau_at(0);
  s.tau_learned = m.router.tau_learned, s.tau_min = m.router.tau_min, s.tau_max = m.router.tau_max;
  s.coef_warmup = m.router.warmup_coef, s.warmup_steps = m.router.warmup_steps;
  s.noise = m.router.noise, s.score = m.router.score;
  s.normalize = m.router.normalize;
  s.capacity_factor = m.capacity_factor;
  s.capacity_auto = m.capacity_auto.enabled;
  s.drop_policy = m.drop_policy, s.dispatcher = m.dispatcher, s.overflow = m.overflow_policy();
  s.expert_dropout = m.expert_dropout;
  s.coef_aux = m.loss.aux, s.coef_z = m.loss.z, s.coef_entropy = m.loss.entropy, s.coef_death = m.loss.death;
  s.death_floor = m.loss.death_floor;
  return s;
}

namespace {

// Layer l is an MoE layer when l % moe.every == moe.every - 1 (docs/model.md), else a dense SwiGLU MLP;
// over tp > 1 ranks both are split as parallel/tp_layers.h says.
MoeSettingsOf moe_layers(const Config& config, const ProcessGroups& groups) {
  return [config, ep_rank = groups.coords.ep](int64_t layer) -> std::optional<MoeSettings> {
    const MoeConfig& m = config.moe;
    if (m.num_experts == 0 || layer % m.every != m.every - 1) return std::nullopt;
    MoeSettings s = moe_settings(config, layer);
    s.ep_size = config.parallel.ep, s.ep_rank = ep_rank;
    s.expert_tp = config.parallel.expert_tp;
    s.overlap_exchange = config.parallel.ep_overlap;
    return s;
  };
}

// Threads per rank: train.threads, or this node's cores shared by its ranks.
int set_threads(Backend& backend, const TrainConfig& tc) {
  const int threads = tc.threads > 0 ? int(tc.threads) : std::max(1, cpu::usable_cores() / launcher_local_size());
  backend.set_threads(threads);
  return threads;
}

// Multi-head latent attention (model.attention = mla; tp = 1, checked with the config), else the multi-head
// attention of the layout (split over the tp ranks, or the model's default).
Model<float>::AttentionFactory attention_factory(Trainer& t, const ModelShape& shape, const TpContext& tp) {
  const ModelConfig& m = t.config.model;
  const int64_t seq_len = t.config.train.seq_len;
  if (m.attention != AttentionKind::Mla) return tp_attention_factory<float>(t.backend, tp, shape, seq_len);
  Backend* backend = &t.backend;
  const MlaShape mla{m.mla_kv_rank, m.mla_q_rank, m.mla_rope_dim, m.mla_norms};
  return [backend, shape, seq_len, mla](int64_t) -> std::unique_ptr<Attention<float>> {
    return std::make_unique<MlaAttention<float>>(*backend, shape.d_model, shape.heads, seq_len, shape.layers, mla);
  };
}

// The layers [first, last) of each of this rank's chunks, with the embedding on the first virtual stage and
// the head on the last: stage_layers(...)[coords.pp] with one chunk; with parallel.vpp = V chunks, the layers
// cut into pp * V equal blocks and chunk c holding block c * pp + coords.pp. The whole model when pp = 1.
std::vector<StageSpec> chunk_specs(const Config& config, int64_t stage) {
  const int64_t pp = config.parallel.pp, V = config.parallel.vpp;
  if (pp == 1) return {StageSpec{}};
  if (V == 1) {
    const auto [first, last] = stage_layers(config.model.layers, pp, config.parallel.pp_layers)[size_t(stage)];
    return {StageSpec{first, last, stage == 0, stage == pp - 1}};
  }
  const std::vector<std::pair<int64_t, int64_t>> blocks = stage_layers(config.model.layers, pp * V);
  std::vector<StageSpec> specs;
  for (int64_t c = 0; c < V; ++c) {
    const int64_t v = virtual_stage(pp, stage, c);
    specs.push_back({blocks[size_t(v)].first, blocks[size_t(v)].second, v == 0, v == pp * V - 1});
  }
  return specs;
}

// Chunks of one rank share one parameter table and pair of buffers, the chunks' specs in chunk order. Each chunk
// gives back its own pair first, so that the rank never holds both (the memory estimate counts the shared pair).
void share_chunk_parameters(Trainer& t) {
  if (t.chunks.size() == 1) return;
  Trainer::ChunkParameters& shared = t.chunk_parameters;
  std::vector<int64_t> first_spec;
  for (const auto& chunk : t.chunks) {
    first_spec.push_back(int64_t(shared.table.specs().size()));
    for (const ParamSpec& spec : chunk->table().specs()) shared.table.add(spec);
    chunk->release_parameters();
  }
  shared.params = t.backend.allocate(DType::F32, shared.table.numel());
  shared.grads = t.backend.allocate(DType::F32, shared.table.numel());
  for (size_t c = 0; c < t.chunks.size(); ++c)
    t.chunks[c]->share_parameters(shared.table, first_spec[c], shared.params.data<float>(), shared.grads.data<float>());
}

// The MoE layers of this rank's chunks, in the whole model's order, wired to the expert all-to-all.
void wire_moe_layers(Trainer& t, const MoeSettingsOf& moe_of) {
  t.exchange = std::make_unique<CommunicatorExchange>(*t.groups.ep, *t.groups.data.ep);
  if (t.config.train.trace) t.traced_exchange = std::make_unique<TracedExchange>(*t.exchange, t.tracer);
  ExpertExchange* exchange =
      t.traced_exchange ? static_cast<ExpertExchange*>(t.traced_exchange.get()) : t.exchange.get();
  t.token_group = std::make_unique<CommunicatorTokenGroup>(*t.groups.tp, *t.groups.data.tp);
  for (int64_t l = 0; l < t.config.model.layers; ++l) {
    if (!moe_of(l)) continue;
    for (const auto& chunk : t.chunks) {
      if (l < chunk->first_layer() || l >= chunk->end_layer()) continue;
      MoeLayer<float>* m = moe_layer_of(chunk->ffn(l));
      MOE_CHECK(m, "layer " << l << " was built as an MoE layer");
      m->set_exchange(exchange);
      m->set_token_group(t.token_group.get());
      t.moe_layers.push_back(m);
      t.moe_index.push_back(t.model_moe_layers);
    }
    ++t.model_moe_layers;
  }
}

// This rank's chunks of the model (chunk_specs), with their MoE layers wired to the expert all-to-all,
// initialised from the seed, and the pipeline schedule that runs them.
void build_model(Trainer& t) {
  const Config& config = t.config;
  const TrainConfig& tc = config.train;
  const ModelShape shape{config.model.vocab, config.model.d_model,    config.model.layers,
                         config.model.heads, config.model.ffn_hidden, config.model.kv_heads};
  const int64_t pp = config.parallel.pp, stage = t.groups.coords.pp, V = config.parallel.vpp;
  const TpContext tp{t.groups.data.tp, config.parallel.sequence_parallel};
  const MoeSettingsOf moe_of = moe_layers(config, t.groups);
  const std::vector<StageSpec> specs = chunk_specs(config, stage);
  for (int64_t c = 0; c < int64_t(specs.size()); ++c) {
    const int slots = pp > 1 ? int(pipeline_slots(PipeSchedule::OneFOneB, pp, stage, t.micro_batches(), V, c)) : 1;
    t.chunks.push_back(std::make_unique<Model<float>>(
        t.backend, ModelOptions<float>{
                       .shape = shape,
                       .seq_len = tc.seq_len,
                       .max_batch = tc.micro_batch,
                       .recompute = RecomputeSpec(tc.recompute, tc.recompute_layers),
                       .ffn_factory = tp_ffn_factory<float>(t.backend, tp, shape, moe_of),
                       .num_slots = slots,
                       .stage = specs[size_t(c)],
                       .attention_factory = attention_factory(t, shape, tp),
                       .tp = tensor_parallel_layout<float>(t.backend, tp, shape),
                       .precision = tc.precision,
                       .loss_sections = t.micro_batches(),
                   }));
  }
  t.model = t.chunks[0].get();
  share_chunk_parameters(t);
  wire_moe_layers(t, moe_of);
  t.model->init_params(tc.seed);
  if (pp == 1) return;
  std::vector<Model<float>*> chunks;
  for (const auto& chunk : t.chunks) chunks.push_back(chunk.get());
  t.pipeline = std::make_unique<PipelineExecutor<float>>(chunks, *t.groups.data.pp, PipeSchedule::OneFOneB,
                                                         t.micro_batches(), tc.micro_batch, tc.seq_len);
}

}  // namespace

bool device_memory_check_requested() {
  const char* v = std::getenv("MOE_CHECK_DEVICE_MEMORY");
  return v && std::string(v) == "1";
}

void attach_planes(ProcessGroups& groups, Backend& backend) {
  if (auto* checked = dynamic_cast<MemoryCheckBackend*>(&backend)) {
    const BackendMemoryView memory = memory_view(*checked);
    attach_data_plane(groups, [&](Communicator& c) { return make_plane_check(Plane::Data, c, memory); });
    for (std::unique_ptr<Communicator>* c :
         {&groups.world, &groups.dp, &groups.ep, &groups.edp, &groups.tp, &groups.pp, &groups.etp, &groups.mp})
      *c = make_plane_check(Plane::Control, std::move(*c), memory);
    return;
  }
  if (backend.memory_is_host()) return;
  // One NCCL communicator per group of two or more, made on every rank in the same order (each is collective
  // over its group); a group of one copies through the backend.
  attach_data_plane(groups, [&](Communicator& c) -> std::unique_ptr<Communicator> {
    if (c.size() == 1) return std::make_unique<SelfCommunicator>(c.name(), &backend);
    return make_nccl_communicator(c, backend);
  });
}

CheckedConfig load_checked_config(const TrainOptions& options, int64_t world_size) {
  Config config = load_config(options.config_path, options.overrides);
  RankGrid grid({world_size, config.parallel.tp, config.parallel.pp, config.parallel.dp, config.parallel.ep,
                 config.parallel.expert_tp},
                config.moe.num_experts);
  config.parallel.dp = grid.sizes().dp;
  const int64_t dp = grid.sizes().dp;
  const TrainConfig& tc = config.train;
  if (tc.global_batch % (dp * tc.micro_batch) != 0)
    MOE_BAD_INPUT("train.global_batch = " << tc.global_batch << " is not a multiple of the data-parallel size times "
                                          << "train.micro_batch = " << dp << " * " << tc.micro_batch << " = "
                                          << dp * tc.micro_batch
                                          << "; every data-parallel rank takes the same number of whole micro-batches");
  const int64_t micro_batches = tc.global_batch / (dp * tc.micro_batch), pp = config.parallel.pp;
  if (pp > 1 && micro_batches < pp)
    MOE_BAD_INPUT("train.global_batch = " << tc.global_batch << " gives each data-parallel rank " << micro_batches
                                          << " micro-batch" << (micro_batches == 1 ? "" : "es")
                                          << " of train.micro_batch = " << tc.micro_batch
                                          << " per step (data-parallel size " << dp
                                          << "), fewer than the parallel.pp = " << pp << " pipeline stages; at least "
                                          << pp << " are needed to fill the pipeline: raise train.global_batch to "
                                          << pp * dp * tc.micro_batch << " or more, or lower train.micro_batch");
  if (config.parallel.vpp > 1 && micro_batches % pp != 0)
    MOE_BAD_INPUT("parallel.pp_schedule = interleaved_1f1b with parallel.vpp = "
                  << config.parallel.vpp << ": train.global_batch = " << tc.global_batch << " gives each data-parallel "
                  << "rank " << micro_batches << " micro-batches of train.micro_batch = " << tc.micro_batch
                  << " per step (data-parallel size " << dp << "); expected a multiple of parallel.pp = " << pp
                  << " (the schedule runs the micro-batches in groups of one per stage)");
  check_memory(config, grid);  // against this host's memory, or the GPU's on train.device = "cuda"
  return {std::move(config), std::move(grid)};
}

TrainPaths train_paths(const TrainOptions& options, const Config& config, int64_t world_rank) {
  TrainPaths p;
  p.run_dir = options.run_dir.empty() ? "runs/" + fs::path(options.config_path).stem().string() : options.run_dir;
  std::string ckpt_dir_text = config.checkpoint.dir;
  p.ranks_per_node = std::max(1, launcher_local_size());
  p.node = world_rank / p.ranks_per_node;
  p.node_leader = world_rank % p.ranks_per_node == 0;
  for (size_t at; (at = ckpt_dir_text.find("{node}")) != std::string::npos;)
    ckpt_dir_text.replace(at, 6, std::to_string(p.node));
  p.ckpt_root = fs::path(p.run_dir) / ckpt_dir_text;
  return p;
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

data::MixSchedule training_schedule(const Config& config, const data::Corpus& corpus) {
  data::MixSchedule schedule;
  for (const SchedulePointConfig& p : config.data.schedule) {
    data::SchedulePoint point{p.step, std::vector<double>(corpus.sources.size(), 0.0)};
    for (const auto& [name, weight] : p.weights)
      for (size_t s = 0; s < corpus.sources.size(); ++s)
        if (corpus.sources[s].name == name) point.weights[s] = weight;
    schedule.push_back(std::move(point));
  }
  return schedule;
}

int64_t Trainer::micro_batches() const {
  return config.train.global_batch / (grid.sizes().dp * config.train.micro_batch);
}
Trainer::~Trainer() { backend.ops<float>().set_parameter_memory(nullptr, 0); }
int64_t Trainer::tokens_per_step() const { return config.train.global_batch * config.train.seq_len; }
int64_t Trainer::first_sequence() const { return groups.coords.dp * micro_batches() * config.train.micro_batch; }

Trainer::Trainer(CheckedConfig checked, TrainPaths paths_in, const data::Corpus& corpus,
                 std::unique_ptr<Communicator> world, Backend& backend_in)
    : config(std::move(checked.config)),
      grid(std::move(checked.grid)),
      paths(std::move(paths_in)),
      backend(backend_in),
      threads(set_threads(backend, config.train)),
      groups(make_process_groups(std::move(world), grid)),
      tracer(config.train.trace, config.train.trace_from, config.train.trace_steps) {
  const TrainConfig& tc = config.train;
  attach_planes(groups, backend);
  install_flight_recorder(groups, flight);  // every communicator, before anything holds one
  build_model(*this);
  // bf16 GEMMs read the weights from one rounded copy per step (train_step and evaluate say when the
  // parameters changed). MOE_BF16_WEIGHT_COPY=0 rounds them at every GEMM instead: the same bits, a check.
  const char* copy = std::getenv("MOE_BF16_WEIGHT_COPY");
  if (!(copy && std::string(copy) == "0"))
    backend.ops<float>().set_parameter_memory(model->params(), model->num_params());
  // 256k floats (1 MB) per bucket: several buckets even for small models, so reduction overlaps backward.
  constexpr int64_t kBucketElements = 1 << 18;
  buckets = std::make_unique<GradBuckets>(backend, model->table(), *groups.data.dp, *groups.data.edp, kBucketElements,
                                          config.optim.zero);
  owned = buckets->owned_dense();
  owned.insert(owned.end(), buckets->owned_expert().begin(), buckets->owned_expert().end());
  optimizer = std::make_unique<AdamW>(backend, model->table(),
                                      AdamWSettings{config.optim.lr, config.optim.beta1, config.optim.beta2,
                                                    config.optim.eps, config.optim.weight_decay},
                                      owned, config.optim.zero);
  clip = std::make_unique<PerExpertClip>(model->table(), config.optim.per_expert_clip, &backend);
  schedule = LrSchedule{config.optim.lr, config.optim.min_lr, config.optim.warmup, tc.steps};
  loader = std::make_unique<data::Loader>(corpus, tc.seed, tc.seq_len, training_schedule(config, corpus));
  data_provenance = data::data_provenance(corpus);
  // Every part with checkpoint state, in the order a checkpoint lists their pieces. The data loader and the
  // random streams are pure functions of the step (the optimizer's), so they have none of their own.
  state.components = {model, optimizer.get()};
  state.components.insert(state.components.end(), moe_layers.begin(), moe_layers.end());
  state.components.push_back(clip.get());
  state.groups = &groups;
}

}  // namespace moe
