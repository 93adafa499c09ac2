// Checkpoints of the first format stay readable: the fixture tests/fixtures/checkpoint-v1 (written by the
// program before the format became "moe-checkpoint-2": two ranks, ep 2, a full checkpoint and a delta on
// it) verifies, and restores exactly what the program that wrote it exported (export-step4.h5), bit for
// bit, read as whole tensors and read under another layout (row blocks, column blocks, ZeRO-like ranges).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "checkpoint/detail.h"
#include "checkpoint/stacked.h"

namespace moe::ckpt {
namespace {

const std::string kFixture = std::string(MOE_SOURCE_DIR) + "/tests/fixtures/checkpoint-v1";

// Every tensor of the export, whole, as bytes.
std::map<std::string, std::pair<DatasetInfo, std::vector<uint8_t>>> exported() {
  std::map<std::string, std::pair<DatasetInfo, std::vector<uint8_t>>> out;
  const ShardReader r(kFixture + "/export-step4.h5");
  for (const DatasetInfo& info : r.datasets()) {
    std::vector<uint8_t> bytes(size_t(info.numel()) * detail::dtype_size(info.dtype));
    r.read(info.name, info.dtype, 0, info.numel(), bytes.data());
    out[info.name] = {info, std::move(bytes)};
  }
  return out;
}

Resolved verified(const std::string& dir) {
  std::string why;
  const std::optional<Resolved> r = verify_checkpoint(dir, {}, &why);
  EXPECT_TRUE(r.has_value()) << dir << ": " << why;
  return r.value_or(Resolved{});
}

// The parts of a tensor a reader of another layout asks for: whole, or blocks of an axis with ranges.
std::vector<Slab> layout(const std::vector<int64_t>& global, const std::string& how) {
  if (how == "whole" || global.empty()) return {Slab::whole(global)};
  const size_t axis = how == "rows" ? 0 : global.size() - 1;
  const int64_t n = global[axis], cut = n / 2 + (n > 1 ? 0 : 1);
  std::vector<Slab> out;
  for (const auto& [from, size] : {std::pair<int64_t, int64_t>{0, cut}, {cut, n - cut}}) {
    if (size <= 0) continue;
    std::vector<int64_t> start(global.size(), 0), shape = global;
    start[axis] = from, shape[axis] = size;
    Slab box = Slab::box(global, start, shape);
    const int64_t third = box.count / 3;  // a ZeRO-like cut of each block into two ranges
    out.push_back({global, start, shape, 0, third});
    out.push_back({global, start, shape, third, box.count - third});
  }
  return out;
}

// The bytes of `slab` taken out of the whole tensor `whole`.
std::vector<uint8_t> part_of(const std::vector<uint8_t>& whole, const Slab& slab, size_t esize) {
  std::vector<uint8_t> out(size_t(slab.count) * esize);
  for (const Run& r : intersect(slab, Slab::whole(slab.global_shape)))
    std::memcpy(out.data() + r.to * esize, whole.data() + r.from * esize, size_t(r.length) * esize);
  return out;
}

TEST(CheckpointV1, FixtureVerifiesAsFormatOne) {
  const Resolved r = verified(kFixture + "/checkpoints/step-00000004");
  ASSERT_EQ(r.chain.size(), 2u);
  EXPECT_EQ(r.chain[0].format, 1);
  EXPECT_EQ(r.chain[1].format, 1);
  EXPECT_EQ(r.chain[1].kind, "delta");
  EXPECT_EQ(r.chain[1].files.size(), 2u);
}

TEST(CheckpointV1, RestoresTheExportedValuesBitForBitUnderAnyLayout) {
  const Resolved r = verified(kFixture + "/checkpoints/step-00000004");
  const auto want = exported();
  ASSERT_EQ(want.size(), 44u);
  for (const std::string how : {"whole", "rows", "columns"}) {
    std::vector<Piece> pieces;
    std::vector<std::vector<uint8_t>> got;
    got.reserve(1000);
    for (const auto& [name, tensor] : want) {
      const DatasetInfo& info = tensor.first;
      const DType dtype = info.dtype;
      for (const Slab& s : layout(info.global_shape, how)) {
        got.emplace_back(size_t(s.count) * detail::dtype_size(dtype), 0xAB);
        pieces.push_back({name, dtype, s, nullptr, got.back().data()});
      }
    }
    load_pieces(r, pieces);
    for (size_t i = 0; i < pieces.size(); ++i) {
      const auto& [info, bytes] = want.at(pieces[i].tensor);
      EXPECT_EQ(got[i], part_of(bytes, pieces[i].slab, detail::dtype_size(info.dtype)))
          << how << ": " << pieces[i].tensor << " " << pieces[i].slab.text();
    }
  }
}

// What a model of this program reads: the fixture's W1 and W3 (params/ and AdamW's moments, base and XOR delta) as
// the parts of W13 (checkpoint/stacked.h), whole and under another layout, each element its part's exported value.
TEST(CheckpointV1, LoadsItsW1AndW3AsThePartsOfW13) {
  Resolved r = verified(kFixture + "/checkpoints/step-00000004");
  for (Manifest& m : r.chain) stack_legacy_parts(m);
  const auto want = exported();
  int stacked = 0;
  for (const auto& [name, tensor] : want) {
    if (name.size() < 3 || name.compare(name.size() - 3, 3, ".w1") != 0) continue;
    const std::string prefix = name.substr(0, name.size() - 3);
    const std::vector<int64_t>& g = tensor.first.global_shape;  // (E, D, F)
    ASSERT_EQ(g.size(), 3u) << name;
    const std::vector<int64_t> global = {g[0], g[1], 2, g[2]};
    const std::vector<uint8_t>& w1 = tensor.second;
    const std::vector<uint8_t>& w3 = want.at(prefix + ".w3").second;
    std::vector<uint8_t> w13(w1.size() * 2);  // rows [w1 row | w3 row], 4-byte elements
    const size_t row = size_t(g[2]) * 4;
    for (size_t k = 0; k < w1.size() / row; ++k) {
      std::memcpy(w13.data() + 2 * k * row, w1.data() + k * row, row);
      std::memcpy(w13.data() + (2 * k + 1) * row, w3.data() + k * row, row);
    }
    for (const std::string how : {"whole", "rows", "columns"}) {
      std::vector<Piece> pieces;
      std::vector<std::vector<uint8_t>> got;
      got.reserve(8);
      for (const Slab& s : layout(global, how)) {
        got.emplace_back(size_t(s.count) * 4, 0xAB);
        pieces.push_back({prefix + ".w13", DType::F32, s, nullptr, got.back().data()});
      }
      load_pieces(r, pieces);
      for (size_t i = 0; i < pieces.size(); ++i)
        EXPECT_EQ(got[i], part_of(w13, pieces[i].slab, 4))
            << how << ": " << pieces[i].tensor << " " << pieces[i].slab.text();
    }
    ++stacked;
  }
  EXPECT_EQ(stacked, 3) << "params/, optim/exp_avg/, optim/exp_avg_sq/ of the one MoE layer";
}

}  // namespace
}  // namespace moe::ckpt
