// The directory an --out option names for a command that makes one (moe export hf, moe import hf): the path with
// its last component its own name, checked before anything is written. Not here: what may already be there (each
// command's own rule).
#pragma once

#include <filesystem>
#include <string>

namespace moe {

// `text` with a trailing slash dropped; BadInput naming `option` when it is empty, "." or "..", or when its parent
// is not an existing directory this process may write into, or is a checkpoint directory (checkpoints are never
// modified).
std::filesystem::path output_directory(const std::string& text, const std::string& option);

}  // namespace moe
