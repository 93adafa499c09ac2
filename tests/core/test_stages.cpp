// Pipeline stages: the model split into stages (layers [first, last), the embedding on the first, the head
// on the last), run by a 1F1B schedule with activations and gradients passed between stages by hand, gives
// the whole model's losses and gradients bit for bit. Each stage holds only its own parameters under the
// whole model's names; each micro-batch lives in a slot (stage s of P keeps at most P - s in flight).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/model.h"
#include "core/moe_layer.h"
#include "parallel/pp_schedule.h"
#include "tests/core/moe_test_settings.h"
#include "tests/core/test_backend.h"

namespace moe {
namespace {

constexpr int kMicroBatches = 5;
constexpr int64_t kSeqLen = 6, kBatch = 2;
const ModelShape kShape{31, 16, 6, 2, 24};
const double kLossScale = 1.0 / double(kMicroBatches * kBatch * kSeqLen);

std::unique_ptr<Model<float>> make_model(bool with_moe, const RecomputeSpec& recompute, int slots,
                                         const StageSpec& stage, GemmPrecision precision = GemmPrecision::Fp32) {
  return test::stressed_model(test_backend(), kShape, kSeqLen, kBatch, with_moe, recompute, slots, stage, precision);
}

std::vector<int32_t> micro_batch_tokens(int mb) { return test::micro_batch_tokens(mb, kBatch, kSeqLen, kShape.vocab); }

void set_micro_batch_context(Model<float>& model, int mb) {
  model.set_context(true, 2, mb * kBatch, 1.0 / kMicroBatches, 99);
}

// Each tensor of a model's table, by name.
std::map<std::string, std::vector<float>> by_name(const Model<float>& model, const float* flat) {
  std::map<std::string, std::vector<float>> out;
  for (const ParamSpec& s : model.table().specs())
    out[s.name] = std::vector<float>(flat + s.offset, flat + s.offset + s.numel);
  return out;
}

// The whole model, one micro-batch at a time: each micro-batch's loss, and the accumulated gradients.
struct Reference {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params, grads;
};

Reference whole_model(bool with_moe, GemmPrecision precision = GemmPrecision::Fp32) {
  auto model = make_model(with_moe, Recompute::None, 1, {}, precision);
  Reference ref;
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    set_micro_batch_context(*model, mb);
    ref.losses.push_back(model->forward(micro_batch_tokens(mb).data(), kBatch));
    model->backward(kLossScale);
  }
  ref.params = by_name(*model, model->params());
  ref.grads = by_name(*model, model->grads());
  return ref;
}

// A message between stages: a copy of an activation or a gradient (B*T, D) in the backend's memory.
Buffer message(const float* source) {
  const int64_t n = kBatch * kSeqLen * kShape.d_model;
  Buffer b = test_backend().allocate(DType::F32, n);
  test_backend().ops<float>().copy(source, b.data<float>(), n);
  return b;
}

// One stage's model, schedule and messages.
struct Stage {
  std::unique_ptr<Model<float>> model;
  std::vector<PipeAction> actions;
  size_t next = 0;
  std::vector<int> in_flight;                      // per slot: the micro-batch held, or -1
  std::vector<std::pair<int64_t, int64_t>> ready;  // the grad-ready hook's ranges of the current backward
  std::map<int64_t, Buffer> sent_activation, sent_gradient;
};

// Checks the ranges one backward reported: the stage's whole table, each spec once, from the end down.
void expect_ranges_cover_table(const Stage& stage, int64_t index) {
  int64_t end = int64_t(stage.model->table().specs().size());
  for (const auto& [first, last] : stage.ready) {
    EXPECT_EQ(last, end) << "stage " << index;
    EXPECT_LT(first, last) << "stage " << index;
    end = first;
  }
  EXPECT_EQ(end, 0) << "stage " << index;
}

// Runs stage s's next action if what it needs has arrived; returns whether it ran.
bool step(std::vector<Stage>& stages, size_t s, std::vector<double>& losses) {
  Stage& st = stages[s];
  const PipeAction a = st.actions[st.next];
  const int mb = int(a.micro_batch);
  const int slot = mb % int(st.in_flight.size());
  Model<float>& model = *st.model;
  switch (a.op) {
    case PipeOp::RecvActivation:
      if (!stages[s - 1].sent_activation.count(mb)) return false;
      break;
    case PipeOp::RecvGradient:
      if (!stages[s + 1].sent_gradient.count(mb)) return false;
      break;
    case PipeOp::Forward: {
      EXPECT_EQ(st.in_flight[size_t(slot)], -1) << "stage " << s << " slot " << slot << " still in flight";
      st.in_flight[size_t(slot)] = mb;
      set_micro_batch_context(model, mb);
      const float* input = s == 0 ? nullptr : stages[s - 1].sent_activation.at(mb).data<float>();
      const double loss = model.forward(slot, micro_batch_tokens(mb).data(), kBatch, input);
      if (s + 1 == stages.size())
        losses[size_t(mb)] = loss;
      else
        EXPECT_EQ(loss, 0.0);
      break;
    }
    case PipeOp::SendActivation:
      st.sent_activation.emplace(mb, message(model.output_activation(slot)));
      break;
    case PipeOp::Backward: {
      EXPECT_EQ(st.in_flight[size_t(slot)], mb);
      st.in_flight[size_t(slot)] = -1;
      st.ready.clear();
      const float* output_grad = s + 1 == stages.size() ? nullptr : stages[s + 1].sent_gradient.at(mb).data<float>();
      model.backward(slot, kLossScale, output_grad);
      expect_ranges_cover_table(st, int64_t(s));
      break;
    }
    case PipeOp::SendGradient:
      st.sent_gradient.emplace(mb, message(model.input_grad(slot)));
      break;
  }
  ++st.next;
  return true;
}

// counts: each stage's layers (as parallel.pp_layers; empty: equal runs), a last 0 a stage of the head alone (which
// the trainer does not make, the model does).
void check_pipeline(bool with_moe, const RecomputeSpec& recompute, int64_t num_stages,
                    const std::vector<int64_t>& counts = {}, GemmPrecision precision = GemmPrecision::Fp32) {
  const Reference ref = whole_model(with_moe, precision);
  std::vector<std::pair<int64_t, int64_t>> split;
  if (!counts.empty() && counts.back() == 0) {
    split = stage_layers(kShape.layers, num_stages - 1, {counts.begin(), counts.end() - 1});
    split.emplace_back(kShape.layers, kShape.layers);
  } else {
    split = stage_layers(kShape.layers, num_stages, counts);
  }
  std::vector<Stage> stages(static_cast<size_t>(num_stages));
  for (int64_t s = 0; s < num_stages; ++s) {
    Stage& st = stages[size_t(s)];
    const StageSpec spec{split[size_t(s)].first, split[size_t(s)].second, s == 0, s + 1 == num_stages};
    const int slots = int(num_stages - s);  // 1F1B keeps at most P - s micro-batches in flight
    st.model = make_model(with_moe, recompute, slots, spec, precision);
    st.in_flight.assign(size_t(slots), -1);
    st.actions = pipeline_actions(PipeSchedule::OneFOneB, num_stages, s, kMicroBatches);
    st.model->set_grad_ready_hook([&st](int64_t first, int64_t end) { st.ready.emplace_back(first, end); });
  }
  // Round robin over the stages, each running as far as its receives allow.
  std::vector<double> losses(kMicroBatches, -1);
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t s = 0; s < stages.size(); ++s)
      while (stages[s].next < stages[s].actions.size() && step(stages, s, losses)) progress = true;
  }
  for (const Stage& st : stages) ASSERT_EQ(st.next, st.actions.size()) << "the schedule did not finish";

  EXPECT_EQ(losses, ref.losses);
  std::map<std::string, int> seen;
  for (const Stage& st : stages) {
    for (const auto& [name, values] : by_name(*st.model, st.model->params())) {
      ASSERT_TRUE(ref.params.count(name)) << name;
      EXPECT_EQ(values, ref.params.at(name)) << name << ": init is a function of (seed, name, index)";
      ++seen[name];
    }
    for (const auto& [name, values] : by_name(*st.model, st.model->grads()))
      EXPECT_EQ(values, ref.grads.at(name)) << "gradient of " << name;
  }
  EXPECT_EQ(seen.size(), ref.params.size()) << "every parameter on some stage";
  for (const auto& [name, count] : seen) EXPECT_EQ(count, 1) << name << " on one stage only";
}

