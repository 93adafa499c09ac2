// Who writes a replicated tensor: one member of its replica group, chosen so that the group's members
// write about equal bytes (with dp 4, four ranks write a quarter each, instead of one rank everything).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace moe::ckpt {

// items: (tensor name, bytes) of the tensors every member of a replica group holds alike. Returns, per
// item, the member (0 .. members - 1) that writes it: the items largest first (ties by name), each to the
// member with the fewest bytes so far (the lowest on a tie). A pure function of its arguments, so every
// member computes the same assignment without talking to the others.
std::vector<int> assign_writers(const std::vector<std::pair<std::string, int64_t>>& items, int members);

}  // namespace moe::ckpt
