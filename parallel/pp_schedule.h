// Pipeline schedules as data: for each stage, the ordered list of what it does in one optimizer step —
// receive an activation, run a micro-batch's forward, send its output on; receive a gradient, run a
// backward, send the input's gradient back — generated from (stages, micro-batches, schedule name) and
// executed by one loop (parallel/pipeline.h), so a schedule can be printed and tested
// without a model. Sends are nonblocking (their buffers kept until the step ends) and receives block:
// with that rule every schedule here runs to the end on every stage (tested by simulation).
//
// 1F1B (one forward, one backward; PipeDream-flush, Megatron-Core's default): stage s first runs
// min(P - s - 1, m) forwards (the warm-up), then alternates one forward and one backward, then runs the
// remaining backwards (the cool-down). At most P - s micro-batches are in flight on stage s, so the
// activations kept are bounded by the pipeline depth, not by m. GPipe (every forward, then every backward)
// is there for comparison: its stage 0 keeps all m in flight.
//
// Interleaved 1F1B (Megatron-Core's forward_backward_pipelining_with_interleaving): the model is cut into
// P * V virtual stages and rank r holds the V non-adjacent chunks c = 0..V-1 of virtual stage c * P + r, so
// a micro-batch passes every rank V times and the fill and drain shrink V-fold: the bubble is
// (P - 1) / (V m + P - 1) of the step instead of (P - 1) / (m + P - 1). Its actions carry the chunk; its
// forwards go in groups of P micro-batches per chunk (chunk 0 for micro-batches 0..P-1, chunk 1 for the same,
// ..., then the next P), its backwards the same with the chunks from last to first, and rank r runs
// (P - r - 1) * 2 + (V - 1) * P forwards before its first backward (all of them when m = P, as Megatron).
// It needs m to be a multiple of P. With V = 1 the schedule is plain 1F1B, action for action.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace moe {

enum class PipeOp : int8_t {
  RecvActivation,  // from stage - 1: the micro-batch's input activation
  Forward,
  SendActivation,  // to stage + 1: its output activation
  RecvGradient,    // from stage + 1: the gradient of its output
  Backward,
  SendGradient,  // to stage - 1: the gradient of its input
};
const char* pipe_op_name(PipeOp op);

struct PipeAction {
  PipeOp op;
  int64_t micro_batch;
  int64_t chunk = 0;  // which of the rank's model chunks (0 unless interleaved)
  bool operator==(const PipeAction&) const = default;
};

enum class PipeSchedule { OneFOneB, GPipe };

// The layers [first, last) of each pipeline stage: `layers` split evenly over `stages`, or by `counts`
// (one positive count per stage, summing to `layers`) when given. BadInput naming parallel.pp and
// parallel.pp_layers when the layers do not divide evenly without counts, or the counts do not fit.
std::vector<std::pair<int64_t, int64_t>> stage_layers(int64_t layers, int64_t stages,
                                                      const std::vector<int64_t>& counts = {});

// The actions of `stage` (0-based) of `stages` for `micro_batches` micro-batches, with `chunks` model chunks
// per stage (V above; more than one interleaves 1F1B). The first virtual stage has no receives of activations
// and sends of gradients, the last no sends of activations and receives of gradients; a chunk's activations
// go to virtual stage v + 1, on rank (v + 1) mod P. BadInput when stages < 1 or micro_batches < 1, and
// naming parallel.vpp when chunks > 1 with GPipe, with one stage, or with micro-batches not a multiple of
// the stages.
std::vector<PipeAction> pipeline_actions(PipeSchedule schedule, int64_t stages, int64_t stage, int64_t micro_batches,
                                         int64_t chunks = 1);

// The virtual stage of `chunk` on `stage`: c * P + r (its rank is v mod P).
inline int64_t virtual_stage(int64_t stages, int64_t stage, int64_t chunk) { return chunk * stages + stage; }

// One line per stage, e.g. "stage 0: F0 F1 B0 F2 B1 B2" (communication left out), for logs and docs; with
// chunks, each compute names its chunk after a dot ("F0.1": micro-batch 0 on chunk 1).
std::string describe_schedule(PipeSchedule schedule, int64_t stages, int64_t micro_batches, int64_t chunks = 1);

// Simulated execution with forward time `forward_s` and backward time `backward_s` per micro-batch and
// stage and chunk, communication free, sends nonblocking, receives blocking. Returns the step's makespan, or
// -1 when some stage waits forever (a deadlock). peak_in_flight (if given): per stage, the most
// (micro-batch, chunk) pairs forwarded and not yet backwarded at any moment.
double simulate_schedule(PipeSchedule schedule, int64_t stages, int64_t micro_batches, double forward_s,
                         double backward_s, std::vector<int64_t>* peak_in_flight = nullptr, int64_t chunks = 1);
// The same with each stage's own forward and backward times per chunk (one entry per stage).
double simulate_schedule(PipeSchedule schedule, int64_t micro_batches, const std::vector<double>& forward_s,
                         const std::vector<double>& backward_s, std::vector<int64_t>* peak_in_flight = nullptr,
                         int64_t chunks = 1);

}  // namespace moe
