// A parameter spec names its split (core/params.h): the axis-0 short form of expert sharding and the split
// agree, an axis-1 block initialises as its part of the whole tensor, and the replica group follows the role.
#include <gtest/gtest.h>

#include <vector>

#include "core/params.h"

namespace moe {
namespace {

constexpr int64_t kRows = 6, kCols = 10;

TEST(ParamSplit, AxisOneBlockInitialisesAsItsPartOfTheWholeTensor) {
  ParamTable full, block;
  full.add({"w", {kRows, kCols}, ParamRole::Dense, true, ParamInit::Normal, 0.02});
  ParamSpec spec{"w", {kRows, 4}, ParamRole::Dense, true, ParamInit::Normal, 0.02};
  spec.split = {1, kCols, 3, ParamGroup::TensorParallel};
  block.add(spec);
  const ParamSpec& s = block.find("w");
  EXPECT_EQ(s.global_shape(), (std::vector<int64_t>{kRows, kCols}));
  EXPECT_EQ(s.global_start(), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(s.replicas, ParamGroup::DataParallel);
  EXPECT_EQ(s.global_rows, 0);  // no axis-0 short form for an axis-1 split
  std::vector<float> all(size_t(kRows * kCols)), mine(size_t(kRows * 4));
  full.initialize(all.data(), 7);
  block.initialize(mine.data(), 7);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < 4; ++c) {
      EXPECT_EQ(mine[size_t(r * 4 + c)], all[size_t(r * kCols + 3 + c)]) << r << "," << c;
      EXPECT_EQ(s.global_index(r * 4 + c), r * kCols + 3 + c);
    }
}

TEST(ParamSplit, AxisZeroShortFormAndSplitAgree) {
  ParamTable t;
  t.add({"experts.w1", {2, 3, 5}, ParamRole::Expert, true, ParamInit::Normal, 0.02, 4, 2});
  const ParamSpec& s = t.find("experts.w1");
  EXPECT_EQ(s.split.axis, 0);
  EXPECT_EQ(s.split.global_size, 4);
  EXPECT_EQ(s.split.offset, 2);
  EXPECT_EQ(s.split.group, ParamGroup::ExpertParallel);
  EXPECT_EQ(s.replicas, ParamGroup::ExpertDataParallel);
  EXPECT_EQ(s.global_start(), (std::vector<int64_t>{2, 0, 0}));
  ParamSpec by_split{"experts.w3", {2, 3, 5}, ParamRole::Expert, true};
  by_split.split = {0, 4, 2, ParamGroup::ExpertParallel};
  t.add(by_split);
  EXPECT_EQ(t.find("experts.w3").global_rows, 4);
  EXPECT_EQ(t.find("experts.w3").shard_offset, 2);
}

}  // namespace
}  // namespace moe
