// The pipeline executor: one optimizer step's micro-batches through this rank's stage of the model, by its
// list of actions (parallel/pp_schedule.h) over the pipeline-parallel group. Activations go to the next
// stage and gradients to the previous one by nonblocking sends, each from a per-slot buffer that is kept
// until that slot sends again or the step ends; receives block. The stage is a Model holding layers
// [first, last) with the embedding on the first stage and the head on the last (StageSpec), and as many
// micro-batch slots as the schedule keeps in flight on it (pipeline_slots). Micro-batch mb uses slot
// mb % slots: the schedules run a stage's micro-batches in order, so those in flight are consecutive.
//
// Interleaved stages (parallel.vpp = V > 1): the rank holds V models, one per chunk, chunk c holding virtual
// stage c * P + r's layers (the embedding on virtual stage 0, the head on the last), each with its own slots
// and buffers; an action runs on its chunk's model, and a chunk's activations go to virtual stage v + 1 on
// rank (v + 1) mod P (from the last rank back to the first for the next chunk), its gradients to v - 1.
// Messages are tagged by micro-batch, receiving chunk and kind, so both directions between two ranks stay
// apart.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/model.h"
#include "parallel/communicator.h"
#include "parallel/pp_schedule.h"

namespace moe {

// The most micro-batches `schedule` keeps in flight (forwarded, not yet backwarded) on `chunk` of `stage`
// (of `chunks` per stage).
int64_t pipeline_slots(PipeSchedule schedule, int64_t stages, int64_t stage, int64_t micro_batches, int64_t chunks = 1,
                       int64_t chunk = 0);

template <typename T>
class PipelineExecutor {
 public:
  // What the step needs from its caller, per micro-batch: its (batch, seq_len + 1) tokens (every stage reads
  // them: the first embeds the inputs, the last scores the targets), and the model's context set before its
  // forward (Model::set_context). Optionally `around`, called just before (begin = true) and just after
  // (false) every action: to time it, or to let gradient buckets reduce during the last backward.
  struct MicroBatches {
    std::function<void(int64_t mb, int32_t* tokens)> tokens;
    std::function<void(int64_t mb)> before_forward;
    std::function<void(const PipeAction& action, bool begin)> around;
    // With several chunks, called instead of before_forward: each chunk's model has its own context.
    std::function<void(int64_t mb, int64_t chunk)> before_chunk_forward;
  };

  // pp: the pipeline-parallel group, this rank's stage its rank in it. The model must have at least
  // pipeline_slots(...) slots.
  PipelineExecutor(Model<T>& stage, Communicator& pp, PipeSchedule schedule, int64_t micro_batches, int64_t batch,
                   int64_t seq_len);
  // The same with the rank's model chunks (interleaved when more than one): chunks[c] holds virtual stage
  // c * P + rank and at least pipeline_slots(..., chunks.size(), c) slots.
  PipelineExecutor(const std::vector<Model<T>*>& chunks, Communicator& pp, PipeSchedule schedule, int64_t micro_batches,
                   int64_t batch, int64_t seq_len);
  ~PipelineExecutor();
  // Runs every action of this stage for one step; gradients accumulate into the model's (scaled by
  // loss_scale, as Model::backward). Returns the sum of the step's token losses on the last stage, 0 on the
  // others. Every send has completed when it returns.
  double run(const MicroBatches& micro_batches, double loss_scale);
  const std::vector<PipeAction>& actions() const { return actions_; }

 private:
  struct Slot;  // one slot's receive and send buffers and sends in flight
  void send(Slot& slot, std::unique_ptr<Request>& request, Buffer& buffer, const T* data, int peer, int tag);
  bool receives_next(size_t action) const;  // whether action + 1 is a receive
  void run_action(size_t i, const MicroBatches& micro_batches, double loss_scale);
  int peer(int64_t chunk, int64_t step) const;  // the rank of virtual stage (chunk's) + step
  int tag(int64_t mb, int64_t receiving_chunk, PipeOp kind) const;

  std::vector<Model<T>*> chunks_;
  Communicator& pp_;
  int64_t stage_, stages_, batch_, seq_len_, rows_;  // rows_: the activation's rows * d_model elements
  std::vector<PipeAction> actions_;
  std::vector<std::vector<Slot>> slots_;  // per chunk
  std::vector<int32_t> tokens_;
};

}  // namespace moe
