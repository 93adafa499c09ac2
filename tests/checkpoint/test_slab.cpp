// Hyperslab pieces (checkpoint/slab.h): the N-dimensional intersection against an element-by-element
// reference on random shapes, boxes and ranges; a tensor split along axis 1 into column blocks with
// ZeRO-like ranges inside them, written as a checkpoint (full and delta) and read back exactly under other
// splits (two column blocks, the whole tensor, row blocks, ranges of those); an expert tensor in the boxes
// of its (ep, etp) blocks, split on axes 0 and 2, read back whole and under other splits; coverage refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "checkpoint/slab.h"
#include "core/error.h"
#include "core/params.h"
#include "parallel/self_communicator.h"

namespace moe::ckpt {
namespace {

namespace fs = std::filesystem;

// Of slab s, the index in its stored elements of global element g (row-major), or -1 when it holds none.
int64_t stored_index(const Slab& s, const std::vector<int64_t>& g) {
  int64_t i = 0;
  for (size_t k = 0; k < g.size(); ++k) {
    if (g[k] < s.start[k] || g[k] >= s.start[k] + s.shape[k]) return -1;
    i = i * s.shape[k] + (g[k] - s.start[k]);
  }
  return i >= s.begin && i < s.begin + s.count ? i - s.begin : -1;
}

// Every (index in a, index in b) of the elements both hold, by walking the whole tensor.
std::vector<std::pair<int64_t, int64_t>> reference(const Slab& a, const Slab& b) {
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t n = numel(a.global_shape);
  std::vector<int64_t> g(a.global_shape.size());
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t rest = flat;
    for (size_t k = g.size(); k-- > 0;) g[k] = rest % a.global_shape[k], rest /= a.global_shape[k];
    const int64_t ia = stored_index(a, g), ib = stored_index(b, g);
    if (ia >= 0 && ib >= 0) out.emplace_back(ia, ib);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::pair<int64_t, int64_t>> expand(const std::vector<Run>& runs) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const ckpt::Run& r : runs)
    for (int64_t i = 0; i < r.length; ++i) out.emplace_back(r.to + i, r.from + i);
  return out;
}

Slab random_slab(std::mt19937_64& rng, const std::vector<int64_t>& global) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Slab s;
  s.global_shape = global;
  const bool large = pick(0, 2) > 0;  // two thirds of the boxes span most of each axis
  for (int64_t d : global) {
    const int64_t start = large ? pick(0, (d - 1) / 3) : pick(0, d - 1);
    s.start.push_back(start);
    s.shape.push_back(large ? pick(std::max<int64_t>(1, (d - start) / 2), d - start) : pick(1, d - start));
  }
  const int64_t m = numel(s.shape);
  s.begin = pick(0, 1) == 0 ? 0 : pick(0, m - 1);  // a range from the start half the time
  s.count = pick(0, 1) == 0 ? m - s.begin : pick(0, m - s.begin);
  EXPECT_EQ(s.problem(), "");
  return s;
}

TEST(SlabIntersect, MatchesElementByElementReferenceOnRandomShapes) {
  std::mt19937_64 rng(20260131);
  int shared = 0, several = 0;  // trials whose slabs share elements; of those, in more than one run
  for (int trial = 0; trial < 10000; ++trial) {
    const int64_t axes = std::uniform_int_distribution<int64_t>(0, 4)(rng);
    std::vector<int64_t> global;
    for (int64_t k = 0; k < axes; ++k) global.push_back(std::uniform_int_distribution<int64_t>(1, 6)(rng));
    const Slab a = random_slab(rng, global), b = random_slab(rng, global);
    const std::vector<ckpt::Run> runs = intersect(a, b);
    EXPECT_EQ(expand(runs), reference(a, b)) << "a = " << a.text() << ", b = " << b.text();
    shared += !runs.empty(), several += runs.size() > 1;
    EXPECT_EQ(overlap(a, b), overlap(b, a)) << a.text() << " / " << b.text();
    for (size_t i = 1; i < runs.size(); ++i) EXPECT_GT(runs[i].to, runs[i - 1].to + runs[i - 1].length - 1);
  }
  EXPECT_GT(shared, 3000) << "too few overlapping cases to mean much (" << shared << ")";
  EXPECT_GT(several, 500) << "too few cases of several runs to mean much";
}

