// The error type's construction and the process's error context (rank, host).
#include "core/error.h"

namespace moe {
namespace {
// Written once at start-up by the entry point, before any thread exists.
struct ErrorContext {
  int rank = -1;
  std::string host;
};
ErrorContext& context() {
  static ErrorContext c;
  return c;
}
}  // namespace

void set_error_context(int rank, const std::string& host) {
  context().rank = rank;
  context().host = host;
}

std::string error_context() {
  const ErrorContext& c = context();
  if (c.rank < 0) return {};
  return "rank " + std::to_string(c.rank) + " on " + c.host;
}

Error::Error(ErrorKind kind, const char* file, int line, const std::string& message)
    : std::runtime_error(message), kind_(kind), file_(file), line_(line), message_(message) {}

}  // namespace moe
