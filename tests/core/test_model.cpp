// The model's contracts beyond its gradients: recompute changes nothing (bit for bit), initialisation
// is a pure function of (seed, name, element), the same inputs give the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/backend/ops.h"
#include "core/error.h"
#include "core/model.h"
#include "tests/core/test_backend.h"

namespace moe {
namespace {

std::vector<int32_t> make_tokens(int64_t B, int64_t T, int64_t V) {
  std::vector<int32_t> tokens(size_t(B * (T + 1)));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 131 + 17) % V);
  return tokens;
}

TEST(Model, RecomputeGivesIdenticalGradients) {
  const ModelShape shape{256, 32, 3, 4, 48};
  const int64_t T = 16, B = 3;
  Model<float> plain(test_backend(), {.shape = shape, .seq_len = T, .max_batch = B});
  Model<float> recomputed(test_backend(), {.shape = shape, .seq_len = T, .max_batch = B, .recompute = Recompute::Full});
  plain.init_params(5);
  recomputed.init_params(5);
  const auto tokens = make_tokens(B, T, shape.vocab);
  plain.zero_grads();
  recomputed.zero_grads();
  const double l1 = plain.forward(tokens.data(), B);
  const double l2 = recomputed.forward(tokens.data(), B);
  EXPECT_EQ(l1, l2);
  plain.backward(1.0 / (B * T));
  recomputed.backward(1.0 / (B * T));
  EXPECT_EQ(0, std::memcmp(plain.grads(), recomputed.grads(), sizeof(float) * plain.num_params()));
}

// Staged per-token losses (docs/gpu.md "Host synchronisations"): each forward's sum is the bits an unstaged forward
// returns, micro-batches of different sizes included; one read covers as many forwards as the staging has sections
// (more make it read early), and a model without sections reads each forward's losses at once.
TEST(Model, StagedLossesAreEachForwardsSumReadOncePerFilledStaging) {
  const ModelShape shape{256, 32, 2, 2, 40};
  const int64_t T = 12, B = 3;
  std::vector<std::vector<int32_t>> batches;
  std::vector<int64_t> sizes = {3, 1, 2, 3, 3};
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<int32_t> tokens = make_tokens(B, T, shape.vocab);
    for (int32_t& t : tokens) t = int32_t((t + 7 * int32_t(i)) % shape.vocab);
    batches.push_back(tokens);
  }
  Model<float> plain(test_backend(), {.shape = shape, .seq_len = T, .max_batch = B});
  plain.init_params(8);
  std::vector<double> want;
  for (size_t i = 0; i < sizes.size(); ++i) want.push_back(plain.forward(batches[i].data(), sizes[i]));
  for (const int64_t sections : {0, 2, 5, 8}) {
    Model<float> m(test_backend(), {.shape = shape, .seq_len = T, .max_batch = B, .loss_sections = sections});
    m.init_params(8);
    m.stage_losses();
    const int64_t before = test_backend().host_traffic().syncs;
    for (size_t i = 0; i < sizes.size(); ++i)
      EXPECT_TRUE(std::isnan(m.forward(batches[i].data(), sizes[i]))) << "a staged forward's sum is not known yet";
    const std::vector<double> got = m.staged_losses();
    const int64_t reads = test_backend().host_traffic().syncs - before;
    EXPECT_EQ(got, want) << sections << " sections";  // exactly: the same sums in the same order
    // Sections of B sequences: the forwards' 3, 1, 2, 3, 3 sequences fill 2 sections (6) after the third and are
    // read then and at the end; 5 or 8 hold all 12 (one read); none reads each forward at once.
    const int64_t expected = sections == 0 ? 5 : sections == 2 ? 2 : 1;
    EXPECT_EQ(reads, expected) << sections << " sections";
    EXPECT_EQ(m.forward(batches[0].data(), sizes[0]), want[0]) << "unstaged again after staged_losses";
  }
}

