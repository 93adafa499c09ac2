// Nothing that is not finite is ever committed (docs/checkpoint.md, "What is never committed"; docs/design.md,
// invariant 4), now that the writer counts such values while it copies the snapshot, off the step's critical
// path, and the ranks agree on the count before anything could depend on the save. Under mpirun -np 2: the
// Checkpointer with a NaN and an infinity on rank 0 alone refuses the save on every rank (the wait for the
// snapshot, the commit, or a synchronous save itself), removes its temporary directory and keeps the committed
// checkpoint; and the trainer, whose learning rate turns the weights infinite after a checkpoint was committed,
// fails with the message on 1 and 2 ranks, asynchronously and synchronously, committing nothing of that step.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "core/error.h"
#include "layout_runs.h"
#include "parallel/mpi_communicator.h"

namespace moe {
namespace {
using namespace test_support;
namespace fs = std::filesystem;

struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The root holds exactly the committed step `step`, no temporary directory, and `latest` names it.
void expect_only_committed(const fs::path& root, int64_t step, const std::string& what) {
  const std::string name = ckpt::checkpoint_name(step);
  EXPECT_TRUE(fs::exists(root / name / "manifest.json")) << what;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_directory()) {
      EXPECT_EQ(entry.path().filename().string(), name) << what;
    }
  }
  EXPECT_EQ(read_text_if_any(root / "latest"), name + "\n") << what;
}

TEST(NonFiniteSave, OneRanksNaNRefusesTheSaveOnEveryRank) {
  auto world = MpiCommunicator::world();
  const int64_t W = world->size(), r = world->rank(), n = 5000;  // n values per rank, two blocks of the count
  for (const std::string how : {"async_wait", "async_finish", "sync"}) {
    const fs::path root = shared_temp_root("moe_non_finite_", how);
    std::vector<ckpt::NonFiniteSnapshot> seen;
    ckpt::SaveSettings settings;
    settings.root = root.string();
    settings.async = how != "sync";
    settings.snapshot_delay_s = 0.1;  // the wait below comes before the snapshot is taken
    settings.on_non_finite = [&](const ckpt::NonFiniteSnapshot& found) {
      seen.push_back(found);
      throw Refused("refused");
    };
    if (r == 0) fs::create_directories(root);
    world->barrier();
    ckpt::Checkpointer ck(settings, *world, nlohmann::json::object(), nullptr);
    std::vector<float> f32(static_cast<size_t>(n));
    std::vector<double> f64(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) f32[size_t(i)] = float(r * n + i), f64[size_t(i)] = double(r * n + i) + 0.5;
    const ckpt::Slab mine = ckpt::Slab::flat({W * n}, r * n, n);
    const std::vector<ckpt::Piece> pieces = {{"params/w", ckpt::DType::F32, mine, f32.data(), nullptr},
                                             {"optim/w64", ckpt::DType::F64, mine, f64.data(), nullptr}};
    ck.save(1, pieces);
    ck.finish();
    if (r == 0) f32[4500] = std::nanf(""), f64[7] = -std::numeric_limits<double>::infinity();
    if (how == "sync") {
      EXPECT_THROW(ck.save(2, pieces), Refused) << how;
    } else {
      ck.save(2, pieces);
      EXPECT_THROW(how == "async_wait" ? (void)ck.wait_snapshot() : ck.finish(), Refused) << how;
    }
    ASSERT_EQ(seen.size(), 1u) << how;
    EXPECT_EQ(seen[0].step, 2) << how;
    EXPECT_EQ(seen[0].count, 2) << how;
    EXPECT_EQ(seen[0].first_tensor, r == 0 ? "params/w" : "") << how;
    world->barrier();
    expect_only_committed(root, 1, how);
    world->barrier();  // every rank looked before the next save creates its directory
    // The checkpointer goes on: a finite state is saved again, as a new full chain.
    if (r == 0) f32[4500] = 1.0f, f64[7] = 2.0;
    ck.save(3, pieces);
    ck.finish();
    world->barrier();
    std::string why;
    EXPECT_TRUE(ckpt::verify_checkpoint((root / ckpt::checkpoint_name(3)).string(), {}, &why).has_value())
        << how << ": " << why;
    world->barrier();
    if (r == 0) fs::remove_all(root.parent_path());
  }
}

TEST(NonFiniteSave, DivergedRunFailsWithoutCommittingTheStep) {
  const int W = MpiCommunicator::world()->size();
  for (const int ranks : W > 1 ? std::vector<int>{1, W} : std::vector<int>{1}) {
    for (const std::string async : {"true", "false"}) {
      const std::string what = std::to_string(ranks) + " ranks, checkpoint.async=" + async;
      const fs::path root = shared_temp_root("moe_non_finite_", "run_" + std::to_string(ranks) + "_" + async);
      const std::vector<std::string> good =
          small_moe_overrides({"train.steps=8", "train.global_batch=4", "train.eval_every=0", "checkpoint.every=1",
                               "checkpoint.keep=1", "checkpoint.full_every=1", "checkpoint.async=" + async});
      train_on(ranks, good, root.string(), 4);
      std::vector<std::string> diverging = good;
      // lr * weight decay is infinite in float: the update of step 5 makes the weights so.
      diverging.insert(diverging.end(), {"optim.lr=3e38", "optim.weight_decay=10"});
      if (async == "true") ::setenv("MOE_TEST_SNAPSHOT_DELAY_MS", "200", 1);
      std::string message;
      try {
        train_on(ranks, diverging, root.string());
        if (MpiCommunicator::world()->rank() < ranks) ADD_FAILURE() << what << ": the diverged run did not fail";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::RunFailed) << what << ": " << e.message();
        message = e.message();
        MpiCommunicator::world()->barrier();  // train_on's, which the throw skipped
      }
      ::unsetenv("MOE_TEST_SNAPSHOT_DELAY_MS");
      if (MpiCommunicator::world()->rank() >= ranks) continue;
      EXPECT_NE(message.find("after step 5, "), std::string::npos) << what << ": " << message;
      EXPECT_NE(message.find("values of the training state are not finite"), std::string::npos) << what;
      EXPECT_NE(message.find("no checkpoint of this step is written and the committed ones are kept"),
                std::string::npos)
          << what << ": " << message;
      expect_only_committed(root / "checkpoints", 4, what);
    }
  }
  const fs::path runs = shared_temp_root("moe_non_finite_", "runs").parent_path();  // collective
  MpiCommunicator::world()->barrier();
  if (MpiCommunicator::world()->rank() == 0) fs::remove_all(runs);
}

}  // namespace
}  // namespace moe
