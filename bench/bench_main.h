// The end of every benchmark's main(): parse the command line, run, and map the outcome to the exit codes
// of the `moe` program (0 success, 2 bad command line, 1 anything else). Like `moe`, a benchmark runs the
// OpenBLAS kernels this CPU has (core/backend/cpu/blas_kernels.h): it measures what users get.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "core/backend/cpu/blas_kernels.h"

namespace moe::bench {

// The kernels, then the command line: -1 where it parsed, else the exit code (0 after --help, 2 for a bad one).
inline int choose_kernels_and_parse(CLI::App& app, int argc, char** argv) {
  cpu::choose_blas_kernels(argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return -1;
}

template <typename Run>
int parse_and_run(CLI::App& app, int argc, char** argv, const char* name, Run run) {
  if (const int code = choose_kernels_and_parse(app, argc, argv); code >= 0) return code;
  try {
    run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
  return 0;
}

}  // namespace moe::bench
