// A timeline of a few chosen steps (train.trace): every rank records spans — each micro-batch's forward
// and backward, the wait for gradient reduction, the loss reduction, clipping, the optimizer, checkpoint
// saves, evaluation — and at the end of the run rank 0 writes RUN_DIR/trace.json in the Chrome Trace Event
// format (one process per rank), which Perfetto (ui.perfetto.dev) and chrome://tracing open.
// Time is measured from a barrier at the start of the run on every rank, so spans of ranks on one host
// line up; across hosts they are as aligned as the barrier's exit. Outside the chosen steps nothing is
// recorded and a span costs one branch.
// The tracer is also the backend's timeline (core/backend/timeline.h): the MoE layers' spans (router, dispatch,
// experts, combine) join the host's. With a device stream (a backend whose memory is not the host's: CUDA, the
// memory-checking backend) every span is recorded a second time on a "device" track (tid 1) at the times the
// stream reached its start and end, which the host learns after the step (flush_device, after a
// synchronisation the trainer makes after each traced step): where a GPU's time goes, not the host's.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/backend/backend.h"
#include "core/expert_exchange.h"
#include "parallel/communicator.h"

namespace moe {

class Tracer final : public Timeline {
 public:
  // Records steps [first_step, first_step + steps) (1-based, as the progress line counts them) when enabled.
  Tracer(bool enabled, int64_t first_step, int64_t steps);
  bool enabled() const { return enabled_; }
  // Spans are also recorded at `stream`'s times, on the device track (null: the host's only).
  void set_device(Stream* stream) { device_ = stream; }
  // Whether device times wait to be read: the stream must be synchronised before flush_device().
  bool device_pending() const { return !device_spans_.empty(); }
  // The device spans recorded so far become events (their times read: after a synchronisation).
  void flush_device();
  // Timeline: a span of the backend's work (the MoE layers'), on the host track and the device's.
  int64_t begin(const char* name, const char* category) override;
  void end(int64_t id) override;
  // Collective: every rank's clock starts here.
  void start(Communicator& world);
  // The step now running (1-based); recording follows the chosen window.
  void set_step(int64_t step);
  bool recording() const { return recording_; }

  class Span {
   public:
    Span(Tracer* tracer, const char* name, const char* category, int64_t micro_batch);
    ~Span();
    Span(Span&& other) noexcept;  // the moved-from span records nothing
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;
    Span& operator=(Span&&) = delete;

   private:
    Tracer* tracer_;  // null when not recording
    const char* name_;
    const char* category_;
    int64_t micro_batch_;
    double start_us_;
    int64_t device_span_;  // its device twin's index (-1: none)
  };
  // A span from now to the end of the scope. micro_batch < 0: none.
  Span span(const char* name, const char* category, int64_t micro_batch = -1) {
    return Span(recording_ ? this : nullptr, name, category, micro_batch);
  }

  // Collective: gathers every rank's spans; rank 0 writes them to `path` (when enabled).
  void write(Communicator& world, const std::string& path) const;
  // This rank's events as Trace Event JSON objects, one per line (for tests).
  const std::string& events() const { return events_; }

 private:
  // A span's times on the device stream, known after a synchronisation.
  struct DeviceSpan {
    const char* name;
    const char* category;
    int64_t micro_batch, step;
    double begin = 0, end = 0;  // Stream::record_time's seconds
  };
  struct OpenSpan {
    const char* name;
    const char* category;
    double start_us;
    int64_t device_span;
  };
  double now_us() const;
  void add(const char* name, const char* category, int64_t micro_batch, double start_us, double end_us, int tid = 0);
  // Opens a device span (-1 without a device stream); device_end closes it.
  int64_t device_begin(const char* name, const char* category, int64_t micro_batch);
  void device_end(int64_t index);

  bool enabled_;
  int64_t first_step_, steps_;
  bool recording_ = false;
  int64_t step_ = 0;
  int rank_ = 0;
  std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
  std::string events_;
  Stream* device_ = nullptr;
  std::deque<DeviceSpan> device_spans_;  // a deque: the stream writes into them later
  std::map<int64_t, OpenSpan> open_;     // the timeline's open spans by id
  int64_t next_id_ = 0;
};

// The expert exchange, timed: each exchange of counts, and each exchange of rows, from its start to its
// wait (computation may run in between: the counts or rows are in flight), is an "all-to-all" span (an
// "all-gather" or "reduce-scatter" one for the all-gather dispatcher's rows).
class TracedExchange final : public ExpertExchange {
 public:
  TracedExchange(ExpertExchange& inner, Tracer& tracer) : inner_(inner), tracer_(tracer) {}
  int size() const override { return inner_.size(); }
  int rank() const override { return inner_.rank(); }
  void exchange_counts(const int64_t* send, int64_t* recv, int64_t n) override;
  std::unique_ptr<ExchangeHandle> start_counts(const int64_t* send, int64_t* recv, int64_t n) override;
  std::unique_ptr<ExchangeHandle> start(const float* send, const int64_t* send_counts, float* recv,
                                        const int64_t* recv_counts) override;
  std::unique_ptr<ExchangeHandle> start_allgather(const float* send, float* recv, int64_t count) override;
  std::unique_ptr<ExchangeHandle> start_reduce_scatter(const float* send, float* recv, int64_t count) override;

 private:
  ExpertExchange& inner_;
  Tracer& tracer_;
};

}  // namespace moe
