// The NCCL communicator: the Communicator seam (communicator.h) for device memory of the CUDA backend, one per
// process group. Its NCCL communicator is created from an ncclUniqueId that the group's rank 0 makes and
// broadcasts over `control`, the same group's MPI communicator (MPI stays the control plane and carries
// everything on host memory). Collectives run on the communicator's own stream, so gradient reduction and the
// expert all-to-all overlap the backend's compute: each waits for the compute stream's work queued before it,
// and completing a request (wait) makes the compute stream wait for it, without blocking the host. The
// blocking forms are a nonblocking form completed at once: later compute is ordered after them; the host
// synchronises only in barrier(). Point-to-point transfers between a pair are matched in the order they are
// issued (NCCL has no tags: `tag` is ignored) and a receive cannot check the count sent. Sends and receives
// are held until one of their requests is tested or waited for (a blocking form waits at once) or another
// operation comes, then go to NCCL as one group: a pipeline stage's send and its next receive run together,
// which NCCL needs where neighbours both send first.
// Built only with the CUDA backend and NCCL (nccl_built()); make_nccl_communicator refuses otherwise.
#pragma once

#include <memory>

#include "core/backend/backend.h"
#include "parallel/communicator.h"

namespace moe {

bool nccl_built();
// Over the ranks of `control` (an MPI communicator of one process group), for buffers of `backend` (a CUDA
// backend: its stream is the compute stream). Collective over `control`. Throws moe::Error (BadInput) when
// this build has no NCCL or the backend is not a CUDA one.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& control, Backend& backend);

}  // namespace moe
