// The element types of buffers that cross a seam (backend, communicator, checkpoint) as a run-time value.
// bf16 is stored as the upper 16 bits of an IEEE float; arithmetic on it accumulates in fp32.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moe {

enum class DType : int8_t { F32, BF16, F64, I32, I64 };

size_t dtype_size(DType dtype);       // bytes per element
const char* dtype_name(DType dtype);  // "f32", "bf16", "f64", "i32", "i64"

}  // namespace moe
