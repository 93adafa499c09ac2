// The gtest main of multi-rank tests (moe_add_mpi_test in CMakeLists.txt): every rank runs every test in
// the same order; rank 0 prints the usual report, other ranks print only their failures (tagged with the
// rank); the failure count is all-reduced, so every rank exits 1 when any rank failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

#include "core/error.h"
#include "parallel/mpi_communicator.h"

namespace {

// On ranks other than 0: a rank-local failure must still be seen, so print failed assertions only.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  moe::MpiCommunicator::initialize(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int host_length = 0;
  MPI_Get_processor_name(host, &host_length);
  moe::set_error_context(rank, std::string(host, host_length));

  ::testing::InitGoogleTest(&argc, argv);
  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  const int result = RUN_ALL_TESTS();

  int failed_local = result != 0 ? 1 : 0;
  int failed_ranks = 0;
  MPI_Allreduce(&failed_local, &failed_ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0 && failed_ranks > 0)
    std::fprintf(stderr, "%d of %d ranks failed (failures on other ranks are printed with their rank)\n", failed_ranks,
                 size);
  moe::MpiCommunicator::finalize();
  return failed_ranks > 0 ? 1 : 0;
}
