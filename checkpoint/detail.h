// Helpers shared by the writer (checkpointer.cpp) and the restore (restore.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/shard_file.h"
#include "parallel/communicator.h"

namespace moe::ckpt::detail {

size_t dtype_size(DType t);
// "step-00000010" -> 10; -1 for other names.
int64_t step_of_dir(const std::string& name);
std::string peer_file_name(int64_t rank);
// Every rank's string, on every rank (collective).

}  // namespace moe::ckpt::detail
