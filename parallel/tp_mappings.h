// The conjugate mappings of tensor and sequence parallelism over the tensor-parallel group, as
// Megatron-Core's tensor_parallel/mappings.py names them. Each is a pair (forward, backward) and the
// backward of each is the forward of its conjugate, so a parallel layer's backward reads like its forward:
//
//   copy_to_region       forward: identity (the input is replicated)   backward: all-reduce of the gradient
//   reduce_from_region   forward: all-reduce of partial sums           backward: identity
//   gather_rows          forward: all-gather of row blocks             backward: reduce-scatter of the gradient
//   reduce_scatter_rows  forward: reduce-scatter of partial sums       backward: all-gather of the gradient
//   split_columns        forward: this rank's block of columns         backward: all-gather of column blocks
//   gather_columns       forward: all-gather of column blocks          backward: this rank's block of columns
//
// Sequence parallelism splits the token rows of a micro-batch, (N, D) with N = B * T, into tp contiguous
// blocks of N / tp rows, rank r holding block r; token-wise work (norms, residuals) runs on the block, and
// gather_rows / reduce_scatter_rows move between the block and the full rows around the tensor-parallel
// linears. Column blocks: a (N, C) tensor split into tp blocks of C / tp columns, rank r holding block r.
// Buffers are float or double in the communicator's memory, which is `backend`'s (host memory for the CPU backend):
// every move that is not a collective is the backend's copy (device to device on a GPU), never the host's, and a
// gather of column blocks stages them in the backend's memory. A forward's output and a backward's input gradient
// may not alias unless said.
//
// What a gradient means on each rank follows from how the tensor is used: a *replicated* tensor (every rank
// holds the same values, every rank then computes the same with it) has the same, whole gradient on every
// rank; a tensor consumed by rank-local parallel compute (a column-parallel linear) gets a *partial*
// gradient on each rank, whose sum is the whole. The backwards above turn partial gradients into whole ones
// (all-reduce, reduce-scatter) and whole ones into blocks (this rank's block), as Megatron-Core does; the
// tests check each pair's adjoint property with these pairings.
#pragma once

#include <cstdint>

#include "core/backend/backend.h"
#include "parallel/communicator.h"

namespace moe::tp {

// x: (n) replicated; forward leaves it as it is. Backward: dx (n) = the sum of every rank's dx, in place.
template <typename T>
void copy_to_region_backward(Communicator& tp, T* dx, int64_t n);
// y: (n) partial sums on every rank; forward: y = their sum, in place. Backward is the identity.
template <typename T>
void reduce_from_region_forward(Communicator& tp, T* y, int64_t n);

// local: (rows, width) this rank's block; full: (tp * rows, width), the blocks in rank order.
template <typename T>
void gather_rows_forward(Backend& backend, Communicator& tp, const T* local, T* full, int64_t rows, int64_t width);
// dfull: (tp * rows, width) on every rank; dlocal: (rows, width) = sum over ranks of their dfull's block r.
template <typename T>
void gather_rows_backward(Backend& backend, Communicator& tp, const T* dfull, T* dlocal, int64_t rows, int64_t width);
// full: (tp * rows, width) partial sums; local: (rows, width) = block r of their sum.
template <typename T>
void reduce_scatter_rows_forward(Backend& backend, Communicator& tp, const T* full, T* local, int64_t rows,
                                 int64_t width);
// dlocal: (rows, width); dfull: (tp * rows, width) = every rank's dlocal in rank order.
template <typename T>
void reduce_scatter_rows_backward(Backend& backend, Communicator& tp, const T* dlocal, T* dfull, int64_t rows,
                                  int64_t width);

// full: (rows, tp * cols); local: (rows, cols) = this rank's column block.
template <typename T>
void split_columns_forward(Backend& backend, Communicator& tp, const T* full, T* local, int64_t rows, int64_t cols);
// dlocal: (rows, cols); dfull: (rows, tp * cols) with every rank's block in its columns.
template <typename T>
void split_columns_backward(Backend& backend, Communicator& tp, const T* dlocal, T* dfull, int64_t rows, int64_t cols);
// local: (rows, cols); full: (rows, tp * cols) with every rank's block in its columns.
template <typename T>
void gather_columns_forward(Backend& backend, Communicator& tp, const T* local, T* full, int64_t rows, int64_t cols);
// dfull: (rows, tp * cols); dlocal: (rows, cols) = this rank's column block of dfull.
template <typename T>
void gather_columns_backward(Backend& backend, Communicator& tp, const T* dfull, T* dlocal, int64_t rows, int64_t cols);

}  // namespace moe::tp
