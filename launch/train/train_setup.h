// Setting up one rank of training, in the order that keeps every refusal before any write: the config
// and the layout checked, the paths worked out, the data loaded, then the process groups, the model and
// everything that trains it. Not here: choosing and loading a checkpoint (launch/train/resume.h), the step
// (launch/train/train_step.h), metrics and evaluation (launch/train/train_metrics.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/moe_layer.h"
#include "data/corpus.h"
#include "data/loader.h"
#include "launch/config/config.h"
#include "launch/run/trace.h"
#include "launch/train/train_options.h"
#include "launch/train/train_state.h"
#include "optim/adamw.h"
#include "optim/per_expert_clip.h"
#include "parallel/flight_recorder.h"
#include "parallel/grad_buckets.h"
#include "parallel/pipeline.h"
#include "parallel/process_groups.h"
#include "parallel/rank_grid.h"

namespace moe {

// Where this rank's run lives. An absolute checkpoint.dir replaces run_dir; with node-local roots
// "{node}" in checkpoint.dir names this rank's host.
struct TrainPaths {
  std::string run_dir;
  std::filesystem::path ckpt_root;
  int64_t ranks_per_node = 1;
  int64_t node = 0;
  bool node_leader = true;  // the first rank of its host
};

// The config, loaded and checked against the world size (layout, batch divisibility, memory).
struct CheckedConfig {
  Config config;
  RankGrid grid;
};
CheckedConfig load_checked_config(const TrainOptions& options, int64_t world_size);
TrainPaths train_paths(const TrainOptions& options, const Config& config, int64_t world_rank);
data::Corpus load_training_corpus(const Config& config);
// MOE_CHECK_DEVICE_MEMORY=1: train on the CPU backend as if its memory were a GPU's (core/backend/memory_check.h).
bool device_memory_check_requested();
// The planes of the process groups for `backend` (ProcessGroups::data): NCCL communicators on the CUDA
// backend; checked communicators on both planes on the memory-checking backend; the groups themselves on the
// CPU. Collective over every group.
void attach_planes(ProcessGroups& groups, Backend& backend);
// The MoE layer `layer` of the config, before the layout's share (ep, tp) is set: what every MoE layer computes.
MoeSettings moe_settings(const Config& config, int64_t layer);
// data.schedule with one weight per source of the corpus, in its order (names checked with the config).
data::MixSchedule training_schedule(const Config& config, const data::Corpus& corpus);

// Everything one rank trains with, built once, in the order the members are listed. Construction takes
// the world communicator, allocates and initialises the parameters through `backend`, and writes nothing.
struct Trainer {
  Trainer(CheckedConfig checked, TrainPaths paths, const data::Corpus& corpus, std::unique_ptr<Communicator> world,
          Backend& backend);
  // Leaves the backend as it found it: no parameters' memory (Ops::set_parameter_memory).
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  Config config;
  RankGrid grid;
  TrainPaths paths;
  Backend& backend;
  int threads = 1;
  // The rank's flight recorder (parallel/flight_recorder.h), read by the heartbeat; every communicator writes to it.
  std::shared_ptr<FlightRecorder> flight = std::make_shared<FlightRecorder>();
  ProcessGroups groups;
  Tracer tracer;
  // With several chunks (parallel.vpp > 1) the chunks' parameters, gradients and table, shared by them
  // (Model::share_parameters): the one table the optimizer, buckets and checkpoint see.
  struct ChunkParameters {
    ParamTable table;
    Buffer params, grads;
  } chunk_parameters;
  // This rank's model chunks: one, its pipeline stage (the whole model when parallel.pp = 1), or with
  // parallel.vpp = V > 1, V chunks, chunk c holding virtual stage c * pp + coords.pp (docs/parallel.md
  // "Interleaved stages").
  std::vector<std::unique_ptr<Model<float>>> chunks;
  // Chunk 0, which answers for the rank's parameters: table(), params(), grads() and num_params() are every
  // chunk's. Forward, backward and contexts are each chunk's own.
  Model<float>* model = nullptr;
  std::unique_ptr<PipelineExecutor<float>> pipeline;  // parallel.pp > 1: the stage's (interleaved) 1F1B schedule
  std::unique_ptr<CommunicatorExchange> exchange;
  std::unique_ptr<TracedExchange> traced_exchange;      // train.trace: the MoE layers' exchange, timed
  std::unique_ptr<CommunicatorTokenGroup> token_group;  // MoE routing groups split over the tp ranks
  std::vector<MoeLayer<float>*> moe_layers;             // the stage's
  // Per entry of moe_layers: its index among the whole model's MoE layers (model_moe_layers of them).
  std::vector<int64_t> moe_index;
  int64_t model_moe_layers = 0;
  // Every MoE layer's statistics of the last step, the whole model's (gathered over the pipeline stages).
  std::vector<RouterStepStats> model_stats;
  std::unique_ptr<GradBuckets> buckets;
  std::vector<Segment> owned;  // the gradient slices this rank clips and updates
  std::unique_ptr<AdamW> optimizer;
  std::unique_ptr<PerExpertClip> clip;
  LrSchedule schedule;
  std::unique_ptr<data::Loader> loader;
  nlohmann::json data_provenance;  // data::data_provenance of the corpus: run manifest and checkpoints
  TrainState state;
  // Nothing but the last optimizer step wrote the parameters since the step's forward: the backend's rounded copy
  // of them is current (Ops::adamw_update keeps it), so the next forward need not drop it. False until the first
  // update (the initialisation or a load wrote them).
  bool parameters_only_updated = false;

  int64_t micro_batches() const;    // per data-parallel rank and step
  int64_t tokens_per_step() const;  // the global batch
  int64_t first_sequence() const;   // this rank's slice of the global batch
  bool leader() const { return groups.rank == 0; }
};

}  // namespace moe
