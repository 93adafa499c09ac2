// What the data tests share: a fresh directory per test with files written into it (gzip too), and the check
// that a call is refused as bad input naming what it must.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"

namespace moe::data::test_support {

// A fresh directory per test (named after it), removed afterwards.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("moe_test_" + tag + "_" + std::to_string(::getpid()) + "_" + info->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // Writes `bytes` to `name` (its folders made) and returns its path.
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::filesystem::path file = path_ / name;
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file, std::ios::binary) << bytes;
    return file.string();
  }
  // The same, gzip-compressed.
  std::string write_gz(const std::string& name, const std::string& bytes) const {
    const std::filesystem::path file = path_ / name;
    std::filesystem::create_directories(file.parent_path());
    gzFile gz = gzopen(file.c_str(), "wb");
    gzwrite(gz, bytes.data(), unsigned(bytes.size()));
    gzclose(gz);
    return file.string();
  }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Runs fn, expects moe::Error of kind BadInput whose message contains every one of `needles`.
inline void expect_bad_input(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown; expected BadInput mentioning " << needles.front();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.message();
    for (const std::string& needle : needles)
      EXPECT_NE(e.message().find(needle), std::string::npos) << "'" << needle << "' not in: " << e.message();
  }
}

}  // namespace moe::data::test_support
