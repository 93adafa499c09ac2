// The whole flight-recorder ring of a rank as text, written by its watchdog when it ends the rank: the heartbeats
// carry only each group's current collective, the dump the last 256 operations, finished and in flight, for a
// person reading a hang after the fact. RUN_DIR/flight/rank-NNNNN.txt on the rank's host (a later dump of the same
// rank replaces it). Best effort: the process is ending, so a failure to write is said on stderr and nothing more.
#pragma once

#include <cstdint>
#include <string>

#include "parallel/flight_recorder.h"

namespace moe {

// "flight recorder of rank R on HOST, N operations, oldest first, times in seconds before this dump", then one line
// per operation: "<group> #<seq> <op> bytes=<b> peer=<p|-> started=-<s> finished=-<s>|in flight"
// (point-to-point numbers are prefixed "p2p #").
std::string flight_dump_text(const FlightRecorder& recorder, int64_t rank, const std::string& host);
// Writes it to `dir`/rank-NNNNN.txt; the path, or "" when it could not be written.
std::string write_flight_dump(const FlightRecorder& recorder, const std::string& dir, int64_t rank,
                              const std::string& host);

}  // namespace moe
