// Hyperslab pieces across ranks (4 ranks, under mpirun): each rank saves its block of columns of a (6, 10)
// tensor, cut into two ZeRO-like ranges, as a full checkpoint and a delta; each rank then reads back a block
// of rows with ranges, from a shared root (load_pieces) and from node-local roots of two simulated hosts
// (find_newest_distributed, load_pieces_distributed), and gets exactly the values saved.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "parallel/mpi_communicator.h"

namespace moe::ckpt {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kRows = 6, kCols = 10;

double value(int64_t step, int64_t row, int64_t col) { return double(step * 1000 + row * kCols + col) + 0.25; }

std::vector<double> values_of(const Slab& slab, int64_t step) {
  std::vector<double> out;
  int64_t i = 0;
  for (int64_t r = slab.start[0]; r < slab.start[0] + slab.shape[0]; ++r)
    for (int64_t c = slab.start[1]; c < slab.start[1] + slab.shape[1]; ++c, ++i)
      if (i >= slab.begin && i < slab.begin + slab.count) out.push_back(value(step, r, c));
  return out;
}

// Rank r's block of `axis` (of four uneven blocks), cut into two ranges of its row-major order.
std::vector<Slab> block_of(int rank, size_t axis) {
  const std::vector<int64_t> starts =
      axis == 1 ? std::vector<int64_t>{0, 3, 6, 8, 10} : std::vector<int64_t>{0, 2, 4, 5, 6};
  std::vector<int64_t> start = {0, 0}, shape = {kRows, kCols};
  start[axis] = starts[size_t(rank)], shape[axis] = starts[size_t(rank) + 1] - starts[size_t(rank)];
  const Slab box = Slab::box({kRows, kCols}, start, shape);
  const int64_t cut = box.count / 2 + 1;
  return {{box.global_shape, start, shape, 0, cut}, {box.global_shape, start, shape, cut, box.count - cut}};
}

// Saves steps 1 (full) and 2 (delta) of this rank's column block, as f32 and f64 tensors.
void save_two_steps(Communicator& world, SaveSettings settings) {
  settings.full_every = 2;
  settings.async = false;
  Checkpointer ck(settings, world, nlohmann::json::object(), nullptr);
  for (int64_t step = 1; step <= 2; ++step) {
    std::vector<std::vector<float>> f32;
    std::vector<std::vector<double>> f64;
    const std::vector<Slab> mine = block_of(world.rank(), 1);
    for (const Slab& s : mine) {
      f64.push_back(values_of(s, step));
      f32.emplace_back(f64.back().begin(), f64.back().end());
    }
    std::vector<Piece> pieces;
    for (size_t i = 0; i < mine.size(); ++i) {
      pieces.push_back({"params/w", DType::F32, mine[i], f32[i].data(), nullptr});
      pieces.push_back({"optim/w64", DType::F64, mine[i], f64[i].data(), nullptr});
    }
    ck.save(step, pieces);
  }
  ck.finish();
  world.barrier();  // rank 0 commits after the others return from finish()
}

// This rank's row block, to be filled by `load`, then checked against `step`.
void expect_row_block(int rank, int64_t step, const std::function<void(const std::vector<Piece>&)>& load,
                      const std::string& what) {
  const std::vector<Slab> wanted = block_of(rank, 0);
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<double>> f64;
  for (const Slab& s : wanted) f32.emplace_back(size_t(s.count), -1.0f), f64.emplace_back(size_t(s.count), -1.0);
  std::vector<Piece> pieces;
  for (size_t i = 0; i < wanted.size(); ++i) {
    pieces.push_back({"params/w", DType::F32, wanted[i], nullptr, f32[i].data()});
    pieces.push_back({"optim/w64", DType::F64, wanted[i], nullptr, f64[i].data()});
  }
  load(pieces);
  for (size_t i = 0; i < wanted.size(); ++i) {
    const std::vector<double> want = values_of(wanted[i], step);
    EXPECT_EQ(f64[i], want) << what << ": rank " << rank << " " << wanted[i].text();
    EXPECT_EQ(f32[i], std::vector<float>(want.begin(), want.end())) << what << ": rank " << rank;
  }
}

fs::path temp_root(Communicator& world) {
  int64_t id = ::getpid();
  world.broadcast(&id, 1, 0);
  return fs::temp_directory_path() / ("moe_slab_ranks_" + std::to_string(id));
}

TEST(SlabRanks, ColumnBlocksOfFourRanksReadBackAsRowBlocks) {
  auto world = MpiCommunicator::world();
  ASSERT_EQ(world->size(), 4);
  const fs::path root = temp_root(*world);
  SaveSettings shared;
  shared.root = (root / "shared").string();
  save_two_steps(*world, shared);
  for (int64_t step : {1, 2}) {
    std::string why;
    const auto resolved = verify_checkpoint((root / "shared" / checkpoint_name(step)).string(), {}, &why);
    ASSERT_TRUE(resolved.has_value()) << why;
    expect_row_block(
        world->rank(), step, [&](const std::vector<Piece>& p) { load_pieces(*resolved, p); },
        "shared root, step " + std::to_string(step));
  }

  // Two simulated hosts of two ranks, each with its own root.
  SaveSettings local;
  local.node_local = true;
  local.local_ranks = 2;
  local.root = (root / ("host" + std::to_string(world->rank() / 2))).string();
  save_two_steps(*world, local);
  std::vector<std::string> notes;
  const auto choice = find_newest_distributed(*world, local.root, world->rank() % 2 == 0, &notes);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->dir_name, checkpoint_name(2));
  expect_row_block(
      world->rank(), 2, [&](const std::vector<Piece>& p) { load_pieces_distributed(*world, *choice, p); },
      "node-local roots");
  world->barrier();
  if (world->rank() == 0) fs::remove_all(root);
}

}  // namespace
}  // namespace moe::ckpt
