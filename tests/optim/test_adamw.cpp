// AdamW against a straightforward double-precision transcription of the update; the schedule's shape;
// clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "core/backend/backend.h"
#include "optim/adamw.h"

namespace moe {
namespace {

Backend& backend() {
  static const std::unique_ptr<Backend> b = make_cpu_backend(0);
  return *b;
}

TEST(AdamW, MatchesReferenceUpdateAndSkipsDecayWhereAsked) {
  ParamTable table;
  table.add({"w", {3}, ParamRole::Dense, true});
  table.add({"gain", {2}, ParamRole::Norm, false});
  AdamWSettings s{0.1, 0.9, 0.95, 1e-8, 0.5};
  AdamW opt(backend(), table, s);
  std::vector<float> p = {1.0f, -2.0f, 0.5f, 1.0f, 1.0f};
  std::vector<double> ref(p.begin(), p.end()), m(5, 0), v(5, 0);
  const std::vector<std::vector<float>> grads = {{0.1f, -0.3f, 0.0f, 0.2f, -0.1f}, {0.05f, 0.1f, 1.0f, -0.2f, 0.3f}};
  const double lrs[2] = {0.1, 0.05};
  for (int t = 1; t <= 2; ++t) {
    opt.step(p.data(), grads[t - 1].data(), lrs[t - 1]);
    for (int i = 0; i < 5; ++i) {
      const double g = grads[t - 1][i];
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.95 * v[i] + 0.05 * g * g;
      const double decay = i < 3 ? lrs[t - 1] * 0.5 : 0.0;
      ref[i] -= decay * ref[i];
      ref[i] -= lrs[t - 1] * (m[i] / (1 - std::pow(0.9, t))) / (std::sqrt(v[i] / (1 - std::pow(0.95, t))) + 1e-8);
    }
  }
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(p[i], ref[i], 1e-6) << i;
  EXPECT_EQ(opt.steps_taken(), 2);
}

TEST(LrSchedule, WarmupThenCosineToFloor) {
  LrSchedule s{1.0, 0.1, 4, 15};
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(4), 1.0);
  EXPECT_NEAR(s.at(14), 0.1, 1e-12);
  for (int64_t i = 4; i < 14; ++i) EXPECT_GT(s.at(i), s.at(i + 1));
  EXPECT_NEAR(s.at(9), 0.55, 1e-12);  // midpoint of the cosine is the mean of lr and min_lr
}

TEST(Clip, ScalesOnlyAboveTheThreshold) {
  std::vector<float> g = {3.0f, 4.0f};
  EXPECT_DOUBLE_EQ(clip_grad_norm(backend(), g.data(), 2, 10.0), 5.0);
  EXPECT_EQ(g[0], 3.0f);
  EXPECT_DOUBLE_EQ(clip_grad_norm(backend(), g.data(), 2, 1.0), 5.0);
  EXPECT_NEAR(std::hypot(double(g[0]), double(g[1])), 1.0, 1e-6);
  EXPECT_DOUBLE_EQ(clip_grad_norm(backend(), g.data(), 2, 0.0), std::hypot(double(g[0]), double(g[1])));
}

}  // namespace
}  // namespace moe

#include "optim/per_expert_clip.h"

namespace moe {
namespace {

TEST(PerExpertClip, GroupsExpertsAndClipsToTheAverageAfterTenSamples) {
  ParamTable table;
  table.add({"layers.0.ffn.router.weight", {2, 2}, ParamRole::Router, true});
  table.add({"layers.0.ffn.experts.w1", {2, 3}, ParamRole::Expert, true});  // 2 experts of 3
  table.add({"layers.0.ffn.experts.w2", {2, 1}, ParamRole::Expert, true});  // 2 experts of 1
  PerExpertClip clip(table, 2.0);
  ASSERT_EQ(clip.experts().size(), 2u);
  EXPECT_EQ(clip.experts()[1].slices, (std::vector<std::pair<int64_t, int64_t>>{{7, 3}, {11, 1}}));
  std::vector<float> g(table.numel());
  auto fill = [&](float expert0, float expert1) {
    std::fill(g.begin(), g.end(), 0.0f);
    g[4] = expert0;  // w1 of expert 0
    g[7] = expert1;  // w1 of expert 1 (router 0..3, w1 4..9, w2 10..11)
  };
  for (int i = 0; i < 10; ++i) {  // ten samples of norm 1: never clipped while collecting
    fill(1.0f, 1.0f);
    EXPECT_EQ(clip.apply(g.data()), 0);
  }
  fill(5.0f, 1.5f);  // expert 0 above 2 x average 1: clipped to 2; expert 1 below: untouched
  EXPECT_EQ(clip.apply(g.data()), 1);
  EXPECT_NEAR(g[4], 2.0f, 1e-5);
  EXPECT_EQ(g[7], 1.5f);
  EXPECT_NEAR(clip.experts()[0].last_norm, 5.0, 1e-12);  // the average takes the unclipped norm
}

// Frequency-aware clipping: each expert's threshold times its scale (hot 0.5, cold 1.0 in the articles).
TEST(PerExpertClip, ThresholdScalesTightenHotExperts) {
  ParamTable table;
  table.add({"layers.0.ffn.experts.w1", {2, 1}, ParamRole::Expert, true});  // 2 experts of 1
  PerExpertClip clip(table, 2.0);
  std::vector<float> g(2);
  for (int i = 0; i < 10; ++i) {  // ten samples of norm 1
    g = {1.0f, 1.0f};
    clip.apply(g.data());
  }
  // Both at 1.5, under 2 x average 1: only expert 0, hot (threshold 0.5 x 2 = 1), is clipped, to 1.
  g = {1.5f, 1.5f};
  const std::vector<double> scales = {0.5, 1.0};
  EXPECT_EQ(clip.clip(g.data(), clip.sum_squares(g.data(), nullptr), nullptr, &scales), 1);
  EXPECT_NEAR(g[0], 1.0f, 1e-6);
  EXPECT_EQ(g[1], 1.5f);
}

}  // namespace
}  // namespace moe
