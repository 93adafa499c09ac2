// The conjugate mappings of tensor and sequence parallelism.
#include "parallel/tp_mappings.h"

#include <cstring>
#include <vector>

namespace moe::tp {
namespace {

// Column block `block` of a (rows, blocks * cols) matrix, to or from a contiguous (rows, cols) one.
void copy_block_out(const float* full, float* local, int64_t rows, int64_t cols, int64_t blocks, int64_t block) {
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(local + r * cols, full + (r * blocks + block) * cols, size_t(cols) * sizeof(float));
}
void copy_block_in(const float* local, float* full, int64_t rows, int64_t cols, int64_t blocks, int64_t block) {
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(full + (r * blocks + block) * cols, local + r * cols, size_t(cols) * sizeof(float));
}

// full (rows, tp * cols) from every rank's (rows, cols): gathered rank-major, then interleaved.
void allgather_columns(Communicator& tp, const float* local, float* full, int64_t rows, int64_t cols) {
  const int64_t n = tp.size();
  if (n == 1) {
    std::memcpy(full, local, size_t(rows * cols) * sizeof(float));
    return;
  }
  std::vector<float> blocks(size_t(n * rows * cols));
  tp.allgather(local, blocks.data(), rows * cols);
  for (int64_t b = 0; b < n; ++b) copy_block_in(blocks.data() + b * rows * cols, full, rows, cols, n, b);
}

}  // namespace

void copy_to_region_backward(Communicator& tp, float* dx, int64_t n) {
  if (tp.size() > 1) tp.allreduce_sum(dx, n);
}

void reduce_from_region_forward(Communicator& tp, float* y, int64_t n) {
  if (tp.size() > 1) tp.allreduce_sum(y, n);
}

void gather_rows_forward(Communicator& tp, const float* local, float* full, int64_t rows, int64_t width) {
  if (tp.size() == 1) {
    std::memcpy(full, local, size_t(rows * width) * sizeof(float));
    return;
  }
  tp.allgather(local, full, rows * width);
}

void gather_rows_backward(Communicator& tp, const float* dfull, float* dlocal, int64_t rows, int64_t width) {
  if (tp.size() == 1) {
    std::memcpy(dlocal, dfull, size_t(rows * width) * sizeof(float));
    return;
  }
  tp.reduce_scatter_sum(dfull, dlocal, rows * width);
}

void reduce_scatter_rows_forward(Communicator& tp, const float* full, float* local, int64_t rows, int64_t width) {
  gather_rows_backward(tp, full, local, rows, width);  // the same collective: its conjugate's backward
}

void reduce_scatter_rows_backward(Communicator& tp, const float* dlocal, float* dfull, int64_t rows, int64_t width) {
  gather_rows_forward(tp, dlocal, dfull, rows, width);
}

void split_columns_forward(Communicator& tp, const float* full, float* local, int64_t rows, int64_t cols) {
  copy_block_out(full, local, rows, cols, tp.size(), tp.rank());
}

void split_columns_backward(Communicator& tp, const float* dlocal, float* dfull, int64_t rows, int64_t cols) {
  allgather_columns(tp, dlocal, dfull, rows, cols);
}

void gather_columns_forward(Communicator& tp, const float* local, float* full, int64_t rows, int64_t cols) {
  allgather_columns(tp, local, full, rows, cols);
}

void gather_columns_backward(Communicator& tp, const float* dfull, float* dlocal, int64_t rows, int64_t cols) {
  copy_block_out(dfull, dlocal, rows, cols, tp.size(), tp.rank());
}

}  // namespace moe::tp
