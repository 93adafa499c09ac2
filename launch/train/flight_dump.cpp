// The flight recorder's ring as text.
#include "launch/train/flight_dump.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace moe {

std::string flight_dump_text(const FlightRecorder& recorder, int64_t rank, const std::string& host) {
  const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  const std::vector<FlightEntry> entries = recorder.entries();
  std::ostringstream out;
  out << "flight recorder of rank " << rank << " on " << host << ", " << entries.size()
      << " operations, oldest first, times in seconds before this dump\n";
  char times[96];
  for (const FlightEntry& e : entries) {
    out << recorder.group_name(e.group) << (flight_op_is_p2p(e.op) ? " p2p #" : " #") << e.seq << ' '
        << flight_op_name(e.op) << " bytes=" << e.bytes << " peer=";
    if (e.peer >= 0)
      out << e.peer;
    else
      out << '-';
    if (e.finished > 0)
      std::snprintf(times, sizeof times, " started=-%.3f finished=-%.3f", now - e.started, now - e.finished);
    else
      std::snprintf(times, sizeof times, " started=-%.3f in flight", now - e.started);
    out << times << '\n';
  }
  return out.str();
}

std::string write_flight_dump(const FlightRecorder& recorder, const std::string& dir, int64_t rank,
                              const std::string& host) {
  namespace fs = std::filesystem;
  char name[32];
  std::snprintf(name, sizeof name, "rank-%05lld.txt", static_cast<long long>(rank));
  const fs::path path = fs::path(dir) / name;
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::ofstream out(path, std::ios::trunc);
  out << flight_dump_text(recorder, rank, host);
  out.close();
  if (!out) {
    std::fprintf(stderr, "moe: watchdog: could not write the flight recorder to %s\n", path.c_str());
    return "";
  }
  std::fprintf(stderr, "moe: watchdog: rank %lld's last operations are in %s\n", static_cast<long long>(rank),
               path.c_str());
  return path.string();
}

}  // namespace moe
