// Where `moe prep` writes (docs/data.md "What --out may be"): --out checked before anything is read, the
// new directory beside it that the output is written into, and the rename that publishes it without
// replacing anything. Prep never overwrites or removes what it did not create. Not here: what is written
// (prep.cpp, shards.h).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace moe::data {

// --out without trailing slashes ("out/" names the directory out). BadInput for an empty path, "." or "..".
std::filesystem::path out_path(const std::string& out);

// Throws BadInput naming --out when it exists in any form (a directory, empty or not, a file, a symbolic
// link, dangling or looping), or cannot be created: a part of its path is a file, a symbolic link loop, or
// the nearest existing parent is not a directory this process may write into.
void check_out_path(const std::string& out);

// The directory the output is written into: `OUT.partial-PID` beside --out, made new (a name that
// exists is never reused), with the missing parents of --out. Unless committed, the destructor removes
// it and the parents it made (those still empty).
class OutputDir {
 public:
  explicit OutputDir(const std::string& out);
  ~OutputDir();
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;
  const std::filesystem::path& path() const { return partial_; }
  // Renames the directory to --out, which must still not exist (BadInput naming --out otherwise).
  void commit();

 private:
  std::string out_text_;
  std::filesystem::path out_, partial_;
  std::vector<std::filesystem::path> made_;  // parents made, outermost first
  bool committed_ = false;
};

}  // namespace moe::data
