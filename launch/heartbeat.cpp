// Heartbeat encoding and the sender/watchdog thread.
#include "launch/heartbeat.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>

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

std::string encode_heartbeat(const std::string& secret, const Heartbeat& b) {
  std::ostringstream out;
  out << "MOEHB1 " << secret << ' ' << b.attempt << ' ' << b.rank << ' ' << b.pid << ' ' << b.step << ' '
      << phase_name(b.phase) << ' ' << b.host;
  return out.str();
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
  std::string magic, their_secret, phase, host, extra;
  Heartbeat b;
  if (!(in >> magic >> their_secret >> b.attempt >> b.rank >> b.pid >> b.step >> phase >> host) || (in >> extra) ||
      magic != "MOEHB1" || b.attempt < 0 || b.rank < 0 || b.pid <= 0 || b.step < 0) {
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

HeartbeatSender::HeartbeatSender(int64_t rank, const std::string& host, const FaultConfig& fault)
    : rank_(rank), host_(host), fault_(fault), since_(now_s()) {
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

void HeartbeatSender::send(const Heartbeat& beat) {
  if (socket_ < 0) return;
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
      std::fflush(stderr);
      std::_Exit(4);  // mpirun ends the other ranks; the supervisor restarts the job
    }
    std::this_thread::sleep_for(interval);
  }
}

}  // namespace moe
