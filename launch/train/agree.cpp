// Decisions every rank must share.
#include "launch/train/agree.h"

#include <vector>

#include "core/error.h"
#include "parallel/strings.h"

namespace moe {

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
