// Heartbeat encoding and the sender/watchdog thread.
#include "launch/train/heartbeat.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>
#include <vector>

#include "launch/train/flight_dump.h"

namespace moe {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Compares in time independent of where the strings differ.
bool equal_secret(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::Setup:
      return "setup";
    case Phase::Step:
      return "step";
    case Phase::Eval:
      return "eval";
    case Phase::CheckpointSave:
      return "checkpoint_save";
    case Phase::CheckpointLoad:
      return "checkpoint_load";
    case Phase::Done:
      return "done";
  }
  return "?";
}

std::optional<Phase> phase_from_name(std::string_view name) {
  for (Phase p : {Phase::Setup, Phase::Step, Phase::Eval, Phase::CheckpointSave, Phase::CheckpointLoad, Phase::Done})
    if (name == phase_name(p)) return p;
  return std::nullopt;
}

namespace {

int64_t milliseconds(double seconds) { return std::max<int64_t>(0, int64_t(seconds * 1000.0)); }

std::string group_record(const FlightGroupState& g) {
  return "c=" + g.group + "," + std::to_string(g.seq) + "," + g.op + "," + (g.waiting ? "w" : "d") + "," +
         std::to_string(milliseconds(g.age_s));
}

std::string peer_record(const FlightPeerState& p) {
  return "p=" + p.group + "," + p.op + "," + std::to_string(p.peer) + "," + std::to_string(milliseconds(p.age_s));
}

// A group's name: lower-case letters and dots; an operation's: lower-case letters and underscores.
bool plain_word(const std::string& w, char extra) {
  if (w.empty() || w.size() > 24) return false;
  for (char c : w)
    if (!((c >= 'a' && c <= 'z') || c == extra)) return false;
  return true;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::istringstream in(text);
  for (std::string part; std::getline(in, part, ',');) parts.push_back(part);
  return parts;
}

bool whole_number(const std::string& text, int64_t* value) {
  if (text.empty() || text.size() > 18) return false;
  for (char c : text)
    if (c < '0' || c > '9') return false;
  *value = std::atoll(text.c_str());
  return true;
}

// One "c=..." or "p=..." record into `flight`; false when malformed.
bool decode_record(const std::string& word, FlightSummary* flight) {
  if (word.size() < 3 || word[1] != '=') return false;
  const std::vector<std::string> f = split_commas(word.substr(2));
  int64_t n = 0, ms = 0;
  if (word[0] == 'c' && f.size() == 5 && plain_word(f[0], '.') && whole_number(f[1], &n) && plain_word(f[2], '_') &&
      (f[3] == "w" || f[3] == "d") && whole_number(f[4], &ms)) {
    flight->groups.push_back({f[0], n, f[2], f[3] == "w", double(ms) / 1000.0});
    return true;
  }
  if (word[0] == 'p' && f.size() == 4 && plain_word(f[0], '.') && plain_word(f[1], '_') && whole_number(f[2], &n) &&
      whole_number(f[3], &ms)) {
    flight->p2p.push_back({f[0], f[1], n, double(ms) / 1000.0});
    return true;
  }
  return false;
}

// The watchdog's last words: where the rank waits in its communication.
void print_in_flight(int64_t rank, const FlightSummary& flight) {
  for (const FlightGroupState& g : flight.groups)
    if (g.waiting)
      std::fprintf(stderr, "moe: watchdog: rank %lld waits in %s %s #%lld since %.1f s\n", static_cast<long long>(rank),
                   g.group.c_str(), g.op.c_str(), static_cast<long long>(g.seq), g.age_s);
  for (const FlightPeerState& p : flight.p2p)
    std::fprintf(stderr, "moe: watchdog: rank %lld waits in %s %s with rank %lld of the group since %.1f s\n",
                 static_cast<long long>(rank), p.group.c_str(), p.op.c_str(), static_cast<long long>(p.peer), p.age_s);
}

}  // namespace

std::string encode_heartbeat(const std::string& secret, const Heartbeat& b) {
  std::ostringstream out;
  out << "MOEHB1 " << secret << ' ' << b.attempt << ' ' << b.rank << ' ' << b.pid << ' ' << b.step << ' '
      << phase_name(b.phase) << ' ' << b.host;
  std::string text = out.str();
  // The flight records in order of importance: collectives waited in, the point-to-point one, then finished ones;
  // each only if it still fits.
  std::vector<std::string> records;
  for (const FlightGroupState& g : b.flight.groups)
    if (g.waiting) records.push_back(group_record(g));
  for (const FlightPeerState& p : b.flight.p2p) records.push_back(peer_record(p));
  for (const FlightGroupState& g : b.flight.groups)
    if (!g.waiting) records.push_back(group_record(g));
  for (const std::string& r : records)
    if (text.size() + 1 + r.size() <= kMaxHeartbeatBytes) text += " " + r;
  return text;
}

