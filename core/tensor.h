// A small non-owning tensor: a pointer into one of the flat buffers plus its shape (row-major). Layers
// take raw pointers with the shape beside each argument (docs/design.md "Conventions"); code that handles tensors by
// name — the parameter table, checkpoints, tests — uses this view.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace moe {

template <typename T>
struct TensorView {
  T* data = nullptr;
  std::vector<int64_t> shape;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t rank() const { return int64_t(shape.size()); }
  // Row-major offset of a full index.
  int64_t offset(const std::vector<int64_t>& index) const {
    MOE_CHECK(index.size() == shape.size(),
              "index of rank " << index.size() << " into a tensor of rank " << shape.size());
    int64_t o = 0;
    for (size_t i = 0; i < shape.size(); ++i) {
      MOE_CHECK(index[i] >= 0 && index[i] < shape[i], "index " << index[i] << " outside [0, " << shape[i] << ")");
      o = o * shape[i] + index[i];
    }
    return o;
  }
  T& at(const std::vector<int64_t>& index) const { return data[offset(index)]; }
  // Slice i of the first axis (for example expert i of a stacked expert tensor).
  TensorView<T> slice0(int64_t i) const {
    MOE_CHECK(!shape.empty() && i >= 0 && i < shape[0],
              "slice " << i << " of a tensor with leading size " << (shape.empty() ? 0 : shape[0]));
    return {data + i * (numel() / shape[0]), std::vector<int64_t>(shape.begin() + 1, shape.end())};
  }
};

}  // namespace moe
