// Test helper: the CPU backend every core test program computes on, made once per program (its thread
// count is OpenMP's default, as before the backend object existed). Tests only; the program makes its
// own backend in main.
#pragma once

#include <memory>

#include "core/backend/backend.h"

namespace moe {

inline Backend& test_backend() {
  static const std::unique_ptr<Backend> backend = make_cpu_backend(0);
  return *backend;
}

}  // namespace moe
