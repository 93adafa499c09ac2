// ggml's coverage rule for the op conformance suites: after every case of tests/core/test_ops.cpp,
// test_moe_ops.cpp and test_held_ops.cpp has run (this program holds all three), each op of Ops must have run on the
// memory-checking backend, which every case runs on (the "strict" row of conformance::backends()). An op without a case
// fails here, naming it. Registered as one ctest test (the check needs the whole run, not one case at a time).
#include <gtest/gtest.h>

#include <string>

#include "core/backend/strict_ops.h"

namespace moe {
namespace {

class OpCoverage final : public ::testing::Environment {
 public:
  void TearDown() override {
    if (!::testing::GTEST_FLAG(filter).empty() && ::testing::GTEST_FLAG(filter) != "*") return;  // a partial run
    std::string missing;
    for (const std::string& op : ops_not_covered()) missing += " " + op;
    EXPECT_TRUE(missing.empty()) << "ops of Ops without a conformance case (none ran on the strict backend):"
                                 << missing;
  }
};

[[maybe_unused]] ::testing::Environment* const coverage = ::testing::AddGlobalTestEnvironment(new OpCoverage);

}  // namespace
}  // namespace moe
