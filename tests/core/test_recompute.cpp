// Activation recompute (core/model.h Recompute, RecomputeSpec): every mode, on every layer or on the first
// layers only, gives the gradients of keeping everything bit for bit, with two micro-batches in flight on a
// model with MoE layers; and the activation memory falls as documented: full < selective < none, selective
// saving exactly the attention probabilities (B, H, T, T) of every layer of every slot, its backward scratch
// growing by one such set.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/moe_layer.h"
#include "tests/core/moe_test_settings.h"
#include "tests/core/test_backend.h"

namespace moe {
namespace {

constexpr int kSlots = 2;
constexpr int64_t kSeqLen = 6, kBatch = 2;
const ModelShape kShape{31, 16, 3, 2, 24};  // layer 1 is MoE

std::string name_of(const RecomputeSpec& spec) {
  const char* mode = spec.mode == Recompute::None ? "none" : spec.mode == Recompute::Selective ? "selective" : "full";
  return std::string(mode) + " of " + (spec.layers < 0 ? "every layer" : std::to_string(spec.layers) + " layers");
}

std::unique_ptr<Model<float>> make_model(const RecomputeSpec& recompute) {
  return test::stressed_model(test_backend(), kShape, kSeqLen, kBatch, true, recompute, kSlots);
}

std::vector<int32_t> micro_batch_tokens(int mb) { return test::micro_batch_tokens(mb, kBatch, kSeqLen, kShape.vocab); }

// What two micro-batches in flight give: forward slot 0, forward slot 1, backward 1, backward 0.
struct InFlight {
  std::vector<double> losses;
  std::vector<float> grads;
};

InFlight run_in_flight(Model<float>& model) {
  InFlight run;
  model.zero_grads();
  for (int mb = 0; mb < kSlots; ++mb) {
    model.set_context(true, 2, mb * kBatch, 1.0 / kSlots, 99);
    run.losses.push_back(model.forward(mb, micro_batch_tokens(mb).data(), kBatch));
  }
  for (int mb = kSlots - 1; mb >= 0; --mb) model.backward(mb, 1.0 / double(kSlots * kBatch * kSeqLen));
  run.grads.assign(model.grads(), model.grads() + model.num_params());
  return run;
}

TEST(Recompute, EveryModeGivesTheGradientsOfKeepingEverythingBitForBit) {
  auto plain = make_model(Recompute::None);
  const InFlight expected = run_in_flight(*plain);
  for (const RecomputeSpec& spec :
       {RecomputeSpec(Recompute::Selective), RecomputeSpec(Recompute::Full), RecomputeSpec(Recompute::Selective, 1),
        RecomputeSpec(Recompute::Full, 1), RecomputeSpec(Recompute::Full, 0)}) {
    auto model = make_model(spec);
    const InFlight run = run_in_flight(*model);
    EXPECT_EQ(run.losses, expected.losses) << name_of(spec);
    ASSERT_EQ(run.grads.size(), expected.grads.size());
    EXPECT_EQ(0, std::memcmp(run.grads.data(), expected.grads.data(), sizeof(float) * run.grads.size()))
        << name_of(spec);
  }
}

TEST(Recompute, TheModeAppliesToTheLayersOfGlobalIndexBelowRecomputeLayers) {
  auto model = make_model({Recompute::Selective, 2});
  EXPECT_EQ(model->recompute(0), Recompute::Selective);
  EXPECT_EQ(model->recompute(1), Recompute::Selective);
  EXPECT_EQ(model->recompute(2), Recompute::None);
  // A stage of layers [1, 3) counts by the whole model's index.
  Model<float> stage(test_backend(), {.shape = kShape,
                                      .seq_len = kSeqLen,
                                      .max_batch = kBatch,
                                      .recompute = {Recompute::Full, 2},
                                      .stage = {1, 3, false, true}});
  EXPECT_EQ(stage.recompute(1), Recompute::Full);
  EXPECT_EQ(stage.recompute(2), Recompute::None);
  EXPECT_THROW(
      Model<float>(test_backend(),
                   {.shape = kShape, .seq_len = kSeqLen, .max_batch = kBatch, .recompute = {Recompute::Full, 4}}),
      Error);
  EXPECT_THROW(
      Model<float>(test_backend(),
                   {.shape = kShape, .seq_len = kSeqLen, .max_batch = kBatch, .recompute = {Recompute::Full, -2}}),
      Error);
}

TEST(Recompute, ActivationMemoryFallsAsDocumented) {
  auto none = make_model(Recompute::None);
  auto selective = make_model(Recompute::Selective);
  auto full = make_model(Recompute::Full);
  auto selective_first = make_model({Recompute::Selective, 1});
  EXPECT_LT(full->activation_bytes(), selective->activation_bytes());
  EXPECT_LT(selective->activation_bytes(), none->activation_bytes());

  // Selective keeps no probabilities (B, H, T, T) per layer per slot; its scratch holds one set of them.
  const int64_t probs_bytes = kBatch * kShape.heads * kSeqLen * kSeqLen * int64_t(sizeof(float));
  EXPECT_EQ(none->activation_bytes() - selective->activation_bytes(), kSlots * kShape.layers * probs_bytes);
  EXPECT_EQ(none->activation_bytes() - selective_first->activation_bytes(), kSlots * probs_bytes);
  // The layer scratch is the largest of the attentions' and the FFNs' backward scratch.
  const int64_t N = kBatch * kSeqLen;
  int64_t ffn_scratch = 0;
  for (int64_t l = 0; l < kShape.layers; ++l) ffn_scratch = std::max(ffn_scratch, none->ffn(l).scratch_size(N));
  const int64_t attention_scratch = none->attention(0).scratch_size(N) * int64_t(sizeof(float));
  EXPECT_EQ(selective->attention(0).scratch_size(N) * int64_t(sizeof(float)), attention_scratch + probs_bytes);
  ffn_scratch *= int64_t(sizeof(float));
  EXPECT_EQ(selective->scratch_bytes() - none->scratch_bytes(),
            std::max(ffn_scratch, attention_scratch + probs_bytes) - std::max(ffn_scratch, attention_scratch));
  EXPECT_LT(selective->activation_bytes() + selective->scratch_bytes(),
            none->activation_bytes() + none->scratch_bytes());
  RecordProperty("activation_bytes_none", std::to_string(none->activation_bytes()));
  RecordProperty("activation_bytes_selective", std::to_string(selective->activation_bytes()));
  RecordProperty("activation_bytes_full", std::to_string(full->activation_bytes()));
}

// The attention alone: not keeping the probabilities moves B*H*T*T elements from its activations to its
// backward scratch.
TEST(Recompute, AttentionMovesItsProbabilitiesFromActivationsToScratch) {
  MhaAttention<float> attention(test_backend(), kShape.d_model, kShape.heads, kSeqLen, kShape.layers);
  const int64_t N = kBatch * kSeqLen, probs = kBatch * kShape.heads * kSeqLen * kSeqLen;
  const int64_t acts = attention.activation_size(N), scratch = attention.scratch_size(N);
  attention.set_keep_probabilities(false);
  EXPECT_EQ(attention.activation_size(N), acts - probs);
  EXPECT_EQ(attention.scratch_size(N), scratch + probs);
}

}  // namespace
}  // namespace moe
