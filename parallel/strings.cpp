// Strings over a communicator: lengths first, then the bytes packed eight to an int64.
#include "parallel/strings.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace moe {

std::vector<std::string> allgather_strings(Communicator& comm, const std::string& mine) {
  const int P = comm.size();
  int64_t length = int64_t(mine.size());
  std::vector<int64_t> lengths(static_cast<size_t>(P));
  comm.allgather(&length, lengths.data(), 1);
  int64_t words = 0;
  for (int64_t l : lengths) words = std::max(words, (l + 7) / 8);
  std::vector<int64_t> send(static_cast<size_t>(words), 0), all(static_cast<size_t>(words * P));
  if (!mine.empty()) std::memcpy(send.data(), mine.data(), mine.size());
  comm.allgather(send.data(), all.data(), words);
  std::vector<std::string> out;
  for (int r = 0; r < P; ++r)
    out.emplace_back(reinterpret_cast<const char*>(all.data() + int64_t(r) * words), size_t(lengths[size_t(r)]));
  return out;
}

std::string broadcast_string(Communicator& comm, const std::string& text) {
  int64_t n = int64_t(text.size());
  comm.broadcast(&n, 1, 0);
  std::vector<int64_t> words(static_cast<size_t>((n + 7) / 8), 0);
  if (comm.rank() == 0 && n > 0) std::memcpy(words.data(), text.data(), size_t(n));
  comm.broadcast(words.data(), int64_t(words.size()), 0);
  return std::string(reinterpret_cast<const char*>(words.data()), size_t(n));
}

}  // namespace moe
