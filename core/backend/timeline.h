// Spans of backend work in the order of its stream: what a trace's device track shows (train.trace,
// launch/run/trace.h). A layer opens one around its ops (Backend::span); the listener, when there is one,
// records when the stream reached the span's start and its end (Stream::record_time), which on a GPU is not
// when the host queued them. Without a listener a span costs one branch.
#pragma once

#include <cstdint>

namespace moe {

class Timeline {
 public:
  virtual ~Timeline() = default;
  // Opens a span; returns its id for end(). Spans may end in any order (an exchange's ends at its wait).
  virtual int64_t begin(const char* name, const char* category) = 0;
  virtual void end(int64_t id) = 0;
};

// A span from construction to destruction (nothing when `timeline` is null).
class TimelineSpan {
 public:
  TimelineSpan(Timeline* timeline, const char* name, const char* category)
      : timeline_(timeline), id_(timeline ? timeline->begin(name, category) : -1) {}
  ~TimelineSpan() {
    if (timeline_) timeline_->end(id_);
  }
  TimelineSpan(const TimelineSpan&) = delete;
  TimelineSpan& operator=(const TimelineSpan&) = delete;

 private:
  Timeline* timeline_;
  int64_t id_;
};

}  // namespace moe
