// The conjugate mappings of tensor and sequence parallelism.
#include "parallel/tp_mappings.h"

namespace moe::tp {
namespace {

// Column block `block` of a (rows, blocks * cols) matrix, to or from a contiguous (rows, cols) one: one strided
// copy on the backend (device to device on a GPU).
template <typename T>
void copy_block_out(Backend& backend, const T* full, T* local, int64_t rows, int64_t cols, int64_t blocks,
                    int64_t block) {
  backend.ops<T>().copy_strided(full + block * cols, blocks * cols, local, cols, rows, cols);
}
template <typename T>
void copy_block_in(Backend& backend, const T* local, T* full, int64_t rows, int64_t cols, int64_t blocks,
                   int64_t block) {
  backend.ops<T>().copy_strided(local, cols, full + block * cols, blocks * cols, rows, cols);
}

// full (rows, tp * cols) from every rank's (rows, cols): gathered rank-major into backend workspace, then
// interleaved.
template <typename T>
void allgather_columns(Backend& backend, Communicator& tp, const T* local, T* full, int64_t rows, int64_t cols) {
  const int64_t n = tp.size();
  if (n == 1) {
    backend.copy(full, local, size_t(rows * cols) * sizeof(T));
    return;
  }
  Buffer blocks = backend.allocate(dtype_of<T>(), n * rows * cols);
  T* gathered = blocks.data<T>();
  tp.allgather(local, gathered, rows * cols);
  for (int64_t b = 0; b < n; ++b) copy_block_in(backend, gathered + b * rows * cols, full, rows, cols, n, b);
}

}  // namespace

template <typename T>
void copy_to_region_backward(Communicator& tp, T* dx, int64_t n) {
  if (tp.size() > 1) tp.allreduce_sum(dx, n);
}

template <typename T>
void reduce_from_region_forward(Communicator& tp, T* y, int64_t n) {
  if (tp.size() > 1) tp.allreduce_sum(y, n);
}

template <typename T>
void gather_rows_forward(Backend& backend, Communicator& tp, const T* local, T* full, int64_t rows, int64_t width) {
  if (tp.size() == 1) {
    backend.copy(full, local, size_t(rows * width) * sizeof(T));
    return;
  }
  tp.allgather(local, full, rows * width);
}

template <typename T>
void gather_rows_backward(Backend& backend, Communicator& tp, const T* dfull, T* dlocal, int64_t rows, int64_t width) {
  if (tp.size() == 1) {
    backend.copy(dlocal, dfull, size_t(rows * width) * sizeof(T));
    return;
  }
  tp.reduce_scatter_sum(dfull, dlocal, rows * width);
}

template <typename T>
void reduce_scatter_rows_forward(Backend& backend, Communicator& tp, const T* full, T* local, int64_t rows,
                                 int64_t width) {
  gather_rows_backward(backend, tp, full, local, rows, width);  // the same collective: its conjugate's backward
}

template <typename T>
void reduce_scatter_rows_backward(Backend& backend, Communicator& tp, const T* dlocal, T* dfull, int64_t rows,
                                  int64_t width) {
  gather_rows_forward(backend, tp, dlocal, dfull, rows, width);
}

template <typename T>
void split_columns_forward(Backend& backend, Communicator& tp, const T* full, T* local, int64_t rows, int64_t cols) {
  copy_block_out(backend, full, local, rows, cols, tp.size(), tp.rank());
}

template <typename T>
void split_columns_backward(Backend& backend, Communicator& tp, const T* dlocal, T* dfull, int64_t rows, int64_t cols) {
  allgather_columns(backend, tp, dlocal, dfull, rows, cols);
}

template <typename T>
void gather_columns_forward(Backend& backend, Communicator& tp, const T* local, T* full, int64_t rows, int64_t cols) {
  allgather_columns(backend, tp, local, full, rows, cols);
}

template <typename T>
void gather_columns_backward(Backend& backend, Communicator& tp, const T* dfull, T* dlocal, int64_t rows,
                             int64_t cols) {
  copy_block_out(backend, dfull, dlocal, rows, cols, tp.size(), tp.rank());
}

template void copy_to_region_backward<float>(Communicator&, float*, int64_t);
template void reduce_from_region_forward<float>(Communicator&, float*, int64_t);
template void gather_rows_forward<float>(Backend&, Communicator&, const float*, float*, int64_t, int64_t);
template void gather_rows_backward<float>(Backend&, Communicator&, const float*, float*, int64_t, int64_t);
template void reduce_scatter_rows_forward<float>(Backend&, Communicator&, const float*, float*, int64_t, int64_t);
template void reduce_scatter_rows_backward<float>(Backend&, Communicator&, const float*, float*, int64_t, int64_t);
template void split_columns_forward<float>(Backend&, Communicator&, const float*, float*, int64_t, int64_t);
template void split_columns_backward<float>(Backend&, Communicator&, const float*, float*, int64_t, int64_t);
template void gather_columns_forward<float>(Backend&, Communicator&, const float*, float*, int64_t, int64_t);
template void gather_columns_backward<float>(Backend&, Communicator&, const float*, float*, int64_t, int64_t);
template void copy_to_region_backward<double>(Communicator&, double*, int64_t);
template void reduce_from_region_forward<double>(Communicator&, double*, int64_t);
template void gather_rows_forward<double>(Backend&, Communicator&, const double*, double*, int64_t, int64_t);
template void gather_rows_backward<double>(Backend&, Communicator&, const double*, double*, int64_t, int64_t);
template void reduce_scatter_rows_forward<double>(Backend&, Communicator&, const double*, double*, int64_t, int64_t);
template void reduce_scatter_rows_backward<double>(Backend&, Communicator&, const double*, double*, int64_t, int64_t);
template void split_columns_forward<double>(Backend&, Communicator&, const double*, double*, int64_t, int64_t);
template void split_columns_backward<double>(Backend&, Communicator&, const double*, double*, int64_t, int64_t);
template void gather_columns_forward<double>(Backend&, Communicator&, const double*, double*, int64_t, int64_t);
template void gather_columns_backward<double>(Backend&, Communicator&, const double*, double*, int64_t, int64_t);

}  // namespace moe::tp
