// The CUDA backend: device memory from a caching allocator, every copy and op ordered on one stream (the ops,
// cuda_ops.cuh), and the functions of cuda_backend.h.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <vector>

#include "core/backend/backend.h"
#include "core/backend/cuda/caching_allocator.h"
#ifdef MOE_HAVE_CUDNN
#include "core/backend/cuda/cudnn_attention.h"
#endif
#include "core/backend/cuda/cuda_check.h"
#include "core/backend/cuda/cuda_ops.cuh"
#include "core/backend/cuda/watchers.h"
#include "core/backend/cuda_backend.h"
#include "core/error.h"
#include "core/sizes.h"

namespace moe {
namespace {

using cuda::CudaContext;
using cuda::CudaOps;
using cuda::Watchers;

// The backend's stream. Times (record_time) are CUDA events, read at the next synchronize(): each one's time
// after a base event whose host time is known (recorded on the idle stream at the first time asked for).
class CudaStream final : public Stream {
 public:
  CudaStream(cudaStream_t s, Watchers& watchers) : stream_(s), watchers_(watchers) {}
  ~CudaStream() override {
    for (const Mark& m : pending_) cudaEventDestroy(m.event);
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
    if (base_) cudaEventDestroy(base_);
  }
  void synchronize() override {
    watchers_.wait(stream_);
    resolve();
  }
  void record_time(double* seconds) override {
    if (!base_) {  // once: the stream idle, its next event is now
      MOE_CUDA_CHECK(cudaEventCreate(&base_));
      watchers_.wait(stream_);
      base_seconds_ = steady_seconds();
      MOE_CUDA_CHECK(cudaEventRecord(base_, stream_));
    }
    cudaEvent_t event = nullptr;
    if (free_.empty()) {
      MOE_CUDA_CHECK(cudaEventCreate(&event));
    } else {
      event = free_.back(), free_.pop_back();
    }
    MOE_CUDA_CHECK(cudaEventRecord(event, stream_));
    pending_.push_back({event, seconds});
  }

 private:
  struct Mark {
    cudaEvent_t event;
    double* seconds;
  };
  // After a wait: every pending event has happened. Then the base moves to now (the stream is idle), so that
  // event times stay short intervals, which a float of milliseconds holds to a microsecond.
  void resolve() {
    if (pending_.empty()) return;
    for (const Mark& m : pending_) {
      float ms = 0;
      MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, base_, m.event));
      *m.seconds = base_seconds_ + double(ms) / 1000;
      free_.push_back(m.event);
    }
    pending_.clear();
    base_seconds_ = steady_seconds();
    MOE_CUDA_CHECK(cudaEventRecord(base_, stream_));
  }
  cudaStream_t stream_;
  Watchers& watchers_;
  cudaEvent_t base_ = nullptr;
  double base_seconds_ = 0;
  std::vector<Mark> pending_;
  std::vector<cudaEvent_t> free_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaOptions& options);
  ~CudaBackend() override;
  const char* name() const override { return "cuda"; }
  bool memory_is_host() const override { return false; }
  int threads() const override { return threads_; }
  void set_threads(int threads) override { threads_ = threads > 0 ? threads : 1; }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    copy_on_stream(dst, src, bytes, cudaMemcpyHostToDevice);
  }
  void copy_bytes_to_host(void* dst, const void* src, size_t bytes) override {
    watchers_.wait_if_watched(ctx_.stream);  // the queued work first, interruptibly: the pageable copy blocks
    copy_on_stream(dst, src, bytes, cudaMemcpyDeviceToHost);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    copy_on_stream(dst, src, bytes, cudaMemcpyDeviceToDevice);
  }
  Stream& stream() override { return *stream_object_; }
  cudaStream_t native_stream() const { return ctx_.stream; }
  CachingAllocator& allocator() { return *allocator_; }
  Watchers& watchers() { return watchers_; }
  int64_t allocated_bytes() const override { return allocator_->stats().in_use; }
  int64_t peak_bytes() const override { return allocator_->stats().peak_in_use; }

 protected:
  void* allocate_bytes(size_t bytes) override {
    void* p = allocator_->allocate(bytes);
    MOE_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx_.stream));
    return p;
  }
  void free_bytes(void* p, size_t) noexcept override { allocator_->free(p); }
  Ops<float>& ops_f32() override { return *f32_; }
  Ops<double>& ops_f64() override { return *f64_; }

 private:
  void copy_on_stream(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (bytes > 0 && dst != src) MOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, ctx_.stream));
  }
  int device_ = 0, threads_ = 1;
  Watchers watchers_;
  CudaContext ctx_;
  std::unique_ptr<CachingAllocator> allocator_;
  void* blas_workspace_ =
      nullptr;  // cuBLAS's, from the allocator so that it is counted (sizes::cublas_workspace_bytes)
