// The flight recorder and the recording communicator.
#include "parallel/flight_recorder.h"

#include <chrono>
#include <cstdio>
#include <thread>

#include "core/error.h"
#include "parallel/process_groups.h"

namespace moe {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

bool is_alltoall(CommKind kind) {
  return kind == CommKind::Alltoall || kind == CommKind::Alltoallv || kind == CommKind::Ialltoallv;
}

[[noreturn]] void freeze_forever() {
  // The heartbeat thread goes on beating; the watchdog ends the process after the phase's timeout.
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace

const char* flight_op_name(CommKind kind) {
  static constexpr const char* kNames[kCommKinds] = {"allreduce", "iallreduce", "reduce_scatter", "ireduce_scatter",
                                                     "allgather", "alltoall",   "alltoallv",      "ialltoallv",
                                                     "send",      "recv",       "isend",          "irecv",
                                                     "sendrecv",  "broadcast",  "barrier"};
  return kNames[int(kind)];
}

bool flight_op_is_p2p(CommKind kind) {
  return kind == CommKind::Send || kind == CommKind::Recv || kind == CommKind::Isend || kind == CommKind::Irecv ||
         kind == CommKind::Sendrecv;
}

int32_t FlightRecorder::register_group(const std::string& name, int size) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int32_t g = 0; g < groups_; ++g)
    if (names_[size_t(g)] == name) return g;
  MOE_CHECK(groups_ < kMaxGroups, "the flight recorder holds " << kMaxGroups << " groups; " << name << " is one more");
  names_[size_t(groups_)] = name;
  sizes_[size_t(groups_)] = size;
  return groups_++;
}

uint64_t FlightRecorder::start(int32_t group, CommKind op, int64_t bytes, int32_t peer) {
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mutex_);
  GroupCounters& c = counters_[size_t(group)];
  const bool p2p = flight_op_is_p2p(op);
  const uint64_t id = next_id_++;
  ring_[id % kRingSize] = {id, p2p ? ++c.p2p : ++c.collectives, group, peer, op, bytes, t, 0};
  if (!p2p) c.last_collective = id;
  return id;
}

void FlightRecorder::finish(uint64_t id) {
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mutex_);
  FlightEntry& e = ring_[id % kRingSize];
  if (e.id == id && e.finished == 0) e.finished = t;  // else overwritten by newer operations
}

std::string FlightRecorder::group_name(int32_t group) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return names_[size_t(group)];
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<FlightEntry> out;
  const uint64_t first = next_id_ > kRingSize ? next_id_ - kRingSize : 1;
  for (uint64_t id = first; id < next_id_; ++id) out.push_back(ring_[id % kRingSize]);
  return out;
}

FlightSummary FlightRecorder::summary() const {
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mutex_);
  FlightSummary s;
  const uint64_t first = next_id_ > kRingSize ? next_id_ - kRingSize : 1;
  for (int32_t g = 0; g < groups_; ++g) {
    const GroupCounters& c = counters_[size_t(g)];
    if (c.collectives == 0 || sizes_[size_t(g)] < 2) continue;
    // The oldest collective in flight, else the last started (when still in the ring).
    const FlightEntry* chosen = nullptr;
    for (uint64_t id = first; id < next_id_ && !chosen; ++id) {
      const FlightEntry& e = ring_[id % kRingSize];
      if (e.id != 0 && e.group == g && !flight_op_is_p2p(e.op) && e.finished == 0) chosen = &e;
    }
    const FlightEntry& last = ring_[c.last_collective % kRingSize];
    if (!chosen && last.id == c.last_collective) chosen = &last;
    if (!chosen) continue;
    const bool waiting = chosen->finished == 0;
    s.groups.push_back({names_[size_t(g)], chosen->seq, flight_op_name(chosen->op), waiting,
                        t - (waiting ? chosen->started : chosen->finished)});
  }
  for (uint64_t id = first; id < next_id_; ++id) {
    const FlightEntry& e = ring_[id % kRingSize];
    if (e.id != 0 && flight_op_is_p2p(e.op) && e.finished == 0 && sizes_[size_t(e.group)] > 1) {
      s.p2p.push_back({names_[size_t(e.group)], flight_op_name(e.op), e.peer, t - e.started});
      break;
    }
  }
  return s;
}

