// Decisions every rank must share.
#include "launch/agree.h"

#include <vector>

#include "core/error.h"

namespace moe {

std::string broadcast_string(Communicator& world, const std::string& text) {
  int64_t n = int64_t(text.size());
  world.broadcast(&n, 1, 0);
  std::vector<int64_t> bytes(text.begin(), text.end());
  bytes.resize(size_t(n));
  world.broadcast(bytes.data(), n, 0);
  return std::string(bytes.begin(), bytes.end());
}

void on_rank0_agree(Communicator& world, const std::function<void()>& check) {
  std::string message;
  int64_t kind = -1;
  if (world.rank() == 0) {
    try {
      check();
    } catch (const Error& e) {
      message = e.message();
      kind = int64_t(e.kind());
    }
  }
  int64_t header[2] = {kind, int64_t(message.size())};
  world.broadcast(header, 2, 0);
  if (header[0] < 0) return;
  const std::string text = broadcast_string(world, message);
  throw Error(ErrorKind(header[0]), __FILE__, __LINE__, text);
}

}  // namespace moe
