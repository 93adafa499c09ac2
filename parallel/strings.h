// Strings over a communicator, for the control plane (manifests, file entries, messages, timelines):
// every rank's string on every rank, and rank 0's string on every rank. Collective.
#pragma once

#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace moe {

// Every rank's `mine`, in rank order, on every rank.
std::vector<std::string> allgather_strings(Communicator& comm, const std::string& mine);
// Rank 0's `text` on every rank.
std::string broadcast_string(Communicator& comm, const std::string& text);

}  // namespace moe
