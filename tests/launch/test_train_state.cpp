// The trainer's collection of checkpoint state (launch/train/train_state.h): each component declares its pieces
// (core/state.h), and the collection saves them, hands them back to a restore and puts them in force, whatever
// the component. Not here: the trainer's own components end to end (test_checkpoint_resume,
// test_checkpoint_damage, test_four_dimensions), the pieces' intersection (tests/checkpoint/test_slab.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "checkpoint/verify.h"
#include "core/error.h"
#include "launch/train/train_state.h"
#include "parallel/self_communicator.h"

namespace moe {
namespace {

namespace fs = std::filesystem;

// A component of its own kind: three doubles of a tensor of five that this rank alone holds, and a counter
// every rank holds alike. Its state is in force once state_restored has run.
class Tally : public Stateful {
 public:
  explicit Tally(std::string name) : name_(std::move(name)) {}
  std::vector<StatePiece> state_pieces(StateUse use) override {
    ++declared[use == StateUse::Save ? 0 : 1];
    return {StatePiece::box("tally/" + name_ + ".values", DType::F64, {3}, {0}, {3}, values.data(), ParamGroup::None),
            StatePiece::whole("tally/" + name_ + ".count", DType::I64, {1}, &count, ParamGroup::World)};
  }
  void state_restored() override { ++restored; }

  std::vector<double> values{1.5, -2.25, 3.0};
  int64_t count = 7;
  int declared[2] = {0, 0};  // saves, restores
  int restored = 0;

 private:
  std::string name_;
};

// A component whose one piece is a range of a block: elements [2, 2 + 3) of rows 1-2 of a (4, 3) tensor.
class Slice : public Stateful {
 public:
  std::vector<StatePiece> state_pieces(StateUse) override {
    StatePiece p = StatePiece::box("slice/w", DType::F32, {4, 3}, {1, 0}, {2, 3}, values.data(), ParamGroup::None);
    p.begin = 2, p.count = 3;
    return {p};
  }
  std::vector<float> values{0.5f, 1.5f, 2.5f};
};

// A component declaring a dtype no checkpoint stores.
class Indices : public Stateful {
 public:
  std::vector<StatePiece> state_pieces(StateUse) override {
    return {StatePiece::whole("indices/rows", DType::I32, {2}, rows.data(), ParamGroup::None)};
  }
  std::vector<int32_t> rows{4, 5};
};

struct OneRank {
  OneRank() : groups(make_process_groups(std::make_unique<SelfCommunicator>("world"), RankGrid(GridSizes{}))) {}
  ProcessGroups groups;
};

TrainState state_of(const ProcessGroups& groups, std::vector<Stateful*> components) {
  TrainState s;
  s.components = std::move(components);
  s.groups = &groups;
  return s;
}

TEST(TrainState, CollectsEveryComponentsPiecesInTheirOrder) {
  OneRank one;
  Tally a("a"), b("b");
  TrainState s = state_of(one.groups, {&a, &b});
  const std::vector<ckpt::Piece> saved = checkpoint_pieces(s, true);
  ASSERT_EQ(saved.size(), 4u);
  const std::vector<std::string> names = {"tally/a.values", "tally/a.count", "tally/b.values", "tally/b.count"};
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(saved[i].tensor, names[i]);
  EXPECT_EQ(saved[0].dtype, ckpt::DType::F64);
  EXPECT_EQ(saved[1].dtype, ckpt::DType::I64);
  EXPECT_EQ(saved[0].src, a.values.data());
  EXPECT_EQ(saved[3].src, &b.count);
  EXPECT_EQ(saved[0].slab, ckpt::Slab::whole({3}));
  EXPECT_EQ(a.declared[0], 1);
  EXPECT_EQ(b.declared[0], 1);
  // A restore asks them again, for where the values go.
  const std::vector<ckpt::Piece> wanted = checkpoint_pieces(s, false);
  ASSERT_EQ(wanted.size(), 4u);
  EXPECT_EQ(wanted[2].dst, b.values.data());
  EXPECT_EQ(a.declared[1], 1);
}

TEST(TrainState, ARangeOfAHyperslabIsThePiecesRange) {
  OneRank one;
  Slice slice;
  TrainState s = state_of(one.groups, {&slice});
  const std::vector<ckpt::Piece> saved = checkpoint_pieces(s, true);
  ASSERT_EQ(saved.size(), 1u);
  ckpt::Slab want = ckpt::Slab::box({4, 3}, {1, 0}, {2, 3});
  want.begin = 2, want.count = 3;
  EXPECT_EQ(saved[0].slab, want) << saved[0].slab.text();
  EXPECT_EQ(saved[0].dtype, ckpt::DType::F32);
  EXPECT_EQ(saved[0].bytes(), 12);
}

TEST(TrainState, ADtypeNoCheckpointStoresIsRefusedNamingTheTensor) {
  OneRank one;
  Indices indices;
  TrainState s = state_of(one.groups, {&indices});
  try {
    checkpoint_pieces(s, true);
    FAIL() << "an i32 piece was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("indices/rows"), std::string::npos) << e.message();
  }
}

TEST(TrainState, SavedStateIsRestoredIntoEachComponentAndPutInForce) {
  OneRank one;
  const fs::path root = fs::temp_directory_path() / ("moe_train_state_" + std::to_string(::getpid()));
  fs::remove_all(root);
  Tally a("a"), b("b");
  b.values = {-1.0, 0.25, 8.0}, b.count = 11;
  TrainState s = state_of(one.groups, {&a, &b});
  {
    ckpt::SaveSettings settings;
    settings.root = root.string();
    settings.async = false;
    ckpt::Checkpointer checkpointer(settings, *one.groups.world, nlohmann::json::object(), nullptr);
    checkpointer.save(3, checkpoint_pieces(s, true));
    checkpointer.finish();
  }
  a.values = {0, 0, 0}, a.count = 0, b.values = {0, 0, 0}, b.count = 0;
  std::string why;
  const auto resolved = ckpt::verify_checkpoint((root / ckpt::checkpoint_name(3)).string(), {}, &why);
  ASSERT_TRUE(resolved.has_value()) << why;
  ckpt::load_pieces(*resolved, checkpoint_pieces(s, false));
  finish_load(s);
  EXPECT_EQ(a.values, (std::vector<double>{1.5, -2.25, 3.0}));
  EXPECT_EQ(a.count, 7);
  EXPECT_EQ(b.values, (std::vector<double>{-1.0, 0.25, 8.0}));
  EXPECT_EQ(b.count, 11);
  EXPECT_EQ(a.restored, 1);
  EXPECT_EQ(b.restored, 1);
  fs::remove_all(root);
}

}  // namespace
}  // namespace moe