TEST(SlabIntersect, WholeTensorsAndFullTrailingAxesAreOneRun) {
  const Slab whole = Slab::whole({6, 4, 5});
  EXPECT_EQ(intersect(whole, whole).size(), 1u);
  // An expert block (axis 0) against a ZeRO range of the whole tensor: one run.
  const Slab block = Slab::box({6, 4, 5}, {2, 0, 0}, {2, 4, 5});
  const std::vector<ckpt::Run> runs = intersect(block, Slab::flat({6, 4, 5}, 30, 50));
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].to, 0);
  EXPECT_EQ(runs[0].from, 10);
  EXPECT_EQ(runs[0].length, 40);
}

TEST(SlabGeometry, FirstGlobalIndexStoredShapeAndWords) {
  const Slab s{{6, 10}, {0, 3}, {6, 4}, 5, 9};        // column block 3:7, its elements 5..13
  EXPECT_EQ(s.first_global_index(), 1 * 10 + 3 + 1);  // element 5 of the block is (1, 1) -> global (1, 4)
  EXPECT_EQ(s.stored_shape(), (std::vector<int64_t>{9}));
  EXPECT_EQ(Slab::box({6, 10}, {0, 3}, {6, 4}).stored_shape(), (std::vector<int64_t>{6, 4}));
  const Slab w = s.in_words(2);
  EXPECT_EQ(w.global_shape, (std::vector<int64_t>{6, 10, 2}));
  EXPECT_EQ(w.begin, 10);
  EXPECT_EQ(w.count, 18);
  EXPECT_NE(Slab({{6, 10}, {0, 8}, {6, 4}, 0, 24}).problem(), "");  // outside on axis 1
  EXPECT_NE(Slab({{6, 10}, {0, 3}, {6, 4}, 20, 5}).problem(), "");  // range outside its box
}

// ---- A (6, 10) tensor split along axis 1, through a real checkpoint -----------------------------------

constexpr int64_t kRows = 6, kCols = 10;

float value(int64_t step, int64_t row, int64_t col) { return float(step * 1000 + row * kCols + col) + 0.25f; }

// The elements of `slab` (a part of the (6, 10) tensor) at `step`, in its stored order.
std::vector<float> values_of(const Slab& slab, int64_t step) {
  std::vector<float> out;
  int64_t i = 0;
  for (int64_t r = slab.start[0]; r < slab.start[0] + slab.shape[0]; ++r)
    for (int64_t c = slab.start[1]; c < slab.start[1] + slab.shape[1]; ++c, ++i)
      if (i >= slab.begin && i < slab.begin + slab.count) out.push_back(value(step, r, c));
  return out;
}

// Three column blocks (3, 4, 3 columns), each cut into two ZeRO-like ranges of its row-major order.
std::vector<Slab> saved_layout() {
  std::vector<Slab> out;
  const std::vector<std::pair<int64_t, int64_t>> blocks = {{0, 3}, {3, 4}, {7, 3}};
  for (const auto& [col, width] : blocks) {
    const Slab box = Slab::box({kRows, kCols}, {0, col}, {kRows, width});
    const int64_t half = box.count / 2 + 1;  // ranges that end mid-row
    out.push_back({box.global_shape, box.start, box.shape, 0, half});
    out.push_back({box.global_shape, box.start, box.shape, half, box.count - half});
  }
  return out;
}