TEST(Model, SameInputsSameBits) {
  const ModelShape shape{256, 32, 2, 2, 40};
  const int64_t T = 12, B = 2;
  Model<float> a(test_backend(), {.shape = shape, .seq_len = T, .max_batch = B}),
      b(test_backend(), {.shape = shape, .seq_len = T, .max_batch = B});
  a.init_params(8);
  b.init_params(8);
  ASSERT_EQ(0, std::memcmp(a.params(), b.params(), sizeof(float) * a.num_params()));
  const auto tokens = make_tokens(B, T, shape.vocab);
  for (Model<float>* m : {&a, &b}) {
    m->zero_grads();
    m->forward(tokens.data(), B);
    m->backward(0.1);
  }
  EXPECT_EQ(0, std::memcmp(a.grads(), b.grads(), sizeof(float) * a.num_params()));
}

TEST(Model, InitIsPerNameAndElementNotPerLayout) {
  // The same tensor in models of different depth draws the same values: init is keyed by name and
  // global element index, never by position in the flat buffer.
  Model<float> small(test_backend(), {.shape = {256, 32, 1, 2, 40}, .seq_len = 8, .max_batch = 1});
  Model<float> deep(test_backend(), {.shape = {256, 32, 3, 2, 40}, .seq_len = 8, .max_batch = 1});
  small.init_params(21);
  deep.init_params(21);
  for (const char* name : {"embed.weight", "layers.0.attn.wq", "layers.0.ffn.w13"}) {
    const ParamSpec& s = small.table().find(name);
    const ParamSpec& d = deep.table().find(name);
    ASSERT_EQ(s.numel, d.numel);
    EXPECT_EQ(0, std::memcmp(small.params() + s.offset, deep.params() + d.offset, sizeof(float) * s.numel)) << name;
  }
  // Initial statistics follow docs/model.md: std 0.02, output projections scaled by 1/sqrt(2L), gains one.
  const ParamSpec& wq = deep.table().find("layers.1.attn.wq");
  double ss = 0;
  for (int64_t i = 0; i < wq.numel; ++i) ss += double(deep.params()[wq.offset + i]) * deep.params()[wq.offset + i];
  EXPECT_NEAR(std::sqrt(ss / wq.numel), 0.02, 0.002);
  EXPECT_NEAR(deep.table().find("layers.1.attn.wo").init_std, 0.02 / std::sqrt(6.0), 1e-12);
  EXPECT_EQ(deep.params()[deep.table().find("out_norm.gain").offset], 1.0f);
}

// ModelOptions' sizes have no usable default: a model built without them names them.
TEST(Model, RefusesOptionsWithoutItsSizes) {
  const ModelShape shape{31, 16, 2, 2, 24};
  EXPECT_THROW(Model<float>(test_backend(), {.shape = shape}), Error);
  EXPECT_THROW(Model<float>(test_backend(), {.shape = shape, .seq_len = 8}), Error);
  EXPECT_THROW(Model<float>(test_backend(), {.shape = shape, .max_batch = 2}), Error);
  EXPECT_NO_THROW(Model<float>(test_backend(), {.shape = shape, .seq_len = 8, .max_batch = 2}));
}

TEST(Model, InitialLossIsNearUniform) {
  const ModelShape shape{256, 32, 2, 2, 40};
  const int64_t T = 16, B = 2;
  Model<float> m(test_backend(), {.shape = shape, .seq_len = T, .max_batch = B});
  m.init_params(1);
  const auto tokens = make_tokens(B, T, shape.vocab);
  const double mean = m.forward(tokens.data(), B) / double(B * T);
  EXPECT_NEAR(mean, std::log(256.0), 0.05);
}

}  // namespace
}  // namespace moe

