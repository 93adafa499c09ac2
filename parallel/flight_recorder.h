// The flight recorder: each rank's record of its last communication operations, as torch's NCCL flight
// recorder keeps one (TORCH_NCCL_TRACE_BUFFER_SIZE), for naming a hang. A RecordingCommunicator wraps every
// communicator of a rank (control plane, MPI, and data plane, NCCL on a GPU) under its group's name and writes
// each call into the rank's one FlightRecorder: a fixed ring of the last kRingSize operations (sequence number,
// group, operation, bytes, peer, started, finished). Recording allocates nothing: a mutex, a ring slot and a few
// numbers per call (the nonblocking forms add one small request wrapper to the library's own).
//
// Sequence numbers count per group: collectives (#1, #2, ...) and point-to-point operations separately, so that
// the ranks of a group agree on a collective's number whatever their sends and receives. The recorder's summary
// (what the heartbeat carries, launch/train/heartbeat.h) gives per group the oldest collective still in flight, else
// the last one started, and the oldest point-to-point operation in flight; the supervisor compares them across the
// ranks of each group (launch/supervise/hang_report.h). What it does not see: the library's own progress inside an
// operation (which peer's bytes are missing), and operations issued below the seam.
//
// For tests (fault.inject, launch/train/faults.h) the recorder can be armed to freeze its rank at the entry of its next
// all-to-all of one group, or to have it call a barrier there instead (a collective mismatch).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/counting_communicator.h"

namespace moe {

struct ProcessGroups;

// A short name per operation, for the heartbeat and events.log.
const char* flight_op_name(CommKind kind);
bool flight_op_is_p2p(CommKind kind);

// One operation of the ring.
struct FlightEntry {
  uint64_t id = 0;  // 1, 2, ... over the whole recorder; 0: an empty slot
  int64_t seq = 0;  // per group: collectives and point-to-point counted separately
  int32_t group = 0;
  int32_t peer = -1;  // point to point: the peer's rank in the group (sendrecv: the source)
  CommKind op = CommKind::Barrier;
  int64_t bytes = 0;                 // as counting_communicator.h defines them
  double started = 0, finished = 0;  // monotonic seconds; finished 0 while in flight
};

// What a rank reports of one group: its oldest collective in flight, else the last it started.
struct FlightGroupState {
  std::string group;  // "ep", "dp", ..., "ep.data" for a separate data-plane communicator
  int64_t seq = 0;
  std::string op;
  bool waiting = false;  // in flight (started, not finished)
  double age_s = 0;      // since it started (waiting) or finished
};
// Its oldest point-to-point operation in flight.
struct FlightPeerState {
  std::string group, op;
  int64_t peer = -1;  // the peer's rank in the group
  double age_s = 0;
};
struct FlightSummary {
  std::vector<FlightGroupState> groups;  // in registration order
  std::vector<FlightPeerState> p2p;      // none, or the oldest in flight
};

enum class FlightFault : int { None, FreezeInAlltoall, MismatchAlltoall };

class FlightRecorder {
 public:
  static constexpr size_t kRingSize = 256;
  static constexpr int kMaxGroups = 16;

  // A group's index for start(); the same name twice gives the same index. Groups of one rank are recorded but
  // left out of the summary (nothing can wait for a peer there).
  int32_t register_group(const std::string& name, int size);
  // An operation starts: its id, for finish().
  uint64_t start(int32_t group, CommKind op, int64_t bytes, int32_t peer);
  void finish(uint64_t id);

  FlightSummary summary() const;
  // The ring, oldest first (for tests and the watchdog's dump).
  std::vector<FlightEntry> entries() const;
  std::string group_name(int32_t group) const;

  void arm(FlightFault fault, const std::string& group) {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_group_ = group;
    armed_.store(int(fault));
  }
  // The fault armed for an all-to-all of `group`, disarmed by taking it.
  FlightFault take_fault(int32_t group);

 private:
  struct GroupCounters {
    int64_t collectives = 0, p2p = 0;
    uint64_t last_collective = 0;  // id of the last collective started
  };
  mutable std::mutex mutex_;
  std::array<FlightEntry, kRingSize> ring_{};
  uint64_t next_id_ = 1;
  std::array<std::string, kMaxGroups> names_{};
  std::array<int, kMaxGroups> sizes_{};
  std::array<GroupCounters, kMaxGroups> counters_{};
  int32_t groups_ = 0;
  std::atomic<int> armed_{0};
  std::string armed_group_;
};

// Records every call into `recorder` under `group`, and passes it on to `inner` unchanged.
class RecordingCommunicator final : public Communicator {
 public:
  RecordingCommunicator(std::unique_ptr<Communicator> owned, Communicator& inner,
                        std::shared_ptr<FlightRecorder> recorder, const std::string& group);

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name(); }

  MOE_COMMUNICATOR_CONVENIENCE_FORMS;
  void allreduce_sum(void* data, int64_t count, DType dtype) override;
  std::unique_ptr<Request> iallreduce_sum(void* data, int64_t count, DType dtype) override;
  void reduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype) override;
  std::unique_ptr<Request> ireduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype) override;
  void allgather(const void* send, void* recv, int64_t count, DType dtype) override;
  void alltoall(const void* send, void* recv, int64_t count, DType dtype) override;
  void alltoallv(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
                 DType dtype) override;
  std::unique_ptr<Request> ialltoallv(const void* send, const int64_t* send_counts, void* recv,
                                      const int64_t* recv_counts, DType dtype) override;
  void send(const void* data, int64_t count, DType dtype, int peer, int tag) override;
  void recv(void* data, int64_t count, DType dtype, int peer, int tag) override;
  std::unique_ptr<Request> isend(const void* data, int64_t count, DType dtype, int peer, int tag) override;
  std::unique_ptr<Request> irecv(void* data, int64_t count, DType dtype, int peer, int tag) override;
  void sendrecv_bytes(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes, int source,
                      int tag) override;
  void broadcast(void* data, int64_t count, DType dtype, int root) override;
  void barrier() override;

 private:
  // Ends the scope's operation in the recorder.
  struct Scope {
    Scope(FlightRecorder& r, uint64_t i) : recorder(r), id(i) {}
    ~Scope() { recorder.finish(id); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    FlightRecorder& recorder;
    uint64_t id;
  };
  uint64_t start(CommKind op, int64_t elements, DType dtype, int peer = -1);
  std::unique_ptr<Request> recorded(std::unique_ptr<Request> inner, uint64_t id);
  // An armed fault at an all-to-all's entry: freezes, or calls a barrier and then freezes.
  void injected_fault();

  std::unique_ptr<Communicator> owned_;
  Communicator& inner_;
  std::shared_ptr<FlightRecorder> recorder_;
  int32_t group_;
};

// Wraps every communicator of `groups` (world, dp, ep, edp, tp, pp, etp, mp; each data-plane one that is not its
// group's own as "<group>.data") in a RecordingCommunicator writing to `recorder`.
void install_flight_recorder(ProcessGroups& groups, const std::shared_ptr<FlightRecorder>& recorder);

}  // namespace moe