// Saves the (6, 10) tensor at steps 1 (full) and 2 (delta) in saved_layout's pieces, with an optimizer-like
// f64 companion of the same layout (so the 64-bit delta path is covered too).
void save_two_steps(const std::string& root) {
  SelfCommunicator world("world");
  SaveSettings settings;
  settings.root = root;
  settings.full_every = 2;
  settings.async = false;
  Checkpointer ck(settings, world, nlohmann::json::object(), nullptr);
  for (int64_t step = 1; step <= 2; ++step) {
    std::vector<std::vector<float>> f32;
    std::vector<std::vector<double>> f64;
    std::vector<Piece> pieces;
    for (const Slab& s : saved_layout()) f32.push_back(values_of(s, step));
    for (const Slab& s : saved_layout()) {
      const std::vector<float> v = values_of(s, step);
      f64.emplace_back(v.begin(), v.end());
    }
    const std::vector<Slab> layout = saved_layout();
    for (size_t i = 0; i < layout.size(); ++i) {
      pieces.push_back({"params/w", DType::F32, layout[i], f32[i].data(), nullptr});
      pieces.push_back({"optim/w64", DType::F64, layout[i], f64[i].data(), nullptr});
    }
    ck.save(step, pieces);
  }
  ck.finish();
}

// Reads the tensor back in `layout`'s pieces from `checkpoint` and checks every element against `step`.
void expect_reads_back(const std::string& checkpoint, int64_t step, const std::vector<Slab>& layout,
                       const std::string& what) {
  std::string why;
  const auto resolved = verify_checkpoint(checkpoint, {}, &why);
  ASSERT_TRUE(resolved.has_value()) << why;
  std::vector<std::vector<float>> f32(layout.size());
  std::vector<std::vector<double>> f64(layout.size());
  std::vector<Piece> pieces;
  for (size_t i = 0; i < layout.size(); ++i) {
    f32[i].assign(size_t(layout[i].count), -1.0f);
    f64[i].assign(size_t(layout[i].count), -1.0);
    pieces.push_back({"params/w", DType::F32, layout[i], nullptr, f32[i].data()});
    pieces.push_back({"optim/w64", DType::F64, layout[i], nullptr, f64[i].data()});
  }
  load_pieces(*resolved, pieces);
  for (size_t i = 0; i < layout.size(); ++i) {
    const std::vector<float> want = values_of(layout[i], step);
    EXPECT_EQ(f32[i], want) << what << ": piece " << layout[i].text();
    EXPECT_EQ(f64[i], std::vector<double>(want.begin(), want.end())) << what << ": f64 piece " << layout[i].text();
  }
}

struct TempRoot {
  fs::path path = fs::temp_directory_path() / ("moe_slab_test_" + std::to_string(::getpid()));
  TempRoot() { fs::remove_all(path); }
  ~TempRoot() { fs::remove_all(path); }
};

TEST(SlabCheckpoint, ColumnBlocksWithRangesReadBackUnderOtherSplits) {
  TempRoot tmp;
  save_two_steps(tmp.path.string());
  const Slab whole = Slab::whole({kRows, kCols});
  const std::vector<std::pair<std::string, std::vector<Slab>>> layouts = {
      {"two column blocks",
       {Slab::box({kRows, kCols}, {0, 0}, {kRows, 5}), Slab::box({kRows, kCols}, {0, 5}, {kRows, 5})}},
      {"whole tensor", {whole}},
      {"row blocks", {Slab::box({kRows, kCols}, {0, 0}, {2, kCols}), Slab::box({kRows, kCols}, {2, 0}, {4, kCols})}},
      {"ranges of the whole tensor", {Slab::flat({kRows, kCols}, 0, 17), Slab::flat({kRows, kCols}, 17, 43)}},
      {"ranges of a middle column block", {Slab{{kRows, kCols}, {1, 2}, {4, 6}, 3, 13}}},
      {"the saved layout", saved_layout()},
  };
  for (const auto& [what, layout] : layouts) {
    expect_reads_back((tmp.path / "step-00000001").string(), 1, layout, what + " (full)");
    expect_reads_back((tmp.path / "step-00000002").string(), 2, layout, what + " (delta)");
  }
  // Step 2 is a delta of XOR words over step 1, for both dtypes.
  const Manifest m = read_manifest((tmp.path / "step-00000002").string());
  EXPECT_EQ(m.kind, "delta");
  for (const DatasetEntry& d : m.files.at(0).datasets) EXPECT_TRUE(d.xor_delta) << d.dataset;
}

