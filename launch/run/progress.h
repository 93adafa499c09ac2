// The terminal progress line: step/total, loss, lr, tokens/s, ETA. On a TTY one line updates in place;
// otherwise (a log file, CI) each logged step prints a plain line.
#pragma once

#include <cstdint>
#include <string>

namespace moe {

class Progress {
 public:
  // live: update one line in place when stdout is a terminal. Under mpirun stdout is a pseudo-terminal
  // whatever mpirun's own output is, so the trainer passes false there and gets plain lines.
  Progress(bool enabled, bool live);
  // dead_experts < 0: the model has no MoE layers (not shown).
  void step(int64_t step, int64_t total, double loss, double lr, double tokens_per_s, double eta_s,
            int64_t dead_experts = -1);
  // A line that stays (evaluation results, the end): ends any in-place line first.
  void note(const std::string& line);
  void finish();

 private:
  bool enabled_, tty_;
  bool open_line_ = false;
};

std::string format_duration(double seconds);

}  // namespace moe
