#!/usr/bin/env bash
# The layers reach a backend through core/backend/ops.h and backend.h alone (docs/design.md "The backend seam"): no
# file of core/ outside core/backend/, of optim/, parallel/, checkpoint/ or data/ includes a backend's own headers
# (core/backend/cpu/, core/backend/cuda/). parallel/nccl/ is the NCCL communicator, CUDA's by nature.
set -euo pipefail
cd "$1"
mapfile -t bad < <(grep -rlE '#include "core/backend/(cpu|cuda)/' core optim parallel checkpoint data |
                     grep -vE '^(core/backend|parallel/nccl)/' || true)
if [ ${#bad[@]} -gt 0 ]; then
  echo "these files include a backend's own headers (go through Ops, or move shared host code beside its layer):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "no layer includes a backend's own headers"
