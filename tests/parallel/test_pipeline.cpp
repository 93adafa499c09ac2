// The pipeline executor (parallel/pipeline.h) under mpirun: the world is the pipeline-parallel group, one
// stage per rank, a model of 12 layers (every other one the stressed MoE layer) split evenly or unevenly, run
// by 1F1B and by GPipe with several micro-batches per step. Each stage's gradients and the step's loss equal
// those of the whole model run one micro-batch at a time on one rank, bit for bit (the same operations in
// the same order); each stage keeps no more micro-batches in flight than the schedule says.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../core/moe_test_settings.h"
#include "core/backend/backend.h"
#include "parallel/mpi_communicator.h"
#include "parallel/pipeline.h"

namespace moe {
namespace {

const ModelShape kShape{31, 16, 12, 2, 24};  // 12 layers: 2, 3 and 4 stages divide them
constexpr int64_t kSeqLen = 6, kBatch = 2;

struct Result {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;  // by parameter name
};

void set_context(Model<float>& model, int64_t mb, int64_t micro_batches) {
  model.set_context(true, 2, mb * kBatch, 1.0 / double(micro_batches), 99);
}

double loss_scale(int64_t micro_batches) { return 1.0 / double(micro_batches * kBatch * kSeqLen); }

std::map<std::string, std::vector<float>> grads_by_name(const Model<float>& model) {
  std::map<std::string, std::vector<float>> out;
  for (const ParamSpec& s : model.table().specs())
    out[s.name] = std::vector<float>(model.grads() + s.offset, model.grads() + s.offset + s.numel);
  return out;
}

Result whole_model(Backend& backend, int64_t micro_batches) {
  auto model = test::stressed_model(backend, kShape, kSeqLen, kBatch, true, Recompute::None, 1);
  Result r;
  for (int64_t mb = 0; mb < micro_batches; ++mb) {
    set_context(*model, mb, micro_batches);
    r.loss += model->forward(test::micro_batch_tokens(int(mb), kBatch, kSeqLen, kShape.vocab).data(), kBatch);
    model->backward(loss_scale(micro_batches));
  }
  r.grads = grads_by_name(*model);
  return r;
}

// This rank's stage of the same model, run by the executor; the loss is the last stage's, broadcast.
Result pipelined(Backend& backend, Communicator& pp, PipeSchedule schedule, int64_t micro_batches,
                 const std::vector<int64_t>& counts) {
  const auto layers = stage_layers(kShape.layers, pp.size(), counts)[size_t(pp.rank())];
  const StageSpec spec{layers.first, layers.second, pp.rank() == 0, pp.rank() == pp.size() - 1};
  const int slots = int(pipeline_slots(schedule, pp.size(), pp.rank(), micro_batches));
  auto model = test::stressed_model(backend, kShape, kSeqLen, kBatch, true, Recompute::None, slots, spec);
  PipelineExecutor<float> executor(*model, pp, schedule, micro_batches, kBatch, kSeqLen);
  typename PipelineExecutor<float>::MicroBatches mbs;
  mbs.tokens = [](int64_t mb, int32_t* tokens) {
    const std::vector<int32_t> t = test::micro_batch_tokens(int(mb), kBatch, kSeqLen, kShape.vocab);
    std::copy(t.begin(), t.end(), tokens);
  };
  mbs.before_forward = [&](int64_t mb) { set_context(*model, mb, micro_batches); };
  Result r;
  r.loss = executor.run(mbs, loss_scale(micro_batches));
  pp.broadcast(&r.loss, 1, pp.size() - 1);
  r.grads = grads_by_name(*model);
  return r;
}

void check(PipeSchedule schedule, int64_t micro_batches, const std::vector<int64_t>& counts = {}) {
  auto pp = MpiCommunicator::world();
  const std::unique_ptr<Backend> backend = make_cpu_backend(1);
  const Result want = whole_model(*backend, micro_batches);
  const Result got = pipelined(*backend, *pp, schedule, micro_batches, counts);
  EXPECT_EQ(got.loss, want.loss) << "stage " << pp->rank();
  ASSERT_FALSE(got.grads.empty());
  for (const auto& [name, g] : got.grads) {
    const std::vector<float>& w = want.grads.at(name);
    ASSERT_EQ(g.size(), w.size()) << name;
    EXPECT_EQ(0, std::memcmp(g.data(), w.data(), g.size() * sizeof(float))) << name << " on stage " << pp->rank();
  }
}

TEST(PipelineExecutor, OneFOneBEqualsTheWholeModel) { check(PipeSchedule::OneFOneB, 5); }
TEST(PipelineExecutor, OneFOneBWithFewerMicroBatchesThanStages) { check(PipeSchedule::OneFOneB, 1); }
TEST(PipelineExecutor, GPipeEqualsTheWholeModel) { check(PipeSchedule::GPipe, 4); }

TEST(PipelineExecutor, UnevenStages) {
  auto pp = MpiCommunicator::world();
  std::vector<int64_t> counts(size_t(pp->size()), 1);
  counts.back() = kShape.layers - (pp->size() - 1);  // the last stage takes the rest
  check(PipeSchedule::OneFOneB, 6, counts);
}

// The slots a stage needs are the schedule's in-flight bound: 1F1B keeps at most P - s, GPipe all m.
TEST(PipelineExecutor, SlotsAreTheInFlightBound) {
  for (int64_t P = 1; P <= 8; ++P)
    for (int64_t m = 1; m <= 16; ++m)
      for (int64_t s = 0; s < P; ++s) {
        EXPECT_EQ(pipeline_slots(PipeSchedule::OneFOneB, P, s, m), std::min(P - s, m)) << P << " " << s << " " << m;
        EXPECT_EQ(pipeline_slots(PipeSchedule::GPipe, P, s, m), m);
      }
}

}  // namespace
}  // namespace moe
