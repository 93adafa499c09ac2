// Decisions every rank must share.
#include "launch/train/agree.h"

#include <map>
#include <vector>

#include "core/backend/cpu/blas_kernels.h"
#include "core/error.h"
#include "core/host.h"
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

std::string blas_kernels_disagreement(Communicator& world) {
  const std::vector<std::string> all = allgather_strings(world, cpu::blas_core() + " " + host_name());
  std::map<std::string, std::string> first;  // kernel set -> its first rank and host
  for (size_t r = 0; r < all.size(); ++r) {
    const size_t space = all[r].find(' ');
    first.emplace(all[r].substr(0, space), "rank " + std::to_string(r) + " on " + all[r].substr(space + 1));
  }
  if (first.size() < 2) return "";
  std::string sets;
  for (const auto& [core, rank] : first) sets += (sets.empty() ? "" : "; ") + core + " from " + rank;
  return "the ranks run different OpenBLAS kernels (" + sets +
         "): their GEMMs round differently, so this run will not repeat a run on other hosts or in another layout "
         "bit for bit; give every rank the same OPENBLAS_CORETYPE (mpirun -x OPENBLAS_CORETYPE=...; docs/design.md "
         "\"BLAS kernels\")";
}

}  // namespace moe
