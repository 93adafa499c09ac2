// Checkpoints written before the gated MLPs' W1 and W3 became one tensor hold them as two: "<prefix>.w1" and
// "<prefix>.w3" of global shape (..., D, F), for every prefix of a SwiGLU MLP (params/, and AdamW's moments under
// optim/exp_avg/ and optim/exp_avg_sq/). The model now has "<prefix>.w13" of global shape (..., D, 2, F), part 0 W1
// and part 1 W3 (core/params.h ParamSpec::parts). Each stored piece of a part is a slab of the stacked tensor as it
// is: the same box with the axis of extent 2 inserted before the last, at index 0 or 1, and the same range of it (an
// axis of extent 1 changes no row-major order), so restoring intersects slabs as for any other tensor. Applied where
// a model reads a checkpoint (a run resuming, `moe export-hf`, `moe logits`); `moe ckpt` shows what is stored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "checkpoint/manifest.h"

namespace moe::ckpt {

// Which stacked tensor a part's name is a part of, and at which index: "<prefix>.w1" is part 0 of "<prefix>.w13",
// "<prefix>.w3" part 1; nullopt for every other name. The one statement of that naming, for checkpoints and the
// Hugging Face mappings alike.
struct StackedPart {
  std::string stacked;
  int64_t index = 0;
};
std::optional<StackedPart> stacked_part(const std::string& tensor);

// The dataset entries of `m` for the parts of stacked tensors, as slabs of those tensors (their `dataset` in the
// file unchanged); nothing else changes. A part without its sibling (same dtype and global shape) stays as it is.
void stack_legacy_parts(Manifest& m);

}  // namespace moe::ckpt
