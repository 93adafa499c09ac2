// Heartbeats and the in-rank watchdog. Every rank reports (rank, host, pid, step, phase) to the
// supervisor (`moe launch`) every fault.heartbeat_interval_s over UDP, to the address and with the
// secret the supervisor put in the environment (MOE_HEARTBEAT_ADDR, MOE_HEARTBEAT_SECRET). The same
// thread is the rank's watchdog: when the main thread makes no progress within its phase's timeout (a
// stuck collective, a hung step), it names the rank, host and operation and ends the process, so that
// mpirun ends the job and the supervisor restarts it. Each phase has its own timeout, so a long
// checkpoint write is not taken for a hang.
//
// With a flight recorder (parallel/flight_recorder.h), every beat also carries the rank's communication state:
// per group its oldest collective in flight, else its last one ("c=ep,412,alltoall,w,31200": group, sequence
// number, operation, w waiting or d done, milliseconds since it started or finished), and its oldest
// point-to-point operation in flight ("p=pp,recv,1,900": group, operation, peer's rank in the group,
// milliseconds). Records that would take the datagram past kMaxHeartbeatBytes are left out, finished ones
// first. The supervisor compares them across the ranks of each group when the job hangs
// (launch/supervise/hang_report.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "launch/config/config.h"
#include "parallel/flight_recorder.h"

namespace moe {

enum class Phase : uint8_t { Setup, Step, Eval, CheckpointSave, CheckpointLoad, Done };
const char* phase_name(Phase phase);
std::optional<Phase> phase_from_name(std::string_view name);

struct Heartbeat {
  int64_t attempt = 0;  // the supervisor's start count (MOE_LAUNCH_ATTEMPT): beats of an ended job are stale
  int64_t rank = 0, pid = 0, step = 0;  // step: steps done
  Phase phase = Phase::Setup;
  std::string host;
  FlightSummary flight;  // empty without a recorder
};

inline constexpr size_t kMaxHeartbeatBytes = 512;
// "MOEHB1 <secret> <attempt> <rank> <pid> <step> <phase> <host> [c=... ...] [p=...]"
std::string encode_heartbeat(const std::string& secret, const Heartbeat& beat);
// The heartbeat, or nullopt with `why` ("oversized", "malformed", "wrong secret").
std::optional<Heartbeat> decode_heartbeat(std::string_view datagram, const std::string& secret, std::string* why);

// The timeout of a phase, from the fault.* config keys.
double phase_timeout(const FaultConfig& fault, Phase phase);

class HeartbeatSender {
 public:
  // Sends only when the supervisor's environment is present; the watchdog runs in any case.
  // `recorder` (may be null): the rank's flight recorder, whose summary each beat carries; when the watchdog ends
  // the rank it writes the whole ring to `flight_dir`/rank-NNNNN.txt (launch/train/flight_dump.h), unless that is
  // empty.
  HeartbeatSender(int64_t rank, const std::string& host, const FaultConfig& fault,
                  std::shared_ptr<const FlightRecorder> recorder = nullptr, std::string flight_dir = "");
  // Ending normally, sends one last beat (phase done, the steps done) at once: the supervisor counts a run
  // as finished only when a rank reported its last step. Unwinding an exception, sends nothing more.
  ~HeartbeatSender();
  HeartbeatSender(const HeartbeatSender&) = delete;
  HeartbeatSender& operator=(const HeartbeatSender&) = delete;
  // The main thread's progress: each call restarts the watchdog's clock.
  // A change of phase is sent at once.
  void set(Phase phase, int64_t step, const char* operation);

 private:
  void run();
  void send(Heartbeat beat);
  int64_t rank_;
  std::string host_;
  FaultConfig fault_;
  std::shared_ptr<const FlightRecorder> recorder_;
  std::string flight_dir_;
  std::string secret_;
  int64_t attempt_ = 0;
  int socket_ = -1;
  std::mutex mutex_;
  Phase phase_ = Phase::Setup;
  int64_t step_ = 0;
  std::string operation_ = "start-up";
  double since_ = 0;  // monotonic seconds of the last set()
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace moe