// ---- A (4, 3, 10) expert tensor in the boxes of its (ep, etp) blocks, through a real checkpoint ---------

// The elements of `slab` of a tensor whose element g holds g + 0.5, in its stored order.
std::vector<float> index_values(const Slab& slab) {
  std::vector<float> out;
  const int64_t n = numel(slab.shape);
  for (int64_t i = slab.begin; i < slab.begin + slab.count; ++i) {
    int64_t rest = i, g = 0, stride = n;
    for (size_t k = 0; k < slab.shape.size(); ++k) {
      stride /= slab.shape[k];
      g = g * slab.global_shape[k] + slab.start[k] + rest / stride;
      rest %= stride;
    }
    out.push_back(float(g) + 0.5f);
  }
  return out;
}

TEST(SlabCheckpoint, TwoAxisBoxesOfAnExpertTensorReadBackUnderOtherSplits) {
  TempRoot tmp;
  const std::vector<int64_t> global = {4, 3, 10};
  std::vector<Slab> saved;  // as launch/train/train_state.cpp makes a block's piece from its spec
  for (int64_t ep = 0; ep < 2; ++ep)
    for (int64_t etp = 0; etp < 2; ++etp) {
      ParamTable t;
      const ParamSpec local{"experts.w1", {2, 3, 10}, ParamRole::Expert, true, ParamInit::Normal, 0.02, 4, 2 * ep};
      t.add(TpShard{2, etp}.block_of(local, 2, ParamGroup::ExpertTensorParallel));
      const ParamSpec& s = t.find("experts.w1");
      saved.push_back(Slab::box(s.global_shape(), s.global_start(), s.shape));
    }
  EXPECT_EQ(saved[3].start, (std::vector<int64_t>{2, 0, 5}));
  EXPECT_EQ(saved[3].shape, (std::vector<int64_t>{2, 3, 5}));
  {
    SelfCommunicator world("world");
    SaveSettings settings;
    settings.root = tmp.path.string();
    settings.async = false;
    Checkpointer ck(settings, world, nlohmann::json::object(), nullptr);
    std::vector<std::vector<float>> values;
    std::vector<Piece> pieces;
    for (const Slab& s : saved) values.push_back(index_values(s));
    for (size_t i = 0; i < saved.size(); ++i)
      pieces.push_back({"params/w1", DType::F32, saved[i], values[i].data(), nullptr});
    ck.save(1, pieces);
    ck.finish();
  }
  std::string why;
  const auto resolved = verify_checkpoint((tmp.path / "step-00000001").string(), {}, &why);
  ASSERT_TRUE(resolved.has_value()) << why;
  const std::vector<std::vector<Slab>> layouts = {
      {Slab::whole(global)},
      saved,
      {Slab::box(global, {0, 0, 0}, {4, 3, 4}), Slab::box(global, {0, 0, 4}, {4, 3, 6})},
      {Slab{global, {1, 0, 3}, {2, 3, 4}, 5, 17}},
  };
  for (const std::vector<Slab>& layout : layouts) {
    std::vector<std::vector<float>> got(layout.size());
    std::vector<Piece> pieces;
    for (size_t i = 0; i < layout.size(); ++i) {
      got[i].assign(size_t(layout[i].count), -1.0f);
      pieces.push_back({"params/w1", DType::F32, layout[i], nullptr, got[i].data()});
    }
    load_pieces(*resolved, pieces);
    for (size_t i = 0; i < layout.size(); ++i) EXPECT_EQ(got[i], index_values(layout[i])) << layout[i].text();
  }
}

Manifest manifest_of(const std::vector<Slab>& pieces) {
  Manifest m;
  FileEntry f;
  f.name = "rank-00000.h5";
  for (const Slab& s : pieces) f.datasets.push_back({"params/w", "params/w", DType::F32, s, false});
  m.files.push_back(f);
  return m;
}

