// Pipeline schedules as data, and their simulation.
#include "parallel/pp_schedule.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/error.h"

namespace moe {
namespace {

// Where a (micro-batch, chunk) runs: stage s of P, chunk c of V, so virtual stage v = c * P + s of P * V.
struct Place {
  int64_t stages, stage, chunks;
  int64_t virtual_of(int64_t chunk) const { return virtual_stage(stages, stage, chunk); }
  bool first(int64_t chunk) const { return virtual_of(chunk) == 0; }
  bool last(int64_t chunk) const { return virtual_of(chunk) == stages * chunks - 1; }
};

void add_forward(std::vector<PipeAction>& a, const Place& p, int64_t mb, int64_t chunk) {
  if (!p.first(chunk)) a.push_back({PipeOp::RecvActivation, mb, chunk});
  a.push_back({PipeOp::Forward, mb, chunk});
  if (!p.last(chunk)) a.push_back({PipeOp::SendActivation, mb, chunk});
}

void add_backward(std::vector<PipeAction>& a, const Place& p, int64_t mb, int64_t chunk) {
  if (!p.last(chunk)) a.push_back({PipeOp::RecvGradient, mb, chunk});
  a.push_back({PipeOp::Backward, mb, chunk});
  if (!p.first(chunk)) a.push_back({PipeOp::SendGradient, mb, chunk});
}

// The k-th forward (or backward) of a stage under interleaving: micro-batches in groups of P, each group
// through the chunks in order (backwards: in reverse).
std::pair<int64_t, int64_t> interleaved_unit(int64_t k, int64_t stages, int64_t chunks, bool forward) {
  const int64_t group = k / (stages * chunks), within = k % (stages * chunks);
  const int64_t chunk = forward ? within / stages : chunks - 1 - within / stages;
  return {group * stages + within % stages, chunk};
}

void check_chunks(PipeSchedule schedule, int64_t stages, int64_t micro_batches, int64_t chunks) {
  if (chunks < 1) MOE_BAD_INPUT("parallel.vpp = " << chunks << ": expected at least one model chunk per stage");
  if (chunks == 1) return;
  if (schedule != PipeSchedule::OneFOneB)
    MOE_BAD_INPUT("parallel.vpp = " << chunks << ": interleaved chunks need the 1F1B schedule");
  if (stages < 2) MOE_BAD_INPUT("parallel.vpp = " << chunks << " needs parallel.pp >= 2; got " << stages);
  if (micro_batches % stages != 0)
    MOE_BAD_INPUT("parallel.vpp = " << chunks << " needs the micro-batches per step (" << micro_batches
                                    << ") to be a multiple of parallel.pp = " << stages);
}

std::vector<PipeAction> interleaved_actions(const Place& p, int64_t micro_batches) {
  const int64_t total = micro_batches * p.chunks;
  const int64_t warmup =
      micro_batches == p.stages ? total : std::min((p.stages - p.stage - 1) * 2 + (p.chunks - 1) * p.stages, total);
  std::vector<PipeAction> a;
  const auto forward = [&](int64_t k) {
    const auto [mb, chunk] = interleaved_unit(k, p.stages, p.chunks, true);
    add_forward(a, p, mb, chunk);
  };
  const auto backward = [&](int64_t k) {
    const auto [mb, chunk] = interleaved_unit(k, p.stages, p.chunks, false);
    add_backward(a, p, mb, chunk);
  };
  for (int64_t k = 0; k < warmup; ++k) forward(k);
  for (int64_t i = 0; i < total - warmup; ++i) forward(warmup + i), backward(i);
  for (int64_t k = total - warmup; k < total; ++k) backward(k);
  return a;
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

std::vector<PipeAction> pipeline_actions(PipeSchedule schedule, int64_t stages, int64_t stage, int64_t micro_batches,
                                         int64_t chunks) {
  if (stages < 1 || micro_batches < 1 || stage < 0 || stage >= stages)
    MOE_BAD_INPUT("a pipeline of " << stages << " stages and " << micro_batches << " micro-batches has no stage "
                                   << stage << "; both counts must be >= 1");
  check_chunks(schedule, stages, micro_batches, chunks);
  const Place p{stages, stage, chunks};
  if (chunks > 1) return interleaved_actions(p, micro_batches);
  std::vector<PipeAction> a;
  if (schedule == PipeSchedule::GPipe) {
    for (int64_t mb = 0; mb < micro_batches; ++mb) add_forward(a, p, mb, 0);
    for (int64_t mb = 0; mb < micro_batches; ++mb) add_backward(a, p, mb, 0);
    return a;
  }
  const int64_t warmup = std::min(stages - stage - 1, micro_batches);
  for (int64_t mb = 0; mb < warmup; ++mb) add_forward(a, p, mb, 0);
  for (int64_t i = 0; i < micro_batches - warmup; ++i) {
    add_forward(a, p, warmup + i, 0);
    add_backward(a, p, i, 0);
  }
  for (int64_t mb = micro_batches - warmup; mb < micro_batches; ++mb) add_backward(a, p, mb, 0);
  return a;
}

std::string describe_schedule(PipeSchedule schedule, int64_t stages, int64_t micro_batches, int64_t chunks) {
  std::string text;
  for (int64_t s = 0; s < stages; ++s) {
    text += "stage " + std::to_string(s) + ":";
    for (const PipeAction& a : pipeline_actions(schedule, stages, s, micro_batches, chunks))
      if (a.op == PipeOp::Forward || a.op == PipeOp::Backward) {
        text += std::string(a.op == PipeOp::Forward ? " F" : " B") + std::to_string(a.micro_batch);
        if (chunks > 1) text += "." + std::to_string(a.chunk);
      }
    text += "\n";
  }
  return text;
}

double simulate_schedule(PipeSchedule schedule, int64_t stages, int64_t micro_batches, double forward_s,
                         double backward_s, std::vector<int64_t>* peak_in_flight, int64_t chunks) {
  return simulate_schedule(schedule, micro_batches, std::vector<double>(size_t(stages), forward_s),
                           std::vector<double>(size_t(stages), backward_s), peak_in_flight, chunks);
}

double simulate_schedule(PipeSchedule schedule, int64_t micro_batches, const std::vector<double>& forward_s,
                         const std::vector<double>& backward_s, std::vector<int64_t>* peak_in_flight, int64_t chunks) {
  MOE_CHECK(forward_s.size() == backward_s.size(),
            forward_s.size() << " forward times and " << backward_s.size() << " backward times, one per stage");
  const int64_t stages = int64_t(forward_s.size());
  std::vector<std::vector<PipeAction>> actions;
  for (int64_t s = 0; s < stages; ++s) actions.push_back(pipeline_actions(schedule, stages, s, micro_batches, chunks));
  std::vector<size_t> next(size_t(stages), 0);
  std::vector<double> clock(size_t(stages), 0.0);
  std::vector<int64_t> in_flight(size_t(stages), 0), peak(size_t(stages), 0);
  // When each message (kind, receiving virtual stage, micro-batch) becomes available.
  std::map<std::tuple<int, int64_t, int64_t>, double> sent;
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t s = 0; s < stages; ++s) {
      while (next[size_t(s)] < actions[size_t(s)].size()) {
        const PipeAction& a = actions[size_t(s)][next[size_t(s)]];
        const int64_t v = virtual_stage(stages, s, a.chunk);
        double& t = clock[size_t(s)];
        if (a.op == PipeOp::RecvActivation || a.op == PipeOp::RecvGradient) {
          const auto it = sent.find({int(a.op), v, a.micro_batch});
          if (it == sent.end()) break;  // blocks until its sender has sent
          t = std::max(t, it->second);
        } else if (a.op == PipeOp::SendActivation) {
          sent[{int(PipeOp::RecvActivation), v + 1, a.micro_batch}] = t;
        } else if (a.op == PipeOp::SendGradient) {
          sent[{int(PipeOp::RecvGradient), v - 1, a.micro_batch}] = t;
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
