// Per-device state of the CUDA backend: the stream every op is enqueued on, library handles, the
// stream-ordered caching allocator, and scratch buffers that only grow outside graph capture.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "../core/backend.h"
#include "handles.h"

namespace rc::cuda {

// Device memory from the device's stream-ordered memory pool (cudaMallocAsync on the backend's
// stream), with the pool told to keep freed memory: blocks are reused without returning to the
// driver, allocation is capturable in CUDA graphs, and frees are ordered after the work using them.
class StreamAllocator final : public Allocator {
 public:
  StreamAllocator(int device, cudaStream_t stream);
  void* allocate(size_t bytes) override;
  void release(void* ptr) override;
  MemoryStats stats() const override;
  void resetPeak() override;
  void emptyCache() override;

  // Graph capture on the stream: a captured free may only release memory the graph itself
  // allocated, and memory freed while a graph may still use it must not be handed out again. So
  // between beginCapture and endCapture, frees of older memory are held (not freed), and they stay
  // held while any graph exists: releaseHeld() frees them once the last graph is destroyed. The
  // same holds after the capture for the memory that existed when it ended (a graph may point at
  // any of it): a layer that drops a buffer between replays (a batch of another size) must not
  // hand the graph's buffer to someone else. endCapture(true) marks that memory.
  void beginCapture();
  void endCapture(bool graphCreated);
  void releaseHeld();

 private:
  int device_;
  cudaStream_t stream_;
  cudaMemPool_t pool_ = nullptr;
  mutable std::mutex mutex_;
  std::unordered_map<void*, size_t> live_;
  MemoryStats stats_;
  bool capturing_ = false;
  std::unordered_set<void*> allocatedInCapture_;
  std::unordered_set<void*> graphVisible_;  // alive when a graph was made: held when freed
  std::vector<void*> held_;
};

// Makes `device` current for the lifetime of the guard.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

class CudaContext {
 public:
  explicit CudaContext(int device);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device() const { return device_; }
  Device rcDevice() const { return Device{DeviceType::Cuda, device_}; }
  cudaStream_t stream() const { return stream_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  cublasHandle_t cublas() const { return cublas_; }
  StreamAllocator& allocator() { return *allocator_; }
  // TF32 tensor cores for f32 convolutions and matrix products (RESNET_CUDA_ALLOW_TF32=1).
  bool allowTf32() const { return allowTf32_; }
  // Only algorithms that give the same bits on every run (RESNET_CUDA_DETERMINISTIC=1), like
  // PyTorch's torch.backends.cudnn.deterministic: cuDNN's search skips those that accumulate with
  // atomics. Our own kernels and cuBLAS on one stream are deterministic either way; the graph-API
  // engines of the opt-in conv-bn fused path (graph_api.cc) are not filtered.
  bool deterministic() const { return deterministic_; }
  bool capturing() const;

  Tensor allocate(const Shape& shape, DType dtype);
  // A device buffer of at least `bytes`, valid until the next call with a larger size. It grows only
  // outside graph capture (a captured graph keeps the address it saw).
  void* scratch(size_t bytes);
  // The device flag crossEntropy raises for labels out of range; checked (and cleared) whenever
  // the host waits for the device.
  int32_t* invalidLabelFlag() const { return invalidLabel_.ptr<int32_t>(); }
  void checkDeferredErrors();
  // Graph bookkeeping: while any graph exists, buffers a graph may point at (scratch, uploaded
  // tables, freed tensors) are kept instead of freed, until the last graph is destroyed.
  void beginCapture();
  void endCapture(bool graphCreated);
  void graphDestroyed();
  int graphCount() const { return graphs_; }
  // Device copy of a small host table (SGD segments and groups, normalisation constants), sent again
  // only when its bytes differ from the last ones sent under `key`. The copy is asynchronous, from
  // one of a few pinned buffers taken in turn, each reused only after its previous copy has run, so
  // a table that changes every step (a learning-rate schedule) does not hold the host back.
  const void* upload(const std::string& key, const void* host, size_t bytes);

 private:
  int device_;
  // Declared in the order of creation: destroyed in reverse, also when the constructor throws.
  StreamHandle stream_;
  std::unique_ptr<StreamAllocator> allocator_;
  CudnnHandle cudnn_;
  CublasHandle cublas_;
  bool allowTf32_ = false;
  bool deterministic_ = false;
  Tensor scratch_;
  Tensor cublasWorkspace_;
  int graphs_ = 0;
  std::vector<Tensor> retired_;  // replaced buffers a graph may still use
  // Drops `t`, or keeps it in retired_ while a graph exists.
  void retire(Tensor& t);
  Tensor invalidLabel_;
  struct Staging {
    void* pinned = nullptr;
    size_t capacity = 0;
    cudaEvent_t copied = nullptr;
  };
  static constexpr int kStagingBuffers = 4;
  struct Uploaded {
    std::string bytes;
    Tensor device;
    Staging staging[kStagingBuffers];
    int next = 0;
  };
  std::map<std::string, Uploaded> uploads_;
};

// cuDNN's name for an element type.
cudnnDataType_t toCudnn(DType t);
// cuBLAS's name for an element type.
cudaDataType_t toCudaDataType(DType t);

}  // namespace rc::cuda
