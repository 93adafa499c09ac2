// A parameter spec names its split (core/params.h): the axis-0 short form of expert sharding and the split
// agree, an axis-1 block initialises as its part of the whole tensor, and the replica group follows the role.
// An expert tensor split over ep on axis 0 and over etp on its hidden axis (TpShard::block_of's second
// split): its box's start, shape and indices, its initialisation as that box of the whole tensor, and the
// (ep, etp) blocks tiling the tensor exactly once.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
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

// Experts of a layer: E experts, D model width, F hidden width; w1 is (E, D, F), w2 (E, F, D).
constexpr int64_t kE = 4, kD = 3, kF = 10, kEp = 2, kEtp = 2;

// Expert tensor `name` of global shape (E, rows, cols) as held by ep rank `ep` and etp rank `etp`: axis 0
// over ep (the short form), then `hidden_axis` (1 or 2) over etp.
ParamSpec expert_block(const std::string& name, int64_t rows, int64_t cols, int hidden_axis, int64_t ep, int64_t etp) {
  const int64_t El = kE / kEp;
  const ParamSpec local{name, {El, rows, cols}, ParamRole::Expert, true, ParamInit::Normal, 0.02, kE, ep * El};
  return TpShard{kEtp, etp}.block_of(local, hidden_axis, ParamGroup::ExpertTensorParallel);
}

// The gated MLPs' W13 (E, D, 2, F), parts W1 and W3 stacked on its third axis: every (ep, etp) block initialises each
// part as the (E, D, F) tensor of the part's name would be (so a run draws the values it drew when W1 and W3 were two
// tensors), and part_of names where each element comes from.
TEST(ParamSplit, StackedPartsInitialiseAsTheTensorsOfTheirNames) {
  ParamTable parts;
  for (const char* name : {"experts.w1", "experts.w3"})
    parts.add({name, {kE, kD, kF}, ParamRole::Expert, true, ParamInit::Normal, 0.02});
  std::vector<float> whole(size_t(parts.numel()));
  parts.initialize(whole.data(), 7);
  const int64_t El = kE / kEp, Fl = kF / kEtp;
  for (int64_t ep = 0; ep < kEp; ++ep)
    for (int64_t etp = 0; etp < kEtp; ++etp) {
      ParamSpec local{"experts.w13", {El, kD, 2, kF}, ParamRole::Expert, true, ParamInit::Normal, 0.02, kE, ep * El};
      local.parts = {"experts.w1", "experts.w3"};
      ParamTable block;
      block.add(TpShard{kEtp, etp}.block_of(local, 3, ParamGroup::ExpertTensorParallel));
      const ParamSpec& s = block.find("experts.w13");
      EXPECT_EQ(s.global_shape(), (std::vector<int64_t>{kE, kD, 2, kF}));
      std::vector<float> mine(size_t(s.numel));
      block.initialize(mine.data(), 7);
      for (int64_t e = 0; e < El; ++e)
        for (int64_t d = 0; d < kD; ++d)
          for (int64_t j = 0; j < 2; ++j)
            for (int64_t f = 0; f < Fl; ++f) {
              const int64_t local_index = ((e * kD + d) * 2 + j) * Fl + f;
              const int64_t in_part = ((ep * El + e) * kD + d) * kF + etp * Fl + f;
              EXPECT_EQ(mine[size_t(local_index)], whole[size_t(j * kE * kD * kF + in_part)])
                  << "ep " << ep << " etp " << etp << " (" << e << "," << d << "," << j << "," << f << ")";
              EXPECT_EQ(s.part_of(s.global_index(local_index)), (std::pair<size_t, int64_t>{size_t(j), in_part}));
            }
    }
  ParamSpec wrong{"w13", {3, 3, 4}, ParamRole::Dense, true};
  wrong.parts = {"w1", "w3"};  // 2 parts on an axis of 3
  EXPECT_THROW(ParamTable().add(wrong), Error);
}

