// ROOT/latest (checkpoint/root.h): the checkpoint library writes it after each commit and reads it for
// `moe ckpt ls`; nothing else touches it. Informational: a missing or odd one is no error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "checkpoint/root.h"

namespace moe::ckpt {
namespace {

namespace fs = std::filesystem;

struct TempRoot {
  TempRoot() : path(fs::temp_directory_path() / ("moe_latest_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempRoot() { fs::remove_all(path); }
  fs::path path;
};

TEST(Latest, WrittenNameIsReadBackAndReplaced) {
  TempRoot root;
  write_latest(root.path.string(), "step-00000010");
  EXPECT_EQ(read_latest(root.path.string()), "step-00000010");
  write_latest(root.path.string(), "step-00000020");
  EXPECT_EQ(read_latest(root.path.string()), "step-00000020");
  EXPECT_FALSE(fs::exists(root.path / (std::string(kLatestName) + ".tmp")));
  std::ifstream in(root.path / kLatestName);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "step-00000020\n");  // one line, as before
}

TEST(Latest, MissingOrNotARegularFileReadsAsNone) {
  TempRoot root;
  EXPECT_EQ(read_latest(root.path.string()), "");
  EXPECT_EQ(read_latest((root.path / "no-such-root").string()), "");
  fs::create_directory(root.path / kLatestName);
  EXPECT_EQ(read_latest(root.path.string()), "");
}

TEST(Latest, TrailingCarriageReturnsAndSpacesAreDropped) {
  TempRoot root;
  std::ofstream(root.path / kLatestName) << "step-00000004 \r\nstep-00000009\n";
  EXPECT_EQ(read_latest(root.path.string()), "step-00000004");
}

TEST(Latest, IsOneOfTheProgramsOwnEntries) {
  TempRoot root;
  write_latest(root.path.string(), "step-00000001");
  const RootView view = view_root(root.path.string());
  EXPECT_TRUE(view.foreign.empty());
  ASSERT_EQ(view.ours.size(), 1u);
  EXPECT_EQ(view.ours[0], kLatestName);
}

}  // namespace
}  // namespace moe::ckpt
