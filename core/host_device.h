// Functions marked MOE_HOST_DEVICE also compile as CUDA device code, so the CUDA backend's kernels compute
// exactly what the CPU does with them (the Philox streams of core/philox.h, the bf16 rounding of core/dtype.h).
#pragma once

#if defined(__CUDACC__)
#define MOE_HOST_DEVICE __host__ __device__
#else
#define MOE_HOST_DEVICE
#endif