// A chunk gives back its own parameter and gradient buffers (release_parameters) before a rank's chunks share
// one pair, so that the rank never holds both; its table stays for the shared one to copy.
TEST(PipelineStages, AChunkReleasesItsOwnParametersBeforeSharing) {
  const std::unique_ptr<Model<float>> chunk = make_model(true, Recompute::None, 1, StageSpec{0, 3, true, false});
  const int64_t held = chunk->backend().allocated_bytes(), params = chunk->num_params();
  chunk->release_parameters();
  EXPECT_EQ(held - chunk->backend().allocated_bytes(), 2 * int64_t(sizeof(float)) * params);
  EXPECT_EQ(chunk->num_params(), params);
}

TEST(PipelineStages, DenseTwoStages) { check_pipeline(false, Recompute::None, 2); }
TEST(PipelineStages, DenseThreeStages) { check_pipeline(false, Recompute::None, 3); }
TEST(PipelineStages, DenseThreeStagesWithRecompute) { check_pipeline(false, Recompute::Full, 3); }
TEST(PipelineStages, MoeTwoStages) { check_pipeline(true, Recompute::None, 2); }
TEST(PipelineStages, MoeThreeStages) { check_pipeline(true, Recompute::None, 3); }
TEST(PipelineStages, MoeThreeUnevenStagesWithRecompute) { check_pipeline(true, Recompute::Full, 3, {1, 3, 2}); }
// Under bf16 GEMMs the head keeps its input held rounded, written by the output norm: in the last block's fused pass,
// or on a stage of the head alone by its own norm of the activation it receives; the same bits either way.
TEST(PipelineStages, Bf16HeadAfterItsLayersOrAloneOnItsStage) {
  check_pipeline(true, Recompute::None, 2, {}, GemmPrecision::Bf16);
  check_pipeline(true, Recompute::None, 3, {3, 3, 0}, GemmPrecision::Bf16);
}
// Layers 0..2 of the 6 recomputed: all of the first stage's, one of the second's, none of the third's.
TEST(PipelineStages, MoeThreeStagesWithSelectiveRecomputeOfTheFirstThreeLayers) {
  check_pipeline(true, {Recompute::Selective, 3}, 3);
}
TEST(PipelineStages, MoeThreeStagesWithFullRecomputeOfTheFirstThreeLayers) {
  check_pipeline(true, {Recompute::Full, 3}, 3);
}