FlightFault FlightRecorder::take_fault(int32_t group) {
  if (armed_.load(std::memory_order_relaxed) == 0) return FlightFault::None;  // the common case: one load
  std::lock_guard<std::mutex> lock(mutex_);
  if (names_[size_t(group)] != armed_group_) return FlightFault::None;
  return FlightFault(armed_.exchange(0));
}

// ---- the recording communicator

namespace {

// Finishes its operation in the recorder when the wrapped request completes (or is destroyed, which waits).
class RecordedRequest final : public Request {
 public:
  RecordedRequest(std::unique_ptr<Request> inner, std::shared_ptr<FlightRecorder> recorder, uint64_t id)
      : inner_(std::move(inner)), recorder_(std::move(recorder)), id_(id) {}
  ~RecordedRequest() override {
    inner_.reset();
    recorder_->finish(id_);
  }
  bool test() override {
    const bool done = inner_->test();
    if (done) recorder_->finish(id_);
    return done;
  }
  void wait() override {
    inner_->wait();
    recorder_->finish(id_);
  }

 private:
  std::unique_ptr<Request> inner_;
  std::shared_ptr<FlightRecorder> recorder_;
  uint64_t id_;
};

int64_t sum(const int64_t* counts, int n) {
  int64_t total = 0;
  for (int r = 0; r < n; ++r) total += counts[r];
  return total;
}

}  // namespace

RecordingCommunicator::RecordingCommunicator(std::unique_ptr<Communicator> owned, Communicator& inner,
                                             std::shared_ptr<FlightRecorder> recorder, const std::string& group)
    : owned_(std::move(owned)),
      inner_(inner),
      recorder_(std::move(recorder)),
      group_(recorder_->register_group(group, inner.size())) {}

uint64_t RecordingCommunicator::start(CommKind op, int64_t elements, DType dtype, int peer) {
  if (is_alltoall(op)) injected_fault();
  return recorder_->start(group_, op, elements * int64_t(dtype_size(dtype)), peer);
}

std::unique_ptr<Request> RecordingCommunicator::recorded(std::unique_ptr<Request> inner, uint64_t id) {
  return std::make_unique<RecordedRequest>(std::move(inner), recorder_, id);
}

void RecordingCommunicator::injected_fault() {
  const FlightFault fault = recorder_->take_fault(group_);
  if (fault == FlightFault::None) return;
  const std::string group = recorder_->group_name(group_);
  std::fprintf(stderr, "moe: fault injection: rank %d of the %s group %s\n", inner_.rank(), group.c_str(),
               fault == FlightFault::FreezeInAlltoall ? "freezes at the entry of its all-to-all"
                                                      : "calls a barrier where its peers call an all-to-all");
  std::fflush(stderr);
  if (fault == FlightFault::MismatchAlltoall) barrier();
  freeze_forever();
}

