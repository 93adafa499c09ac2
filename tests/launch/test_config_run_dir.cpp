// Tests of the writability checks of the run directory and the checkpoint roots (launch/run/run_dir.h): a path
// under a regular file, a name the file system cannot hold, a directory without write permission and a
// read-only file system, each refused naming the path, and nothing created by the checks.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config_test_util.h"
#include "launch/config/config.h"
#include "launch/run/run_dir.h"

namespace moe {
namespace {

using config_test::expect_bad_input;

namespace fs = std::filesystem;

// A fresh directory under the temporary folder, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("moe_test_dirs_" + std::to_string(::getpid()) + "_" + std::to_string(next_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  // Every path below the directory, to show that a refusal created nothing.
  std::vector<std::string> tree() const {
    std::vector<std::string> out;
    for (const auto& entry : fs::recursive_directory_iterator(path_)) out.push_back(entry.path().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  fs::path path_;
  static inline int next_ = 0;
};

TEST(RunDirWritable, NewAndExistingWritableDirectoriesPass) {
  const TempDir tmp;
  EXPECT_NO_THROW(check_dir_writable(tmp / "a/b/c", "--run-dir a/b/c"));
  EXPECT_NO_THROW(check_dir_writable(tmp.path().string(), "--run-dir"));
  EXPECT_NO_THROW(check_run_dir_usable(tmp / "run", false));
  EXPECT_TRUE(tmp.tree().empty());  // the checks create nothing
}

TEST(RunDirWritable, RefusesAPathUnderARegularFile) {
  const TempDir tmp;
  std::ofstream(tmp / "afile") << "x";
  const auto before = tmp.tree();
  expect_bad_input([&] { check_dir_writable(tmp / "afile/run/deeper", "--run-dir X"); },
                   {"--run-dir X", "cannot be created because", "afile is not a directory"});
  expect_bad_input([&] { check_dir_writable(tmp / "afile", "checkpoint.dir (afile)"); },
                   {"checkpoint.dir (afile)", "exists and is not a directory"});
  expect_bad_input([&] { check_run_dir_usable(tmp / "afile/run", true); }, {"--run-dir", "afile/run"});
  EXPECT_EQ(tmp.tree(), before);
}

TEST(RunDirWritable, RefusesANameTheFileSystemCannotHold) {
  const TempDir tmp;
  expect_bad_input([&] { check_dir_writable(tmp / ("run/" + std::string(300, 'n')), "--run-dir long"); },
                   {"--run-dir long", "300 characters", "at most 255"});
  expect_bad_input([&] { check_dir_writable(tmp / std::string(5000, 'x'), "--run-dir longer"); },
                   {"--run-dir longer", "PATH_MAX"});
  EXPECT_TRUE(tmp.tree().empty());
}

TEST(RunDirWritable, RefusesADirectoryWithoutWritePermission) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes regardless of permissions; the read-only mount test covers root";
  const TempDir tmp;
  fs::create_directories(tmp / "locked");
  fs::permissions(tmp / "locked", fs::perms::owner_read | fs::perms::owner_exec);
  expect_bad_input([&] { check_dir_writable(tmp / "locked/run", "--run-dir R"); },
                   {"--run-dir R", "locked", "not writable", "choose a writable location"});
  expect_bad_input([&] { check_run_dir_usable(tmp / "locked", false); }, {"locked", "not writable"});
  fs::permissions(tmp / "locked", fs::perms::owner_all);
  EXPECT_EQ(tmp.tree(), std::vector<std::string>{tmp / "locked"});
}

// A read-only tmpfs in a mount namespace of this process's own, so it needs no cleanup and is refused
// even as root (statvfs reports ST_RDONLY). Skipped where mounting is not permitted.
TEST(RunDirWritable, RefusesAReadOnlyFileSystemEvenAsRoot) {
  const TempDir tmp;
  fs::create_directories(tmp / "ro");
  if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
      ::mount("tmpfs", (tmp / "ro").c_str(), "tmpfs", MS_RDONLY, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount a read-only tmpfs here: " << std::strerror(errno);
  expect_bad_input([&] { check_dir_writable(tmp / "ro/run/deeper", "--run-dir D"); },
                   {"--run-dir D", "ro", "read-only file system", "choose a writable location"});
  expect_bad_input([&] { check_run_dir_usable(tmp / "ro", false); }, {"--run-dir", "read-only file system"});
  CheckpointConfig checkpoint;
  checkpoint.every = 1;
  expect_bad_input([&] { check_checkpoint_roots_writable(tmp / "ro/ckpt", checkpoint); },
                   {"checkpoint.dir (" + (tmp / "ro/ckpt") + ")", "read-only file system"});
  checkpoint.replicas = {tmp / "replica", tmp / "ro/replica"};
  expect_bad_input([&] { check_checkpoint_roots_writable(tmp / "ckpt", checkpoint); },
                   {"checkpoint.replicas[1]", "read-only file system"});
  checkpoint.every = 0;  // no checkpoints: nothing to check
  EXPECT_NO_THROW(check_checkpoint_roots_writable(tmp / "ro/ckpt", checkpoint));
  EXPECT_EQ(::umount2((tmp / "ro").c_str(), MNT_DETACH), 0);
  EXPECT_EQ(tmp.tree(), std::vector<std::string>{tmp / "ro"});
}

}  // namespace
}  // namespace moe
