// Interleaved pipeline stages (parallel/pipeline.h) under mpirun: the world is the pipeline-parallel group and
// each rank holds V model chunks, chunk c the layers of virtual stage c * P + rank of a 12-layer model (every
// other layer the stressed MoE layer; the embedding on virtual stage 0, the head on the last), run by
// interleaved 1F1B. Each chunk's gradients and the step's loss equal those of the whole model run one
// micro-batch at a time on one rank, bit for bit: every chunk backwards its micro-batches in order, as the
// whole model does.
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

const ModelShape kShape{31, 16, 12, 2, 24};  // 12 layers: 4, 6 and 12 virtual stages divide them
constexpr int64_t kSeqLen = 6, kBatch = 2;

struct Result {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;  // by parameter name
};

void set_context(Model<float>& model, int64_t mb, int64_t micro_batches) {
  model.set_context(true, 2, mb * kBatch, 1.0 / double(micro_batches), 99);
}

double loss_scale(int64_t micro_batches) { return 1.0 / double(micro_batches * kBatch * kSeqLen); }

void add_grads(const Model<float>& model, std::map<std::string, std::vector<float>>& out) {
  for (const ParamSpec& s : model.table().specs())
    out[s.name] = std::vector<float>(model.grads() + s.offset, model.grads() + s.offset + s.numel);
}

Result whole_model(Backend& backend, int64_t micro_batches) {
  auto model = test::stressed_model(backend, kShape, kSeqLen, kBatch, true, Recompute::None, 1);
  Result r;
  for (int64_t mb = 0; mb < micro_batches; ++mb) {
    set_context(*model, mb, micro_batches);
    r.loss += model->forward(test::micro_batch_tokens(int(mb), kBatch, kSeqLen, kShape.vocab).data(), kBatch);
    model->backward(loss_scale(micro_batches));
  }
  add_grads(*model, r.grads);
  return r;
}

// This rank's chunks of the same model, run by the executor; the loss is the last rank's, broadcast.
Result interleaved(Backend& backend, Communicator& pp, int64_t chunks, int64_t micro_batches) {
  const int64_t P = pp.size(), r = pp.rank();
  const auto layers = stage_layers(kShape.layers, P * chunks);
  std::vector<std::unique_ptr<Model<float>>> models;
  std::vector<Model<float>*> views;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t v = virtual_stage(P, r, c);
    const StageSpec spec{layers[size_t(v)].first, layers[size_t(v)].second, v == 0, v == P * chunks - 1};
    const int slots = int(pipeline_slots(PipeSchedule::OneFOneB, P, r, micro_batches, chunks, c));
    models.push_back(test::stressed_model(backend, kShape, kSeqLen, kBatch, true, Recompute::None, slots, spec));
    views.push_back(models.back().get());
  }
  PipelineExecutor<float> executor(views, pp, PipeSchedule::OneFOneB, micro_batches, kBatch, kSeqLen);
  PipelineExecutor<float>::MicroBatches mbs;
  mbs.tokens = [](int64_t mb, int32_t* tokens) {
    const std::vector<int32_t> t = test::micro_batch_tokens(int(mb), kBatch, kSeqLen, kShape.vocab);
    std::copy(t.begin(), t.end(), tokens);
  };
  mbs.before_chunk_forward = [&](int64_t mb, int64_t c) { set_context(*models[size_t(c)], mb, micro_batches); };
  Result res;
  res.loss = executor.run(mbs, loss_scale(micro_batches));
  pp.broadcast(&res.loss, 1, int(P - 1));
  for (const auto& m : models) add_grads(*m, res.grads);
  return res;
}

// `rounds` micro-batches per stage.
void check(int64_t chunks, int64_t rounds) {
  auto pp = MpiCommunicator::world();
  const int64_t micro_batches = rounds * pp->size();
  if (kShape.layers % (pp->size() * chunks) != 0) GTEST_SKIP() << "the chunks do not divide the layers";
  const std::unique_ptr<Backend> backend = make_cpu_backend(1);
  const Result want = whole_model(*backend, micro_batches);
  const Result got = interleaved(*backend, *pp, chunks, micro_batches);
  EXPECT_EQ(got.loss, want.loss) << "stage " << pp->rank();
  ASSERT_FALSE(got.grads.empty());
  for (const auto& [name, g] : got.grads) {
    const std::vector<float>& w = want.grads.at(name);
    ASSERT_EQ(g.size(), w.size()) << name;
    EXPECT_EQ(0, std::memcmp(g.data(), w.data(), g.size() * sizeof(float))) << name << " on stage " << pp->rank();
  }
}

TEST(InterleavedPipeline, TwoChunksEqualTheWholeModel) { check(2, 2); }
TEST(InterleavedPipeline, MicroBatchesEqualToTheStages) { check(2, 1); }  // all forwards first
TEST(InterleavedPipeline, ThreeChunks) { check(3, 3); }

}  // namespace
}  // namespace moe