TEST(SlabCoverage, TilingIsCheckedInNDimensions) {
  const std::vector<Slab> saved = saved_layout();
  EXPECT_NO_THROW(check_coverage(manifest_of(saved), "ck"));
  // Boxes that share row 2 of the right half (and leave its row 5 out), the counts adding up to the
  // tensor's: refused as overlapping.
  const std::vector<Slab> overlapping = {Slab::box({kRows, kCols}, {0, 0}, {kRows, 5}),
                                         Slab::box({kRows, kCols}, {0, 5}, {3, 5}),
                                         Slab{{kRows, kCols}, {2, 5}, {4, 5}, 0, 15}};
  try {
    check_coverage(manifest_of(overlapping), "ck");
    ADD_FAILURE() << "overlap accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("overlapping"), std::string::npos) << e.message();
  }
  // One range of one block missing.
  std::vector<Slab> missing(saved.begin(), saved.end() - 1);
  try {
    check_coverage(manifest_of(missing), "ck");
    ADD_FAILURE() << "gap accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("holds 52 of its 60 elements"), std::string::npos) << e.message();
  }
  // Two ranges of one block overlapping.
  std::vector<Slab> ranges = saved;
  ranges[1].begin -= 1, ranges[1].count += 1;
  try {
    check_coverage(manifest_of(ranges), "ck");
    ADD_FAILURE() << "overlapping ranges accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("overlapping"), std::string::npos) << e.message();
  }
}

// The refusals of verify, for hyperslab pieces: an entry whose box or range lies outside its tensor, a
// dataset not named by its first element, and a file whose dataset lies elsewhere than its manifest says.
std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(SlabVerify, EntriesOutsideTheirTensorAndMisnamedDatasetsAreRefused) {
  auto manifest_with = [](const DatasetEntry& d) {
    Manifest m;
    m.step = 1;
    m.chain = {"step-00000001"};
    FileEntry f;
    f.name = "rank-00000.h5";
    f.xxh64 = "0123456789abcdef";
    f.datasets = {d};
    m.files = {f};
    return m;
  };
  const Slab outside{{kRows, kCols}, {0, 8}, {kRows, 4}, 0, 24};
  EXPECT_NE(refusal([&] {
              check_manifest(manifest_with({"params/w", "params/w", DType::F32, outside, false}), "step-00000001", "m");
            }).find("outside the tensor on axis 1"),
            std::string::npos);
  const Slab long_range{{kRows, kCols}, {0, 3}, {kRows, 4}, 20, 5};
  EXPECT_NE(
      refusal([&] {
        check_manifest(manifest_with({"params/w", "params/w", DType::F32, long_range, false}), "step-00000001", "m");
      }).find("range is outside its box"),
      std::string::npos);
  const Slab block{{kRows, kCols}, {0, 3}, {kRows, 4}, 5, 9};  // first element: global index 14
  EXPECT_EQ(
      refusal([&] {
        check_manifest(manifest_with({"params/w#14", "params/w", DType::F32, block, false}), "step-00000001", "m");
      }),
      "");
  EXPECT_NE(refusal([&] {
              check_manifest(manifest_with({"params/w#5", "params/w", DType::F32, block, false}), "step-00000001", "m");
            }).find("is neither params/w nor params/w#14"),
            std::string::npos);
}

TEST(SlabVerify, AFileWhosePieceLiesElsewhereThanItsManifestSaysIsRefused) {
  TempRoot tmp;
  save_two_steps(tmp.path.string());
  const std::string dir = (tmp.path / "step-00000001").string();
  Manifest m = read_manifest(dir);
  const std::string path = dir + "/" + m.files[0].name;
  EXPECT_NO_THROW(check_shard(path, m.files[0], m));
  Slab& moved = m.files[0].datasets[0].slab;
  moved.start[1] += 1;  // the same elements, one column to the right
  EXPECT_NE(refusal([&] { check_shard(path, m.files[0], m); }).find("the file holds"), std::string::npos);
  moved.start[1] -= 1, moved.begin += 1;  // the same box, the range shifted
  EXPECT_NE(refusal([&] { check_shard(path, m.files[0], m); }).find("the file holds"), std::string::npos);
}

}  // namespace
}  // namespace moe::ckpt