void RecordingCommunicator::allreduce_sum(void* data, int64_t count, DType dtype) {
  const Scope s(*recorder_, start(CommKind::Allreduce, count, dtype));
  inner_.allreduce_sum(data, count, dtype);
}
std::unique_ptr<Request> RecordingCommunicator::iallreduce_sum(void* data, int64_t count, DType dtype) {
  const uint64_t id = start(CommKind::Iallreduce, count, dtype);
  return recorded(inner_.iallreduce_sum(data, count, dtype), id);
}
void RecordingCommunicator::reduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype) {
  const Scope s(*recorder_, start(CommKind::ReduceScatter, count * inner_.size(), dtype));
  inner_.reduce_scatter_sum(send, recv, count, dtype);
}
std::unique_ptr<Request> RecordingCommunicator::ireduce_scatter_sum(const void* send, void* recv, int64_t count,
                                                                    DType dtype) {
  const uint64_t id = start(CommKind::IreduceScatter, count * inner_.size(), dtype);
  return recorded(inner_.ireduce_scatter_sum(send, recv, count, dtype), id);
}
void RecordingCommunicator::allgather(const void* send, void* recv, int64_t count, DType dtype) {
  const Scope s(*recorder_, start(CommKind::Allgather, count, dtype));
  inner_.allgather(send, recv, count, dtype);
}
void RecordingCommunicator::alltoall(const void* send, void* recv, int64_t count, DType dtype) {
  const Scope s(*recorder_, start(CommKind::Alltoall, count * inner_.size(), dtype));
  inner_.alltoall(send, recv, count, dtype);
}
void RecordingCommunicator::alltoallv(const void* send, const int64_t* send_counts, void* recv,
                                      const int64_t* recv_counts, DType dtype) {
  const Scope s(*recorder_, start(CommKind::Alltoallv, sum(send_counts, inner_.size()), dtype));
  inner_.alltoallv(send, send_counts, recv, recv_counts, dtype);
}
std::unique_ptr<Request> RecordingCommunicator::ialltoallv(const void* send, const int64_t* send_counts, void* recv,
                                                           const int64_t* recv_counts, DType dtype) {
  const uint64_t id = start(CommKind::Ialltoallv, sum(send_counts, inner_.size()), dtype);
  return recorded(inner_.ialltoallv(send, send_counts, recv, recv_counts, dtype), id);
}
void RecordingCommunicator::send(const void* data, int64_t count, DType dtype, int peer, int tag) {
  const Scope s(*recorder_, start(CommKind::Send, count, dtype, peer));
  inner_.send(data, count, dtype, peer, tag);
}
void RecordingCommunicator::recv(void* data, int64_t count, DType dtype, int peer, int tag) {
  const Scope s(*recorder_, start(CommKind::Recv, count, dtype, peer));
  inner_.recv(data, count, dtype, peer, tag);
}
std::unique_ptr<Request> RecordingCommunicator::isend(const void* data, int64_t count, DType dtype, int peer, int tag) {
  const uint64_t id = start(CommKind::Isend, count, dtype, peer);
  return recorded(inner_.isend(data, count, dtype, peer, tag), id);
}
std::unique_ptr<Request> RecordingCommunicator::irecv(void* data, int64_t count, DType dtype, int peer, int tag) {
  const uint64_t id = start(CommKind::Irecv, count, dtype, peer);
  return recorded(inner_.irecv(data, count, dtype, peer, tag), id);
}
void RecordingCommunicator::sendrecv_bytes(const void* send, int64_t send_bytes, int dest, void* recv,
                                           int64_t recv_bytes, int source, int tag) {
  const Scope s(*recorder_, start(CommKind::Sendrecv, send_bytes, DType::U8, source));
  inner_.sendrecv_bytes(send, send_bytes, dest, recv, recv_bytes, source, tag);
}
void RecordingCommunicator::broadcast(void* data, int64_t count, DType dtype, int root) {
  const Scope s(*recorder_, start(CommKind::Broadcast, inner_.rank() == root ? count : 0, dtype));
  inner_.broadcast(data, count, dtype, root);
}
void RecordingCommunicator::barrier() {
  const Scope s(*recorder_, start(CommKind::Barrier, 0, DType::U8));
  inner_.barrier();
}

void install_flight_recorder(ProcessGroups& groups, const std::shared_ptr<FlightRecorder>& recorder) {
  struct Slot {
    std::unique_ptr<Communicator>* control;
    Communicator** data;
    const char* name;
  };
  DataPlane& d = groups.data;
  const Slot slots[] = {{&groups.world, nullptr, "world"}, {&groups.dp, &d.dp, "dp"},  {&groups.ep, &d.ep, "ep"},
                        {&groups.edp, &d.edp, "edp"},      {&groups.tp, &d.tp, "tp"},  {&groups.pp, &d.pp, "pp"},
                        {&groups.etp, &d.etp, "etp"},      {&groups.mp, nullptr, "mp"}};
  for (const Slot& s : slots) {
    Communicator* before = s.control->get();
    auto* raw = before;
    *s.control = std::make_unique<RecordingCommunicator>(std::move(*s.control), *raw, recorder, s.name);
    if (!s.data) continue;
    if (*s.data == before) {
      *s.data = s.control->get();  // the group's own carries its data: one record
    } else {
      d.owned.push_back(
          std::make_unique<RecordingCommunicator>(nullptr, **s.data, recorder, std::string(s.name) + ".data"));
      *s.data = d.owned.back().get();
    }
  }
}

}  // namespace moe
