// The end of an MPI benchmark's main(), as bench_main.h's parse_and_run is for the others: the OpenBLAS kernels
// users get (chosen before MPI starts: choosing may execute the program again), the command line, MPI, then `run`
// with the world. Exit codes of the `moe` program: 0 success; 2 bad input (a bad command line, or a moe::Error of
// kind BadInput, which every rank finds alike: rank 0 says it once); 1 anything else, after aborting the world,
// whose other ranks may be waiting in a collective.
#pragma once

#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "bench/bench_main.h"
#include "core/error.h"
#include "parallel/mpi_communicator.h"

namespace moe::bench {

template <typename Run>
int parse_and_run_mpi(CLI::App& app, int argc, char** argv, const char* name, Run run) {
  if (const int code = choose_kernels_and_parse(app, argc, argv); code >= 0) return code;
  int rank = 0, size = 1;
  try {
    MpiCommunicator::initialize(&argc, &argv);  // also without mpirun: one rank; finalized at exit
    std::unique_ptr<MpiCommunicator> world = MpiCommunicator::world();
    rank = world->rank(), size = world->size();
    char host[MPI_MAX_PROCESSOR_NAME] = {};
    int host_length = 0;
    MPI_Get_processor_name(host, &host_length);
    set_error_context(rank, std::string(host, size_t(host_length)));
    run(*world);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::BadInput) {
      if (rank == 0) std::fprintf(stderr, "%s: error: %s\n", name, e.message().c_str());
      return 2;
    }
    std::fprintf(stderr, "%s: internal error (%s, %s:%d): %s\n", name, error_context().c_str(), e.file().c_str(),
                 e.line(), e.message().c_str());
    if (size > 1) MpiCommunicator::abort(1);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error (%s): %s\n", name, error_context().c_str(), e.what());
    if (size > 1) MpiCommunicator::abort(1);
    return 1;
  }
  return 0;
}

}  // namespace moe::bench
