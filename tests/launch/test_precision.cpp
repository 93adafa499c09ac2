// train.precision = bf16 end to end on one rank: the small MoE model trained with bf16 GEMMs tracks the fp32 run
// (each step's loss within 2% relative, the parameters within 5%) without being the same run; a bf16 run stopped
// and resumed equals the uninterrupted one bit for bit; the weights' rounded copy gives the bits of rounding at
// every GEMM; and the precision may change at a resume (it is not part of what a checkpoint means).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "layout_runs.h"

namespace moe {
namespace {
using namespace test_support;
namespace fs = std::filesystem;

std::vector<std::string> overrides(const std::string& precision) {
  return small_moe_overrides({"train.steps=12", "train.global_batch=2", "train.eval_every=6", "checkpoint.every=6",
                              "train.precision=" + precision});
}

TEST(Precision, Bf16TracksFp32) {
  const fs::path root = shared_temp_root("moe_precision_", "tracks");
  const RunOutput fp32 = train_on(1, overrides("fp32"), (root / "fp32").string());
  const RunOutput bf16 = train_on(1, overrides("bf16"), (root / "bf16").string());
  ASSERT_EQ(fp32.training.size(), 12u);
  ASSERT_EQ(bf16.training.size(), 12u);
  double furthest = 0;
  for (size_t i = 0; i < fp32.training.size(); ++i) {
    const double a = fp32.training[i]["lm_loss"], b = bf16.training[i]["lm_loss"];
    furthest = std::max(furthest, std::abs(a - b) / a);
    EXPECT_LE(std::abs(a - b) / a, 0.02) << "step " << i + 1;
  }
  std::printf("bf16 against fp32: the furthest step's loss %.3g relative\n", furthest);
  EXPECT_GT(furthest, 0) << "bf16 GEMMs round their operands: the losses cannot all be the same bits";
  for (const auto& [name, p] : fp32.result.parameters)
    EXPECT_LE(relative_difference(p, bf16.result.parameters.at(name)), 0.05) << name;
  fs::remove_all(root.parent_path());
}

TEST(Precision, Bf16ResumesBitForBit) {
  const fs::path root = shared_temp_root("moe_precision_", "resume");
  const RunOutput whole = train_on(1, overrides("bf16"), (root / "whole").string());
  train_on(1, overrides("bf16"), (root / "cut").string(), /*stop_after=*/6);
  const RunOutput resumed = train_on(1, overrides("bf16"), (root / "cut").string());
  expect_bitwise_equal(whole, resumed, "bf16 resumed at step 6");
  fs::remove_all(root.parent_path());
}

// The weights' rounded copy (Ops::set_parameter_memory), made at the first forward and then kept by AdamW's
// updates (Ops::adamw_update writes it beside the parameters), gives the bits of rounding them at every GEMM:
// through evaluations and routing probes, a resume, and a frozen backbone's restore (which writes the
// parameters past the copy, so drops it).
void expect_copy_is_rounding_at_every_gemm(const std::vector<std::string>& extra, const std::string& name) {
  const fs::path root = shared_temp_root("moe_precision_", name);
  std::vector<std::string> o = overrides("bf16");
  o.insert(o.end(), extra.begin(), extra.end());
  const RunOutput copied = train_on(1, o, (root / "copied").string());
  ::setenv("MOE_BF16_WEIGHT_COPY", "0", 1);
  const RunOutput each = train_on(1, o, (root / "each").string());
  ::unsetenv("MOE_BF16_WEIGHT_COPY");
  ASSERT_FALSE(copied.evals.empty());
  expect_bitwise_equal(copied, each, "bf16 weights copied (" + name + ") against rounded per GEMM");
  fs::remove_all(root.parent_path());
}

TEST(Precision, Bf16WeightCopyIsTheSameAsRoundingAtEveryGemm) { expect_copy_is_rounding_at_every_gemm({}, "copy"); }

TEST(Precision, Bf16WeightCopyThroughAFrozenBackbone) {
  expect_copy_is_rounding_at_every_gemm({"moe.router.warmup.steps=4", "moe.router.warmup.freeze_backbone=true"},
                                        "frozen");
}

TEST(Precision, Bf16WeightCopyThroughAResume) {
  const fs::path root = shared_temp_root("moe_precision_", "copy_resume");
  train_on(1, overrides("bf16"), (root / "cut").string(), /*stop_after=*/6);
  const RunOutput resumed = train_on(1, overrides("bf16"), (root / "cut").string());
  ::setenv("MOE_BF16_WEIGHT_COPY", "0", 1);
  const RunOutput each = train_on(1, overrides("bf16"), (root / "each").string());
  ::unsetenv("MOE_BF16_WEIGHT_COPY");
  expect_bitwise_equal(each, resumed, "bf16 resumed with the copy against rounded per GEMM");
  fs::remove_all(root.parent_path());
}

// A checkpoint of an fp32 run resumed in bf16: allowed without --allow-config-change, and from the resumed step
// on the run is the bf16 run of those parameters.
TEST(Precision, PrecisionMayChangeAtAResume) {
  const fs::path root = shared_temp_root("moe_precision_", "change");
  train_on(1, overrides("fp32"), (root / "run").string(), /*stop_after=*/6);
  const RunOutput resumed = train_on(1, overrides("bf16"), (root / "run").string());
  ASSERT_FALSE(resumed.training.empty());
  EXPECT_EQ(resumed.training.back()["step"], 12);
  fs::remove_all(root.parent_path());
}

}  // namespace
}  // namespace moe
