// The timeline of chosen steps, in the Chrome Trace Event format.
#include "launch/run/trace.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "parallel/strings.h"

namespace moe {
Tracer::Tracer(bool enabled, int64_t first_step, int64_t steps)
    : enabled_(enabled), first_step_(first_step), steps_(steps) {}

void Tracer::start(Communicator& world) {
  rank_ = world.rank();
  if (!enabled_) return;
  world.barrier();
  epoch_ = std::chrono::steady_clock::now();
}

void Tracer::set_step(int64_t step) {
  step_ = step;
  recording_ = enabled_ && step >= first_step_ && step < first_step_ + steps_;
}

double Tracer::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - epoch_).count();
}

Tracer::Span::Span(Tracer* tracer, const char* name, const char* category, int64_t micro_batch)
    : tracer_(tracer),
      name_(name),
      category_(category),
      micro_batch_(micro_batch),
      start_us_(tracer ? tracer->now_us() : 0.0),
      device_span_(tracer ? tracer->device_begin(name, category, micro_batch) : -1) {}

Tracer::Span::Span(Span&& other) noexcept
    : tracer_(other.tracer_),
      name_(other.name_),
      category_(other.category_),
      micro_batch_(other.micro_batch_),
      start_us_(other.start_us_),
      device_span_(other.device_span_) {
  other.tracer_ = nullptr;
}

Tracer::Span::~Span() {
  if (!tracer_) return;
  tracer_->add(name_, category_, micro_batch_, start_us_, tracer_->now_us());
  tracer_->device_end(device_span_);
}

int64_t Tracer::device_begin(const char* name, const char* category, int64_t micro_batch) {
  if (!device_) return -1;
  device_spans_.push_back({name, category, micro_batch, step_});
  device_->record_time(&device_spans_.back().begin);
  return int64_t(device_spans_.size()) - 1;
}

void Tracer::device_end(int64_t index) {
  if (index >= 0 && index < int64_t(device_spans_.size())) device_->record_time(&device_spans_[size_t(index)].end);
}

int64_t Tracer::begin(const char* name, const char* category) {
  if (!recording_) return -1;
  open_[next_id_] = {name, category, now_us(), device_begin(name, category, -1)};
  return next_id_++;
}

void Tracer::end(int64_t id) {
  const auto it = open_.find(id);
  if (it == open_.end()) return;
  add(it->second.name, it->second.category, -1, it->second.start_us, now_us());
  device_end(it->second.device_span);
  open_.erase(it);
}

void Tracer::flush_device() {
  const double epoch_s = std::chrono::duration<double>(epoch_.time_since_epoch()).count();
  const int64_t step = step_;
  for (const DeviceSpan& d : device_spans_) {
    step_ = d.step;
    add(d.name, d.category, d.micro_batch, (d.begin - epoch_s) * 1e6, (d.end - epoch_s) * 1e6, 1);
  }
  step_ = step;
  device_spans_.clear();
}

void Tracer::add(const char* name, const char* category, int64_t micro_batch, double start_us, double end_us, int tid) {
  nlohmann::json args = {{"step", step_}};
  if (micro_batch >= 0) args["micro_batch"] = micro_batch;
  const std::string label = micro_batch >= 0 ? std::string(name) + " " + std::to_string(micro_batch) : name;
  const nlohmann::json e = {
      {"name", label}, {"cat", category}, {"ph", "X"},   {"ts", start_us}, {"dur", end_us - start_us},
      {"pid", rank_},  {"tid", tid},      {"args", args}};
  events_ += e.dump() + "\n";
}

void Tracer::write(Communicator& world, const std::string& path) const {
  if (!enabled_) return;
  const std::vector<std::string> all = allgather_strings(world, events_);
  if (world.rank() != 0) return;
  nlohmann::json events = nlohmann::json::array();
  for (size_t r = 0; r < all.size(); ++r) {
    events.push_back(
        {{"name", "process_name"}, {"ph", "M"}, {"pid", r}, {"args", {{"name", "rank " + std::to_string(r)}}}});
    for (const auto& [tid, track] : {std::pair<int, const char*>{0, "host"}, {1, "device stream"}})
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r}, {"tid", tid}, {"args", {{"name", track}}}});
    size_t at = 0;
    for (size_t end; (end = all[r].find('\n', at)) != std::string::npos; at = end + 1)
      events.push_back(nlohmann::json::parse(all[r].substr(at, end - at)));
  }
  const nlohmann::json trace = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) MOE_RUN_FAILED("cannot write the trace " << path);
  const std::string text = trace.dump() + "\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  std::fclose(f);
  if (!ok) MOE_RUN_FAILED("cannot write the trace " << path);
}

void TracedExchange::exchange_counts(const int64_t* send, int64_t* recv, int64_t n) {
  const auto span = tracer_.span("all-to-all (counts)", "communication");
  inner_.exchange_counts(send, recv, n);
}

namespace {
// An exchange of rows in flight and its span, which ends when the exchange is waited for.
struct TracedHandle final : ExchangeHandle {
  TracedHandle(std::unique_ptr<ExchangeHandle> inner, Tracer::Span span)
      : inner(std::move(inner)), span(std::move(span)) {}
  void wait() override {
    if (inner) inner->wait();
    span.reset();
  }
  std::unique_ptr<ExchangeHandle> inner;
  std::optional<Tracer::Span> span;
};
}  // namespace

std::unique_ptr<ExchangeHandle> TracedExchange::start_counts(const int64_t* send, int64_t* recv, int64_t n) {
  Tracer::Span span = tracer_.span("all-to-all (counts)", "communication");
  return std::make_unique<TracedHandle>(inner_.start_counts(send, recv, n), std::move(span));
}

std::unique_ptr<ExchangeHandle> TracedExchange::start(const float* send, const int64_t* send_counts, float* recv,
                                                      const int64_t* recv_counts) {
  Tracer::Span span = tracer_.span("all-to-all (rows)", "communication");
  return std::make_unique<TracedHandle>(inner_.start(send, send_counts, recv, recv_counts), std::move(span));
}

std::unique_ptr<ExchangeHandle> TracedExchange::start_allgather(const float* send, float* recv, int64_t count) {
  Tracer::Span span = tracer_.span("all-gather (rows)", "communication");
  return std::make_unique<TracedHandle>(inner_.start_allgather(send, recv, count), std::move(span));
}

std::unique_ptr<ExchangeHandle> TracedExchange::start_reduce_scatter(const float* send, float* recv, int64_t count) {
  Tracer::Span span = tracer_.span("reduce-scatter (rows)", "communication");
  return std::make_unique<TracedHandle>(inner_.start_reduce_scatter(send, recv, count), std::move(span));
}

}  // namespace moe
