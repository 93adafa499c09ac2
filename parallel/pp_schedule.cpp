// Pipeline schedules as data, and their simulation.
#include "parallel/pp_schedule.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/error.h"

namespace moe {
namespace {

void add_forward(std::vector<PipeAction>& a, int64_t stages, int64_t stage, int64_t mb) {
  if (stage > 0) a.push_back({PipeOp::RecvActivation, mb});
  a.push_back({PipeOp::Forward, mb});
  if (stage < stages - 1) a.push_back({PipeOp::SendActivation, mb});
}

void add_backward(std::vector<PipeAction>& a, int64_t stages, int64_t stage, int64_t mb) {
  if (stage < stages - 1) a.push_back({PipeOp::RecvGradient, mb});
  a.push_back({PipeOp::Backward, mb});
  if (stage > 0) a.push_back({PipeOp::SendGradient, mb});
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> stage_layers(int64_t layers, int64_t stages,
                                                      const std::vector<int64_t>& counts) {
  if (stages < 1) MOE_BAD_INPUT("parallel.pp = " << stages << ": expected at least one pipeline stage");
  std::vector<int64_t> sizes = counts;
  if (sizes.empty()) {
    if (layers % stages != 0)
      MOE_BAD_INPUT("parallel.pp = " << stages << " does not divide model.layers = " << layers
                                     << "; choose a divisor, or give each stage's layer count in parallel.pp_layers");
    sizes.assign(size_t(stages), layers / stages);
  }
  int64_t sum = 0;
  for (int64_t n : sizes) {
    if (n < 1) MOE_BAD_INPUT("parallel.pp_layers holds " << n << "; every stage needs at least one layer");
    sum += n;
  }
  if (int64_t(sizes.size()) != stages || sum != layers)
    MOE_BAD_INPUT("parallel.pp_layers has " << sizes.size() << " counts summing to " << sum << "; expected " << stages
                                            << " (parallel.pp) summing to model.layers = " << layers);
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t first = 0;
  for (int64_t n : sizes) out.emplace_back(first, first + n), first += n;
  return out;
}

const char* pipe_op_name(PipeOp op) {
  switch (op) {
    case PipeOp::RecvActivation:
      return "recv-activation";
    case PipeOp::Forward:
      return "forward";
    case PipeOp::SendActivation:
      return "send-activation";
    case PipeOp::RecvGradient:
      return "recv-gradient";
    case PipeOp::Backward:
      return "backward";
    case PipeOp::SendGradient:
      return "send-gradient";
  }
  return "?";
}

std::vector<PipeAction> pipeline_actions(PipeSchedule schedule, int64_t stages, int64_t stage, int64_t micro_batches) {
  if (stages < 1 || micro_batches < 1 || stage < 0 || stage >= stages)
    MOE_BAD_INPUT("a pipeline of " << stages << " stages and " << micro_batches << " micro-batches has no stage "
                                   << stage << "; both counts must be >= 1");
  std::vector<PipeAction> a;
  if (schedule == PipeSchedule::GPipe) {
    for (int64_t mb = 0; mb < micro_batches; ++mb) add_forward(a, stages, stage, mb);
    for (int64_t mb = 0; mb < micro_batches; ++mb) add_backward(a, stages, stage, mb);
    return a;
  }
  const int64_t warmup = std::min(stages - stage - 1, micro_batches);
  for (int64_t mb = 0; mb < warmup; ++mb) add_forward(a, stages, stage, mb);
  for (int64_t i = 0; i < micro_batches - warmup; ++i) {
    add_forward(a, stages, stage, warmup + i);
    add_backward(a, stages, stage, i);
  }
  for (int64_t mb = micro_batches - warmup; mb < micro_batches; ++mb) add_backward(a, stages, stage, mb);
  return a;
}

std::string describe_schedule(PipeSchedule schedule, int64_t stages, int64_t micro_batches) {
  std::string text;
  for (int64_t s = 0; s < stages; ++s) {
    text += "stage " + std::to_string(s) + ":";
    for (const PipeAction& a : pipeline_actions(schedule, stages, s, micro_batches))
      if (a.op == PipeOp::Forward || a.op == PipeOp::Backward)
        text += std::string(a.op == PipeOp::Forward ? " F" : " B") + std::to_string(a.micro_batch);
    text += "\n";
  }
  return text;
}

double simulate_schedule(PipeSchedule schedule, int64_t stages, int64_t micro_batches, double forward_s,
                         double backward_s, std::vector<int64_t>* peak_in_flight) {
  return simulate_schedule(schedule, micro_batches, std::vector<double>(size_t(stages), forward_s),
                           std::vector<double>(size_t(stages), backward_s), peak_in_flight);
}

double simulate_schedule(PipeSchedule schedule, int64_t micro_batches, const std::vector<double>& forward_s,
                         const std::vector<double>& backward_s, std::vector<int64_t>* peak_in_flight) {
  MOE_CHECK(forward_s.size() == backward_s.size(),
            forward_s.size() << " forward times and " << backward_s.size() << " backward times, one per stage");
  const int64_t stages = int64_t(forward_s.size());
  std::vector<std::vector<PipeAction>> actions;
  for (int64_t s = 0; s < stages; ++s) actions.push_back(pipeline_actions(schedule, stages, s, micro_batches));
  std::vector<size_t> next(size_t(stages), 0);
  std::vector<double> clock(size_t(stages), 0.0);
  std::vector<int64_t> in_flight(size_t(stages), 0), peak(size_t(stages), 0);
  // When each message (kind, receiving stage, micro-batch) becomes available.
  std::map<std::tuple<int, int64_t, int64_t>, double> sent;
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t s = 0; s < stages; ++s) {
      while (next[size_t(s)] < actions[size_t(s)].size()) {
        const PipeAction& a = actions[size_t(s)][next[size_t(s)]];
        double& t = clock[size_t(s)];
        if (a.op == PipeOp::RecvActivation || a.op == PipeOp::RecvGradient) {
          const auto it = sent.find({int(a.op), s, a.micro_batch});
          if (it == sent.end()) break;  // blocks until its sender has sent
          t = std::max(t, it->second);
        } else if (a.op == PipeOp::SendActivation) {
          sent[{int(PipeOp::RecvActivation), s + 1, a.micro_batch}] = t;
        } else if (a.op == PipeOp::SendGradient) {
          sent[{int(PipeOp::RecvGradient), s - 1, a.micro_batch}] = t;
        } else if (a.op == PipeOp::Forward) {
          t += forward_s[size_t(s)];
          peak[size_t(s)] = std::max(peak[size_t(s)], ++in_flight[size_t(s)]);
        } else {
          t += backward_s[size_t(s)];
          --in_flight[size_t(s)];
        }
        ++next[size_t(s)];
        progress = true;
      }
    }
  }
  if (peak_in_flight) *peak_in_flight = peak;
  for (int64_t s = 0; s < stages; ++s)
    if (next[size_t(s)] < actions[size_t(s)].size()) return -1;
  return *std::max_element(clock.begin(), clock.end());
}

}  // namespace moe
