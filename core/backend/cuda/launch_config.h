// Launch configurations of the CUDA backend's kernels, as plain arithmetic (no CUDA types) so that they are
// tested without a GPU. Elementwise kernels use grid-stride loops: a grid capped at kMaxBlocks covers any n.
// Row kernels run one block per row (rows beyond kMaxBlocks are looped over by the kernel): a block of up to 256
// threads, a power of two no wider than the row needs, whose tree reductions have a fixed order. Every launch
// uses the x dimension only.
#pragma once

#include <algorithm>
#include <cstdint>

namespace moe::cuda {

struct LaunchConfig {
  uint32_t blocks = 1, threads = 1;
};

inline constexpr uint32_t kThreads = 256;
// Not the hardware's limit (x allows 2^31 - 1 blocks; 65535 is y's and z's): a cap of our own. 65535 blocks of 256
// threads fill any current GPU many times over, and the grid-stride and row loops cover what lies beyond.
inline constexpr uint32_t kMaxBlocks = 65535;

// n independent elements, a grid-stride loop: at least one block, at most kMaxBlocks.
inline LaunchConfig elementwise_launch(int64_t n) {
  const int64_t needed = (std::max<int64_t>(n, 1) + kThreads - 1) / kThreads;
  return {uint32_t(std::min<int64_t>(needed, kMaxBlocks)), kThreads};
}

// One block per row of `width` elements (rows beyond kMaxBlocks looped by the kernel): the threads a power of
// two from 32 to kThreads, the smallest that covers the width.
inline LaunchConfig row_launch(int64_t rows, int64_t width) {
  uint32_t threads = 32;
  while (threads < kThreads && int64_t(threads) < width) threads *= 2;
  return {uint32_t(std::clamp<int64_t>(rows, 1, kMaxBlocks)), threads};
}

}  // namespace moe::cuda
