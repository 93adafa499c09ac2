// Where and when: this machine's host name and the current UTC time as ISO 8601, for manifests, logs and
// error messages. One definition for every library.
#pragma once

#include <unistd.h>

#include <ctime>
#include <string>

namespace moe {

inline std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

inline std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace moe