// A stage holds its own parameters under the whole model's names and refuses the calls of the ends it lacks.
TEST(PipelineStages, MiddleStageHoldsItsLayersOnly) {
  auto middle = make_model(false, Recompute::None, 1, {2, 4, false, false});
  std::vector<std::string> names;
  for (const ParamSpec& s : middle->table().specs()) names.push_back(s.name);
  EXPECT_EQ(names.front(), "layers.2.attn_norm.gain");
  EXPECT_EQ(names.back(), "layers.3.ffn.w2");
  EXPECT_THROW(middle->table().find("embed.weight"), Error);
  EXPECT_THROW(middle->table().find("head.weight"), Error);
  EXPECT_EQ(middle->first_layer(), 2);
  EXPECT_EQ(middle->end_layer(), 4);
  EXPECT_THROW(middle->ffn(1), Error);
  EXPECT_EQ(middle->input_grad(0) != nullptr, true);

  const std::vector<int32_t> tokens = micro_batch_tokens(0);
  EXPECT_THROW(middle->forward(0, tokens.data(), kBatch), Error);  // needs its input activation
  Buffer input = message(middle->output_activation(0));
  EXPECT_EQ(middle->forward(0, tokens.data(), kBatch, input.data<float>()), 0.0);
  EXPECT_THROW(middle->backward(0, 1.0), Error);  // needs the gradient of its output
  middle->backward(0, 1.0, input.data<float>());

  auto first = make_model(false, Recompute::None, 1, {0, 2, true, false});
  EXPECT_EQ(first->table().specs().front().name, "embed.weight");
  EXPECT_EQ(first->input_grad(0), nullptr);
  EXPECT_THROW(first->forward(0, tokens.data(), kBatch, input.data<float>()), Error);
  auto last = make_model(false, Recompute::None, 1, {4, -1, false, true});
  EXPECT_EQ(last->table().specs().back().name, "head.weight");
  EXPECT_EQ(last->end_layer(), kShape.layers);
}

// Attention is a layer made by a factory, called with the whole model's layer index; the default is MHA.
TEST(PipelineStages, AttentionFactoryBuildsTheStagesLayers) {
  std::vector<int64_t> built;
  typename Model<float>::AttentionFactory factory = [&](int64_t l) -> std::unique_ptr<Attention<float>> {
    built.push_back(l);
    return std::make_unique<MhaAttention<float>>(test_backend(), kShape.d_model, kShape.heads, kSeqLen, kShape.layers);
  };
  Model<float> made(test_backend(), {.shape = kShape,
                                     .seq_len = kSeqLen,
                                     .max_batch = kBatch,
                                     .stage = {1, 4, true, true},
                                     .attention_factory = factory});
  EXPECT_EQ(built, (std::vector<int64_t>{1, 2, 3}));
  Model<float> plain(test_backend(),
                     {.shape = kShape, .seq_len = kSeqLen, .max_batch = kBatch, .stage = {1, 4, true, true}});
  made.init_params(5), plain.init_params(5);
  made.zero_grads(), plain.zero_grads();
  const std::vector<int32_t> tokens = micro_batch_tokens(1);
  EXPECT_EQ(made.forward(tokens.data(), kBatch), plain.forward(tokens.data(), kBatch));
  made.backward(0.1), plain.backward(0.1);
  EXPECT_EQ(by_name(made, made.grads()), by_name(plain, plain.grads()));
  EXPECT_EQ(made.table().find("layers.2.attn.wo").numel, kShape.d_model * kShape.d_model);
}

}  // namespace
}  // namespace moe
