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
  bool operator==(const PipeAction&) const = default;
};

enum class PipeSchedule { OneFOneB, GPipe };

// The layers [first, last) of each pipeline stage: `layers` split evenly over `stages`, or by `counts`
// (one positive count per stage, summing to `layers`) when given. BadInput naming parallel.pp and
// parallel.pp_layers when the layers do not divide evenly without counts, or the counts do not fit.
std::vector<std::pair<int64_t, int64_t>> stage_layers(int64_t layers, int64_t stages,
                                                      const std::vector<int64_t>& counts = {});

// The actions of `stage` (0-based) of `stages` for `micro_batches` micro-batches. The first stage has no
// receives of activations and sends of gradients, the last no sends of activations and receives of
// gradients. BadInput when stages < 1 or micro_batches < 1.
std::vector<PipeAction> pipeline_actions(PipeSchedule schedule, int64_t stages, int64_t stage, int64_t micro_batches);

// One line per stage, e.g. "stage 0: F0 F1 B0 F2 B1 B2" (communication left out), for logs and docs.
std::string describe_schedule(PipeSchedule schedule, int64_t stages, int64_t micro_batches);

// Simulated execution with forward time `forward_s` and backward time `backward_s` per micro-batch and
// stage, communication free, sends nonblocking, receives blocking. Returns the step's makespan, or -1 when
// some stage waits forever (a deadlock). peak_in_flight (if given): per stage, the most micro-batches
// forwarded and not yet backwarded at any moment.
double simulate_schedule(PipeSchedule schedule, int64_t stages, int64_t micro_batches, double forward_s,
                         double backward_s, std::vector<int64_t>* peak_in_flight = nullptr);
// The same with each stage's own forward and backward times (one entry per stage).
double simulate_schedule(PipeSchedule schedule, int64_t micro_batches, const std::vector<double>& forward_s,
                         const std::vector<double>& backward_s, std::vector<int64_t>* peak_in_flight = nullptr);

}  // namespace moe
