// The project's one error type. Libraries throw it; only the program's entry point decides to exit.
// BadInput (config, command line, data, checkpoint that does not fit) maps to exit code 2; RunFailed (a
// run that cannot go on through no fault of the program: it diverged, its last checkpoint could not be
// written) and Internal (a bug) to exit code 1. The message says what was wrong, with which value, and what to do.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace moe {

enum class ErrorKind { BadInput, Internal, RunFailed };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const char* file, int line, const std::string& message);
  ErrorKind kind() const { return kind_; }
  const std::string& file() const { return file_; }
  int line() const { return line_; }
  // The plain message, without file/line/rank decoration (what a user reads).
  const std::string& message() const { return message_; }

 private:
  ErrorKind kind_;
  std::string file_;
  int line_;
  std::string message_;
};

// Rank and host that errors are tagged with; set once by the program's entry point.
void set_error_context(int rank, const std::string& host);
std::string error_context();

}  // namespace moe

#define MOE_STR_CAT(expr)                   \
  ([&]() {                                  \
    std::ostringstream moe_message_stream_; \
    moe_message_stream_ << expr;            \
    return moe_message_stream_.str();       \
  }())
// Invariant of the program itself: failure is a bug (exit 1).
#define MOE_CHECK(cond, msg)                                               \
  do {                                                                     \
    if (!(cond))                                                           \
      throw ::moe::Error(::moe::ErrorKind::Internal, __FILE__, __LINE__,   \
                         MOE_STR_CAT("check failed: " #cond ": " << msg)); \
  } while (0)
// Bad user input (exit 2).
#define MOE_BAD_INPUT(msg) throw ::moe::Error(::moe::ErrorKind::BadInput, __FILE__, __LINE__, MOE_STR_CAT(msg))
// The run cannot go on, and the message says why and what to do (exit 1, not reported as a bug).
#define MOE_RUN_FAILED(msg) throw ::moe::Error(::moe::ErrorKind::RunFailed, __FILE__, __LINE__, MOE_STR_CAT(msg))
#define MOE_FAIL(msg) throw ::moe::Error(::moe::ErrorKind::Internal, __FILE__, __LINE__, MOE_STR_CAT(msg))
