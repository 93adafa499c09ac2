// The status checks of every CUDA library call, for the backend and the NCCL communicators alike: a failed call
// is a RunFailed error (the device, a library or a peer ended the run: exit code 1) naming the call and giving the
// library's own words. The macros name the libraries' error-string functions only where they are used, so this
// header includes none of them.
#pragma once

#include "core/error.h"

#define MOE_CUDA_CHECK(call)                                                                          \
  do {                                                                                                \
    const cudaError_t moe_status_ = (call);                                                           \
    if (moe_status_ != cudaSuccess) MOE_RUN_FAILED(#call << ": " << cudaGetErrorString(moe_status_)); \
  } while (0)
#define MOE_CUBLAS_CHECK(call)                                                                                     \
  do {                                                                                                             \
    const cublasStatus_t moe_status_ = (call);                                                                     \
    if (moe_status_ != CUBLAS_STATUS_SUCCESS) MOE_RUN_FAILED(#call << ": " << cublasGetStatusString(moe_status_)); \
  } while (0)
// After a kernel launch: a bad configuration shows here, an error while running at the next synchronisation.
#define MOE_CUDA_LAUNCHED() MOE_CUDA_CHECK(cudaGetLastError())
// `what`: the operation, for the message ("all-reduce over group ep 0").
#define MOE_NCCL_CHECK(call, what)                                                                         \
  do {                                                                                                     \
    const ncclResult_t moe_status_ = (call);                                                               \
    if (moe_status_ != ncclSuccess)                                                                        \
      MOE_RUN_FAILED("NCCL " << what << " failed: " << ncclGetErrorString(moe_status_) << " [" #call "]"); \
  } while (0)
