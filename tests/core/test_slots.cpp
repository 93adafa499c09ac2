// Micro-batch slots: several micro-batches forwarded before any backward, then backwards in any order,
// give the same gradients as one micro-batch at a time. Gradients accumulate with +=, so another
// backward order sums the same contributions in another float order; the test therefore compares
// each micro-batch's own contribution (gradients zeroed, one backward, gradients read), which must be
// bitwise equal to the sequential run's, together with its loss, router losses and routing statistics.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/moe_layer.h"
#include "tests/core/moe_test_settings.h"
#include "tests/core/test_backend.h"

namespace moe {
namespace {

constexpr int kMicroBatches = 4;
constexpr int64_t kSeqLen = 6, kBatch = 2;
const ModelShape kShape{31, 16, 3, 2, 24};

std::unique_ptr<Model<float>> make_model(bool with_moe, Recompute recompute, int slots) {
  return test::stressed_model(test_backend(), kShape, kSeqLen, kBatch, with_moe, recompute, slots);
}

std::vector<int32_t> micro_batch_tokens(int mb) { return test::micro_batch_tokens(mb, kBatch, kSeqLen, kShape.vocab); }

// What one micro-batch gives: its loss, router losses and gradient contribution.
struct Contribution {
  double loss = 0, router_loss = 0;
  std::vector<float> grads;
};

void set_micro_batch_context(Model<float>& model, int mb) {
  model.set_context(true, 2, mb * kBatch, 1.0 / kMicroBatches, 99);
}

std::vector<float> backward_alone(Model<float>& model, int slot) {
  model.zero_grads();
  model.backward(slot, 1.0 / double(kMicroBatches * kBatch * kSeqLen));
  return std::vector<float>(model.grads(), model.grads() + model.num_params());
}

std::vector<int64_t> expert_counts(Model<float>& model, int64_t* shuffled) {
  std::vector<int64_t> counts;
  for (int64_t l = 0; l < model.num_layers(); ++l)
    if (const RouterStepStats* st = model.ffn(l).router_stats()) {
      counts.insert(counts.end(), st->tokens_per_expert.begin(), st->tokens_per_expert.end());
      counts.push_back(st->groups), counts.push_back(st->tokens);
      *shuffled += st->dropped + st->rerouted;
    }
  return counts;
}

void reset_stats(Model<float>& model) {
  for (int64_t l = 0; l < model.num_layers(); ++l)
    if (auto* m = dynamic_cast<MoeLayer<float>*>(&model.ffn(l))) m->reset_stats();
}

void check_orders(bool with_moe, Recompute recompute) {
  const std::string what = std::string(with_moe ? "moe" : "dense") + (recompute == Recompute::Full        ? " recompute"
                                                                      : recompute == Recompute::Selective ? " selective"
                                                                                                          : "");
  // Sequential: forward 0, backward 0, forward 1, backward 1, ... in one slot.
  auto sequential = make_model(with_moe, recompute, 1);
  std::vector<Contribution> expected(kMicroBatches);
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    set_micro_batch_context(*sequential, mb);
    expected[mb].loss = sequential->forward(micro_batch_tokens(mb).data(), kBatch);
    expected[mb].router_loss = sequential->last_router_loss();
    expected[mb].grads = backward_alone(*sequential, 0);
  }
  int64_t shuffled = 0;
  const std::vector<int64_t> expected_counts = expert_counts(*sequential, &shuffled);
  if (with_moe) {
    ASSERT_GT(shuffled, 0) << "capacity must drop or reroute something for the test to mean much";
  }

  auto slotted = make_model(with_moe, recompute, kMicroBatches);
  for (const std::vector<int>& order : {std::vector<int>{0, 1, 2, 3}, {3, 2, 1, 0}, {2, 0, 3, 1}}) {
    reset_stats(*slotted);
    for (int mb = 0; mb < kMicroBatches; ++mb) {
      set_micro_batch_context(*slotted, mb);
      EXPECT_EQ(slotted->forward(mb, micro_batch_tokens(mb).data(), kBatch), expected[mb].loss) << what;
    }
    for (int mb = 0; mb < kMicroBatches; ++mb) EXPECT_EQ(slotted->router_loss(mb), expected[mb].router_loss) << what;
    for (int mb : order) {
      const std::vector<float> grads = backward_alone(*slotted, mb);
      ASSERT_EQ(grads, expected[mb].grads)
          << what << ": micro-batch " << mb << " in order " << order[0] << order[1] << order[2] << order[3];
    }
    int64_t unused = 0;
    EXPECT_EQ(expert_counts(*slotted, &unused), expected_counts) << what << ": statistics counted once per forward";
  }
}

TEST(MicroBatchSlots, DenseBackwardsInAnyOrder) { check_orders(false, Recompute::None); }
TEST(MicroBatchSlots, DenseBackwardsInAnyOrderWithRecompute) { check_orders(false, Recompute::Full); }
TEST(MicroBatchSlots, MoeWithCapacityAndRerouteBackwardsInAnyOrder) { check_orders(true, Recompute::None); }
TEST(MicroBatchSlots, MoeWithCapacityAndRerouteBackwardsInAnyOrderWithRecompute) {
  check_orders(true, Recompute::Full);
}
TEST(MicroBatchSlots, MoeWithCapacityAndRerouteBackwardsInAnyOrderWithSelectiveRecompute) {
  check_orders(true, Recompute::Selective);
}

// A slot keeps its micro-batch until the next forward into it: a backward of an empty slot is refused.
TEST(MicroBatchSlots, BackwardOfAnEmptySlotIsRefused) {
  auto model = make_model(false, Recompute::None, 2);
  set_micro_batch_context(*model, 0);
  model->forward(0, micro_batch_tokens(0).data(), kBatch);
  EXPECT_THROW(model->backward(1, 1.0), Error);
  EXPECT_THROW(model->forward(2, micro_batch_tokens(0).data(), kBatch), Error);
}

}  // namespace
}  // namespace moe