std::optional<Heartbeat> decode_heartbeat(std::string_view datagram, const std::string& secret, std::string* why) {
  if (datagram.size() > kMaxHeartbeatBytes) {
    *why = "oversized";
    return std::nullopt;
  }
  for (char c : datagram)
    if (c < 0x20 || c > 0x7e) {
      *why = "malformed";
      return std::nullopt;
    }
  std::istringstream in{std::string(datagram)};
  std::string magic, their_secret, phase, host;
  Heartbeat b;
  if (!(in >> magic >> their_secret >> b.attempt >> b.rank >> b.pid >> b.step >> phase >> host) || magic != "MOEHB1" ||
      b.attempt < 0 || b.rank < 0 || b.pid <= 0 || b.step < 0) {
    *why = "malformed";
    return std::nullopt;
  }
  for (std::string record; in >> record;)
    if (!decode_record(record, &b.flight)) {
      *why = "malformed";
      return std::nullopt;
    }
  if (!equal_secret(their_secret, secret)) {
    *why = "wrong secret";
    return std::nullopt;
  }
  const auto p = phase_from_name(phase);
  if (!p) {
    *why = "malformed";
    return std::nullopt;
  }
  b.phase = *p;
  b.host = host;
  return b;
}

double phase_timeout(const FaultConfig& f, Phase phase) {
  switch (phase) {
    case Phase::Setup:
    case Phase::CheckpointLoad:
      return std::max(f.setup_timeout_s, phase == Phase::CheckpointLoad ? f.checkpoint_timeout_s : 0.0);
    case Phase::Step:
      return f.step_timeout_s;
    case Phase::Eval:
      return f.eval_timeout_s;
    case Phase::CheckpointSave:
      return f.checkpoint_timeout_s;
    case Phase::Done:
      return 1e18;
  }
  return f.step_timeout_s;
}

HeartbeatSender::HeartbeatSender(int64_t rank, const std::string& host, const FaultConfig& fault,
                                 std::shared_ptr<const FlightRecorder> recorder, std::string flight_dir)
    : rank_(rank),
      host_(host),
      fault_(fault),
      recorder_(std::move(recorder)),
      flight_dir_(std::move(flight_dir)),
      since_(now_s()) {
  const char* addr = std::getenv("MOE_HEARTBEAT_ADDR");
  const char* secret = std::getenv("MOE_HEARTBEAT_SECRET");
  if (addr && secret) {
    secret_ = secret;
    if (const char* attempt = std::getenv("MOE_LAUNCH_ATTEMPT")) attempt_ = std::atoll(attempt);
    const std::string text(addr);
    const size_t colon = text.rfind(':');
    sockaddr_in to{};
    to.sin_family = AF_INET;
    if (colon != std::string::npos && inet_pton(AF_INET, text.substr(0, colon).c_str(), &to.sin_addr) == 1) {
      to.sin_port = htons(uint16_t(std::atoi(text.c_str() + colon + 1)));
      socket_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      // connect() on a datagram socket only fixes the destination: send() then needs no address.
      if (socket_ >= 0 && ::connect(socket_, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
        ::close(socket_);
        socket_ = -1;
      }
    }
  }
  thread_ = std::thread([this] { run(); });
}

HeartbeatSender::~HeartbeatSender() {
  // Unwinding an exception is no finish: the rank stays as last reported, so that the supervisor names it
  // as the one that failed.
  const bool finished = std::uncaught_exceptions() == 0;
  if (finished) set(Phase::Done, step_, "finished");
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (socket_ >= 0) {
    // The last word once more, after the thread's last beat: the supervisor counts a run as finished only when
    // a rank has reported its last step.
    if (finished) send({attempt_, rank_, int64_t(::getpid()), step_, phase_, host_});
    ::close(socket_);
  }
}

void HeartbeatSender::send(Heartbeat beat) {
  if (socket_ < 0) return;
  if (recorder_) beat.flight = recorder_->summary();
  const std::string message = encode_heartbeat(secret_, beat);
  ::send(socket_, message.data(), message.size(), MSG_DONTWAIT | MSG_NOSIGNAL);  // best effort
}

void HeartbeatSender::set(Phase phase, int64_t step, const char* operation) {
  Heartbeat beat;
  bool changed = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    changed = phase != phase_;
    phase_ = phase, step_ = step, operation_ = operation, since_ = now_s();
    beat = {attempt_, rank_, int64_t(::getpid()), step_, phase_, host_};
  }
  // A new phase is reported at once: a phase shorter than the interval (the steps between two checkpoint saves)
  // would otherwise often fall between two beats, and the supervisor would not hear that training began.
  if (changed) send(beat);
}

void HeartbeatSender::run() {
  const auto interval = std::chrono::duration<double>(fault_.heartbeat_interval_s);
  while (!stop_) {
    Heartbeat beat;
    std::string operation;
    double stalled = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      beat = {attempt_, rank_, int64_t(::getpid()), step_, phase_, host_};
      operation = operation_;
      stalled = now_s() - since_;
    }
    send(beat);
    const double limit = phase_timeout(fault_, beat.phase);
    if (stalled > limit) {
      std::fprintf(stderr,
                   "moe: watchdog: rank %lld on %s: %s (phase %s, step %lld) made no progress for %.1f s, more than "
                   "its timeout of %.1f s; ending the job\n",
                   static_cast<long long>(rank_), host_.c_str(), operation.c_str(), phase_name(beat.phase),
                   static_cast<long long>(beat.step), stalled, limit);
      if (recorder_) {
        print_in_flight(rank_, recorder_->summary());
        if (!flight_dir_.empty()) write_flight_dump(*recorder_, flight_dir_, rank_, host_);
      }
      std::fflush(stderr);
      std::_Exit(4);  // mpirun ends the other ranks; the supervisor restarts the job
    }
    std::this_thread::sleep_for(interval);
  }
}

}  // namespace moe
