// Progress line formatting.
#include "launch/run/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

namespace moe {

Progress::Progress(bool enabled, bool live) : enabled_(enabled), tty_(live && isatty(STDOUT_FILENO) == 1) {}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", s);
  return buf;
}

void Progress::step(int64_t step, int64_t total, double loss, double lr, double tokens_per_s, double eta_s,
                    int64_t dead_experts) {
  if (!enabled_) return;
  char buf[256];
  char dead[48] = "";
  if (dead_experts >= 0) std::snprintf(dead, sizeof dead, " | dead experts %lld", static_cast<long long>(dead_experts));
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | lr %.2e | %.0f tok/s%s | ETA %s",
                static_cast<long long>(step), static_cast<long long>(total), loss, lr, tokens_per_s, dead,
                format_duration(eta_s).c_str());
  if (tty_) {
    std::printf("\r\033[K%s", buf);
    open_line_ = true;
  } else {
    std::printf("%s\n", buf);
  }
  std::fflush(stdout);
}

void Progress::note(const std::string& line) {
  if (!enabled_) return;
  if (open_line_) std::printf("\n");
  open_line_ = false;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

void Progress::finish() {
  if (enabled_ && open_line_) std::printf("\n");
  open_line_ = false;
  std::fflush(stdout);
}

}  // namespace moe