TEST(ParamSplit, TwoAxisBlockIsItsBoxOfTheWholeTensor) {
  ParamTable full, block;
  full.add({"experts.w1", {kE, kD, kF}, ParamRole::Expert, true, ParamInit::Normal, 0.02});
  block.add(expert_block("experts.w1", kD, kF, 2, 1, 1));
  const ParamSpec& s = block.find("experts.w1");
  EXPECT_EQ(s.shape, (std::vector<int64_t>{2, kD, 5}));
  EXPECT_EQ(s.split.axis, 0);
  EXPECT_EQ(s.split.group, ParamGroup::ExpertParallel);
  EXPECT_EQ(s.split2.axis, 2);
  EXPECT_EQ(s.split2.global_size, kF);
  EXPECT_EQ(s.split2.offset, 5);
  EXPECT_EQ(s.split2.group, ParamGroup::ExpertTensorParallel);
  EXPECT_EQ(s.global_rows, kE);
  EXPECT_EQ(s.shard_offset, 2);
  EXPECT_TRUE(s.is_split());
  EXPECT_EQ(s.replicas, ParamGroup::ExpertDataParallel);
  EXPECT_EQ(s.global_shape(), (std::vector<int64_t>{kE, kD, kF}));
  EXPECT_EQ(s.global_start(), (std::vector<int64_t>{2, 0, 5}));
  std::vector<float> all(size_t(kE * kD * kF)), mine(size_t(s.numel));
  full.initialize(all.data(), 11);
  block.initialize(mine.data(), 11);
  int64_t i = 0;
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t d = 0; d < kD; ++d)
      for (int64_t f = 0; f < 5; ++f, ++i) {
        const int64_t g = ((2 + e) * kD + d) * kF + 5 + f;
        EXPECT_EQ(s.global_index(i), g) << e << "," << d << "," << f;
        EXPECT_EQ(mine[size_t(i)], all[size_t(g)]) << e << "," << d << "," << f;
      }
}

TEST(ParamSplit, EveryEpEtpBlockPairCoversTheTensorOnce) {
  for (const int hidden_axis : {2, 1}) {  // w1 and w3 (E, D, F); w2 (E, F, D)
    const int64_t rows = hidden_axis == 2 ? kD : kF, cols = hidden_axis == 2 ? kF : kD;
    std::vector<int> hits(size_t(kE * rows * cols), 0);
    for (int64_t ep = 0; ep < kEp; ++ep)
      for (int64_t etp = 0; etp < kEtp; ++etp) {
        ParamTable t;
        t.add(expert_block("experts.w", rows, cols, hidden_axis, ep, etp));
        const ParamSpec& s = t.find("experts.w");
        EXPECT_EQ(s.global_shape(), (std::vector<int64_t>{kE, rows, cols}));
        for (int64_t i = 0; i < s.numel; ++i) ++hits[size_t(s.global_index(i))];
      }
    for (size_t g = 0; g < hits.size(); ++g) EXPECT_EQ(hits[g], 1) << "axis " << hidden_axis << ", element " << g;
  }
}

TEST(ParamSplit, TpShardBlockOfKeepsItsOneSplitAndRefusesBadSecondSplits) {
  const ParamSpec whole{"w", {kRows, kCols}, ParamRole::Dense, true};
  const ParamSpec cols = TpShard{2, 1}.block_of(whole, 1);
  EXPECT_EQ(cols.split.axis, 1);
  EXPECT_EQ(cols.split.offset, 5);
  EXPECT_EQ(cols.split.group, ParamGroup::TensorParallel);
  EXPECT_EQ(cols.split2.axis, -1);
  EXPECT_FALSE(TpShard{}.block_of(whole, 1).is_split());
  ParamTable t;
  t.add(cols);
  EXPECT_EQ(t.find("w").replicas, ParamGroup::DataParallel);
  ParamSpec same_axis = cols;  // a second split on the first one's axis
  same_axis.name = "same_axis";
  same_axis.split2 = same_axis.split;
  EXPECT_THROW(t.add(same_axis), Error);
  ParamSpec outside = TpShard{2, 1}.block_of(cols, 0);  // rows [3, 6) of 6, then moved past the end
  outside.name = "outside";
  EXPECT_EQ(outside.split2.axis, 0);
  outside.split2.offset = 4;
  EXPECT_THROW(t.add(outside), Error);
  ParamSpec alone = whole;  // a second split without a first
  alone.name = "alone";
  alone.shape = {kRows, 5};
  alone.split2 = {1, kCols, 0, ParamGroup::TensorParallel};
  EXPECT_THROW(t.add(alone), Error);
}

}  // namespace
}  // namespace moe