namespace moe {
namespace {

// The backend counts the bytes its live buffers hold and the most they held at once (what the memory
// estimate of launch/config/memory.h is checked against): moves transfer, destruction and reserve's growth free.
TEST(BackendMemory, CountsLiveBuffersAndThePeak) {
  const std::unique_ptr<Backend> backend = make_cpu_backend(1);
  EXPECT_EQ(backend->allocated_bytes(), 0);
  EXPECT_EQ(backend->peak_bytes(), 0);
  {
    Buffer a = backend->allocate(DType::F32, 100);
    Buffer b = backend->allocate(DType::I32, 7);
    EXPECT_EQ(backend->allocated_bytes(), 428);
    Buffer moved = std::move(a);
    EXPECT_EQ(backend->allocated_bytes(), 428);
    Buffer empty = backend->allocate(DType::F64, 0);
    EXPECT_EQ(backend->allocated_bytes(), 428);
    backend->reserve(b, DType::I32, 5);  // large enough already: kept
    EXPECT_EQ(backend->allocated_bytes(), 428);
    backend->reserve(b, DType::I32, 50);  // grows: the new buffer exists before the old is freed
    EXPECT_EQ(backend->allocated_bytes(), 600);
    EXPECT_EQ(backend->peak_bytes(), 628);
  }
  EXPECT_EQ(backend->allocated_bytes(), 0);
  EXPECT_EQ(backend->peak_bytes(), 628);
  Buffer c = backend->allocate(DType::F32, 10);
  EXPECT_EQ(backend->allocated_bytes(), 40);
  EXPECT_EQ(backend->peak_bytes(), 628);
}

TEST(Tensor, ViewsByNameIndexRowMajorAndSliceTheLeadingAxis) {
  ParamTable table;
  table.add({"a", {2}, ParamRole::Norm, false});
  table.add({"experts.w1", {3, 2, 4}, ParamRole::Expert, true});
  std::vector<float> buffer(table.numel());
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = float(i);
  const TensorView<float> w = table.view(buffer.data(), "experts.w1");
  EXPECT_EQ(w.numel(), 24);
  EXPECT_EQ(w.at({1, 1, 2}), 2.0f + 8 + 4 + 2);  // offset 2 (after "a") + 1*8 + 1*4 + 2
  const TensorView<float> e2 = w.slice0(2);
  EXPECT_EQ(e2.shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(e2.at({0, 0}), 2.0f + 16);
  EXPECT_THROW(w.at({3, 0, 0}), Error);
}

}  // namespace
}  // namespace moe

namespace moe {
namespace {

TEST(ParamTable, DenseRegionThenExpertRegionWhateverTheOrderOfRegistration) {
  ParamTable table;
  table.add({"a", {3}, ParamRole::Dense, true});
  table.add({"experts.w", {2, 2}, ParamRole::Expert, true});
  table.add({"b", {5}, ParamRole::Norm, false});
  EXPECT_EQ(table.dense_numel(), 8);
  EXPECT_EQ(table.expert_numel(), 4);
  EXPECT_EQ(table.find("a").offset, 0);
  EXPECT_EQ(table.find("b").offset, 3);
  EXPECT_EQ(table.find("experts.w").offset, 8);
}

TEST(ParamTable, AShardIsInitialisedAsItsSliceOfTheFullTensor) {
  ParamTable full, shard;
  full.add({"experts.w1", {4, 3, 5}, ParamRole::Expert, true, ParamInit::Normal, 0.02});
  shard.add({"experts.w1", {2, 3, 5}, ParamRole::Expert, true, ParamInit::Normal, 0.02, 4, 2});  // experts 2, 3
  std::vector<float> f(full.numel()), s(shard.numel());
  full.initialize(f.data(), 77);
  shard.initialize(s.data(), 77);
  EXPECT_EQ(shard.find("experts.w1").global_shape(), (std::vector<int64_t>{4, 3, 5}));
  EXPECT_EQ(0, std::memcmp(s.data(), f.data() + 2 * 15, sizeof(float) * s.size()));
}

}  // namespace
}  // namespace moe