#ifdef MOE_HAVE_CUDNN
  std::unique_ptr<cuda::CudnnAttention> attention_;
#endif
  std::unique_ptr<CudaStream> stream_object_;
  std::unique_ptr<CudaOps<float>> f32_;
  std::unique_ptr<CudaOps<double>> f64_;
};

CudaBackend::CudaBackend(int device, const CudaOptions& options) : device_(device) {
  MOE_CUDA_CHECK(cudaSetDevice(device));
  ctx_.fused_attention = options.fused_attention;
  MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking));
  MOE_CUBLAS_CHECK(cublasCreate(&ctx_.blas));
  MOE_CUBLAS_CHECK(cublasSetStream(ctx_.blas, ctx_.stream));
  // fp32 GEMMs in fp32 (no TF32): the conformance bounds are fp32's.
  MOE_CUBLAS_CHECK(cublasSetMathMode(ctx_.blas, CUBLAS_DEFAULT_MATH));
  allocator_ = std::make_unique<CachingAllocator>(CachingAllocator::Source{[](size_t bytes) -> void* {
                                                                             void* p = nullptr;
                                                                             return cudaMalloc(&p, bytes) == cudaSuccess
                                                                                        ? p
                                                                                        : (cudaGetLastError(), nullptr);
                                                                           },
                                                                           [](void* p, size_t) { cudaFree(p); }});
  ctx_.allocator = allocator_.get();
  ctx_.watchers = &watchers_;
  // cuBLAS's workspace from the allocator rather than its own pool, so that allocated_bytes and the memory
  // estimate count it.
  const size_t blas_workspace = size_t(sizes::cublas_workspace_bytes());
  blas_workspace_ = allocator_->allocate(blas_workspace);
  MOE_CUBLAS_CHECK(cublasSetWorkspace(ctx_.blas, blas_workspace_, blas_workspace));
#ifdef MOE_HAVE_CUDNN
  attention_ = std::make_unique<cuda::CudnnAttention>(ctx_.stream, *allocator_,
                                                      options.fused_attention != FusedAttention::Nondeterministic);
  ctx_.attention = attention_.get();
#endif
  stream_object_ = std::make_unique<CudaStream>(ctx_.stream, watchers_);
  f32_ = std::make_unique<CudaOps<float>>(ctx_);
  f64_ = std::make_unique<CudaOps<double>>(ctx_);
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(ctx_.stream);
  f32_.reset(), f64_.reset();                 // their rounded parameters go back to the allocator
  cublasSetWorkspace(ctx_.blas, nullptr, 0);  // cuBLAS's own again, before its workspace is freed
  allocator_->free(blas_workspace_);
#ifdef MOE_HAVE_CUDNN
  attention_.reset();  // its plans and cuDNN handle, before the stream
#endif
  allocator_.reset();  // cached blocks back to the driver
  cublasDestroy(ctx_.blas);
  cudaStreamDestroy(ctx_.stream);
}

}  // namespace

bool cuda_backend_built() { return true; }

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error to keep
    return 0;
  }
  return count;
}

int64_t cuda_device_memory_bytes(int device) {
  if (device < 0 || device >= cuda_device_count()) return 0;
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return int64_t(prop.totalGlobalMem);
}

std::unique_ptr<Backend> make_cuda_backend(int device, const CudaOptions& options) {
  const int count = cuda_device_count();
  if (count == 0) MOE_BAD_INPUT("train.device = \"cuda\", but this machine has no CUDA device (or no driver for one)");
  if (device < 0 || device >= count)
    MOE_BAD_INPUT("CUDA device " << device << " does not exist: this process sees " << count);
  return std::make_unique<CudaBackend>(device, options);
}

namespace {

CudaBackend& cuda_backend_of(Backend& backend, const char* what) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (!cuda) MOE_BAD_INPUT("the " << backend.name() << " backend has no CUDA " << what);
  return *cuda;
}

}  // namespace

void* cuda_stream_of(Backend& backend) {
  return static_cast<void*>(cuda_backend_of(backend, "stream").native_stream());
}

uint64_t cuda_begin_side_work(Backend& backend) {
  return cuda_backend_of(backend, "memory").allocator().begin_side_work();
}

void cuda_end_side_work(Backend& backend, uint64_t ticket) {
  cuda_backend_of(backend, "memory").allocator().end_side_work(ticket);
}

uint64_t cuda_watch(Backend& backend, std::function<void()> check) {
  return cuda_backend_of(backend, "stream").watchers().add(std::move(check));
}

void cuda_unwatch(Backend& backend, uint64_t id) { cuda_backend_of(backend, "stream").watchers().remove(id); }

}  // namespace moe
